"""Prometheus metrics of the workers.

Celery's prefork children each count on their own: with ``PROMETHEUS_MULTIPROC_DIR`` set (``engram
worker --metrics-port`` sets it, to ENGRAM_METRICS_DIR or a temporary directory) prometheus_client aggregates them and ``engram worker --metrics-port`` serves the sum.
Queue depths and lags (the autoscaling signals), kombu's unacked count, the in-flight index's size and the LLM
breaker's state are read from Redis at scrape time (``QueueDepth``: one pipelined round trip, no SCAN).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    import redis

    from engram_api.settings import Settings

__all__ = [
    "DEAD_LETTERS",
    "INDEX_LOADS",
    "LEASE_BUSY",
    "LLM_COST",
    "LLM_RATE_REFUSED",
    "LLM_RATE_WAIT",
    "LLM_TOKENS",
    "MESSAGES",
    "STAGE_SECONDS",
    "QueueDepth",
    "serve",
]

MESSAGES = Counter("engram_messages_total", "Messages finished per stage and outcome", ["stage", "outcome"])
STAGE_SECONDS = Histogram(
    "engram_stage_seconds",
    "Time per message per stage (apply excludes lock waits)",
    ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LLM_TOKENS = Counter("engram_llm_tokens_total", "LLM tokens spent", ["kind"])
LLM_COST = Counter("engram_llm_cost_usd_total", "Estimated LLM cost in USD")
DEAD_LETTERS = Counter("engram_dead_letters_total", "Messages dead-lettered", ["stage"])
INDEX_LOADS = Counter(
    "engram_index_loads_total",
    "This process's FAISS copies of users brought up to the graph: rebuild (the user's vectors read whole) "
    "or catchup (only what changed since the copy's version)",
    ["how"],
)

LEASE_BUSY = Counter(
    "engram_apply_lease_busy_total", "Apply tasks retried because another worker held the user's write lease"
)
LLM_RATE_WAIT = Counter(
    "engram_llm_rate_wait_seconds_total", "Seconds LLM callers slept for a slot of the fleet-wide rate limit"
)
LLM_RATE_REFUSED = Counter(
    "engram_llm_rate_refused_total", "LLM calls put off for later: no rate-limit slot within their wait"
)
# The breaker's state as one number: alert on > 0, graph it as a step.
_BREAKER_STATE = {"closed": 0.0, "half-open": 0.5, "open": 1.0}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # the collector's client does not decode


class QueueDepth(Collector):
    """``engram_queue_depth{queue}`` and ``engram_queue_lag_seconds{queue}``, read from the broker at each
    scrape: no process has to keep a gauge current, and only the serving process talks to Redis for it.

    Lag is the age of the oldest waiting message: kombu LPUSHes and consumes from the tail, so the tail
    (``LINDEX -1``) is next out, and its ``keys.SENT_AT_HEADER`` is its publish time. 0 for an empty queue;
    no sample when the oldest message carries no stamp (published by an older Engram), rather than a guess.
    Messages a worker already took (unacked, or waiting for a retry's ETA) are not waiting in the queue:
    ``engram_unacked_messages`` counts them (kombu's ``unacked`` hash, fleet-wide, every queue), and
    ``engram_in_flight_messages{stage}`` every message enqueued or extracted and not yet applied (the
    ledger's in-flight index: queued, taken, or waiting for a retry), by the stage it waits for: ``extract``
    (queued) or ``apply`` (extracted; ``keys.in_flight_extracted``). ``engram_llm_breaker_state`` is the breaker's
    state as ``LLMBreaker.state`` reads it (0 closed, 0.5 half-open, 1 open) and
    ``engram_llm_breaker_calls_total{decision}`` its fleet-wide decision counts (``BreakerStats``).
    """

    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client  # reads lengths and raw task messages: no decoding
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import redis

        from engram_api import keys
        from engram_api.ledger import wire
        from engram_workers.control.breaker import BreakerStats

        names = keys.QUEUES
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(keys.queue_key(name))
            pipe.lindex(keys.queue_key(name), -1)
        pipe.hlen(keys.kombu_unacked())
        pipe.zcard(keys.in_flight())
        pipe.zcard(keys.in_flight_extracted())
        pipe.exists(keys.breaker("open"))
        pipe.exists(keys.breaker("tripped"))
        pipe.hgetall(keys.breaker("stats"))
        try:
            *replies, unacked, in_flight, extracted, is_open, tripped, stats = pipe.execute()
        except redis.RedisError:
            return  # Redis down: the other metrics still serve; the missing series is the signal
        now = self._clock()
        depth = GaugeMetricFamily("engram_queue_depth", "Messages waiting per queue", labels=["queue"])
        lag = GaugeMetricFamily(
            "engram_queue_lag_seconds", "Age of the oldest message waiting per queue (0: empty)", labels=["queue"]
        )
        for name, length, oldest in zip(names, replies[0::2], replies[1::2], strict=True):
            depth.add_metric([name], length)
            sent_at = wire.sent_at(oldest) if oldest is not None else now
            if sent_at is not None:
                lag.add_metric([name], max(0.0, now - sent_at))
        yield depth
        yield lag
        yield GaugeMetricFamily(
            "engram_unacked_messages", "Messages workers took from any queue and have not acked", value=unacked
        )
        waiting = GaugeMetricFamily(
            "engram_in_flight_messages",
            "Messages enqueued or extracted and not yet applied, by the stage they wait for",
            labels=["stage"],
        )
        # Read in one pipeline, not one transaction: a message between the reads shows in one stage or none.
        waiting.add_metric(["extract"], max(0, in_flight - extracted))
        waiting.add_metric(["apply"], extracted)
        yield waiting
        state = "open" if is_open else "half-open" if tripped else "closed"
        yield GaugeMetricFamily(
            "engram_llm_breaker_state",
            "LLM circuit breaker: 0 closed, 0.5 half-open, 1 open",
            value=_BREAKER_STATE[state],
        )
        calls = CounterMetricFamily(
            "engram_llm_breaker_calls", "The LLM breaker's fleet-wide decisions and openings", labels=["decision"]
        )
        counts = BreakerStats.model_validate({_text(k): int(v) for k, v in stats.items()})
        for decision, count in counts.model_dump().items():
            calls.add_metric([decision], count)
        yield calls


def serve(port: int, redis_url: str, settings: Settings, *, multiprocess: bool) -> None:
    """Expose /metrics on ``port`` with queue depths and lags; ``multiprocess`` sums the pool children's files."""
    registry = REGISTRY
    if multiprocess:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    from engram_api.connections import redis_client

    registry.register(QueueDepth(redis_client(redis_url, settings, timeout_s=5, decode_responses=False)))
    start_http_server(port, registry=registry)
