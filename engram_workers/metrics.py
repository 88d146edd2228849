"""Prometheus metrics of the workers.

Celery's prefork children each count on their own: with ``PROMETHEUS_MULTIPROC_DIR`` set (``engram
worker`` sets it) prometheus_client aggregates them and ``engram worker --metrics-port`` serves the sum.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = [
    "DEAD_LETTERS",
    "LLM_COST",
    "LLM_TOKENS",
    "MESSAGES",
    "QUEUE_DEPTH",
    "STAGE_SECONDS",
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
QUEUE_DEPTH = Gauge("engram_queue_depth", "Messages waiting per queue", ["queue"], multiprocess_mode="max")


def serve(port: int) -> None:
    """Expose /metrics on ``port`` (aggregating pool children in multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_http_server(port, registry=registry)
    else:
        start_http_server(port)
