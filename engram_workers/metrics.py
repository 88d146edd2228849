"""Prometheus metrics of the workers.

Celery's prefork children each count on their own: with ``PROMETHEUS_MULTIPROC_DIR`` set (``engram
worker --metrics-port`` sets it, to ENGRAM_METRICS_DIR or a temporary directory) prometheus_client aggregates them and ``engram worker --metrics-port`` serves the sum.
Queue depths and lags (the autoscaling signals) are read from the broker at scrape time (``QueueDepth``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    import redis

    from engram_api.settings import Settings

__all__ = [
    "DEAD_LETTERS",
    "INDEX_LOADS",
    "LLM_COST",
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


class QueueDepth(Collector):
    """``engram_queue_depth{queue}`` and ``engram_queue_lag_seconds{queue}``, read from the broker at each
    scrape: no process has to keep a gauge current, and only the serving process talks to Redis for it.

    Lag is the age of the oldest waiting message: kombu LPUSHes and consumes from the tail, so the tail
    (``LINDEX -1``) is next out, and its ``keys.SENT_AT_HEADER`` is its publish time. 0 for an empty queue;
    no sample when the oldest message carries no stamp (published by an older Engram), rather than a guess.
    Messages a worker already took (unacked, or waiting for a retry's ETA) are not waiting in the queue.
    """

    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time) -> None:
        self._redis = client  # reads lengths and raw task messages: no decoding
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import redis

        from engram_api import keys
        from engram_api.ledger import wire

        names = keys.QUEUES
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(name)
            pipe.lindex(name, -1)
        try:
            replies = pipe.execute()
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
