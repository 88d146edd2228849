"""Prometheus metrics of the workers.

Celery's prefork children each count on their own: with ``PROMETHEUS_MULTIPROC_DIR`` set (``engram
worker --metrics-port`` sets it, to ENGRAM_METRICS_DIR or a temporary directory) prometheus_client aggregates them and ``engram worker --metrics-port`` serves the sum.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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
    """``engram_queue_depth{queue}``, read from the broker at each scrape: no process has to keep a gauge
    current, and only the serving process talks to Redis for it."""

    def __init__(self, redis_url: str) -> None:
        from engram_api.connections import redis_client

        self._redis = redis_client(redis_url, timeout_s=5, decode_responses=False)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import redis

        from engram_api import keys

        names = keys.QUEUES
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(name)
        try:
            depths = pipe.execute()
        except redis.RedisError:
            return  # Redis down: the other metrics still serve; the missing series is the signal
        family = GaugeMetricFamily("engram_queue_depth", "Messages waiting per queue", labels=["queue"])
        for name, depth in zip(names, depths, strict=True):
            family.add_metric([name], depth)
        yield family


def serve(port: int, redis_url: str, *, multiprocess: bool) -> None:
    """Expose /metrics on ``port`` with queue depths; ``multiprocess`` sums the pool children's files."""
    registry = REGISTRY
    if multiprocess:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    registry.register(QueueDepth(redis_url))
    start_http_server(port, registry=registry)
