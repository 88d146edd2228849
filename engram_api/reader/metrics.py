"""Prometheus metrics of the read side, recorded only when the application asks for them.

An application passes its registry (``MemoryClient(metrics_registry=...)``), or sets ``ENGRAM_READER_METRICS``
to record into prometheus_client's default one, and serves it as it serves its own metrics. Recorded:
``engram_reader_recall_seconds{cached}`` (every recall's time, result-cache hits included),
``engram_reader_recall_errors_total{error}`` (recalls that raised, by error class) and
``engram_reader_index_loads_total{how}`` (this process's FAISS copies brought up to the graph: ``rebuild``
or ``catchup``, as ``IndexKeeper`` reports them).

Invariants:
- Importing this module (or ``engram_api``) registers nothing and imports no prometheus_client: metrics
  exist once ``reader_metrics`` is called, which ``MemoryClient`` does only when asked.
- One set of metrics per registry: every client of a process recording into one registry shares it (a
  second registration of the same names would raise).
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ReaderMetrics", "reader_metrics", "timed_recall"]

F = TypeVar("F", bound=Callable[..., Any])

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ReaderMetrics:
    """The read side's metrics in one registry; build them through ``reader_metrics``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.recall_seconds = Histogram(
            "engram_reader_recall_seconds",
            "Time per recall; cached: the result cache answered",
            ["cached"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.recall_errors = Counter(
            "engram_reader_recall_errors_total", "Recalls that raised, by error class", ["error"], registry=registry
        )
        self.index_loads = Counter(
            "engram_reader_index_loads_total",
            "This process's FAISS copies of users brought up to the graph: rebuild (the user's vectors read "
            "whole) or catchup (only what changed since the copy's version)",
            ["how"],
            registry=registry,
        )

    def index_loaded(self, how: str) -> None:
        """``IndexKeeper``'s ``on_load``: told "rebuild" or "catchup" at each."""
        self.index_loads.labels(how=how).inc()


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, ReaderMetrics] = weakref.WeakKeyDictionary()


def reader_metrics(registry: CollectorRegistry) -> ReaderMetrics:
    """The read side's metrics in ``registry``, registered there at the first call."""
    with _lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = ReaderMetrics(registry)
        return found


def timed_recall(fn: F) -> F:
    """``Reader.recall`` timed into ``reader.metrics`` when the reader has any (else called as is)."""

    @functools.wraps(fn)
    def run(reader: Any, *args: Any, **kwargs: Any) -> Any:
        metrics: ReaderMetrics | None = reader.metrics
        if metrics is None:
            return fn(reader, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            result = fn(reader, *args, **kwargs)
        except Exception as exc:
            metrics.recall_errors.labels(error=type(exc).__name__).inc()
            raise
        metrics.recall_seconds.labels(cached=str(result.cached).lower()).observe(time.perf_counter() - t0)
        return result

    return run  # type: ignore[return-value]
