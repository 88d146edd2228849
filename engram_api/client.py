"""``MemoryClient``: what an application imports. Enqueue on the write side, recall on the read side.

Both halves are built on first use, and imported then: a process that only recalls never imports Celery,
one that only enqueues never loads the embedding model or opens the graph store, and history, graph pages
and stats are one graph-store query each (``graph_reads``: no reader, no numpy, no Redis).
``AsyncMemoryClient`` runs the same methods in a worker thread (no second implementation to drift from
the first).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engram_api import graph_reads, tracing
from engram_api.errors import ConfigError
from engram_api.models import (
    HISTORY_LIMIT,
    DeadLetter,
    FactRecord,
    ForgetResult,
    GraphPage,
    HealthReport,
    ImportResult,
    RecallResult,
    Receipt,
    SearchResult,
    UserStats,
    WaitResult,
    check_user_id,
)
from engram_api.settings import Settings, load_settings

if TYPE_CHECKING:
    import redis
    from prometheus_client import CollectorRegistry

    from engram_api.producer import Producer
    from engram_api.reader import Reader
    from engram_api.reader.metrics import ReaderMetrics
    from engram_api.reader.signals import StampSignals
    from engram_api.storage import GraphStore
    from engram_api.storage.faiss.erasure import IndexSweeper

__all__ = ["AsyncMemoryClient", "MemoryClient"]


class MemoryClient:
    def __init__(
        self,
        *,
        settings: Settings | None = None,
        redis_url: str | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        """``metrics_registry``: the read side records its Prometheus metrics there (``reader.metrics``);
        without one, into prometheus_client's default registry when ``ENGRAM_READER_METRICS`` is on, else
        nowhere."""
        self.settings = settings or load_settings()
        self._metrics_registry = metrics_registry
        tracing.configure(self.settings)  # ENGRAM_TRACING on: this process exports spans (no-op when off)
        self._redis_url = redis_url
        self._url_given = redis_url is not None
        self._redis: redis.Redis | None = None
        self._producer: Producer | None = None
        self._reader: Reader | None = None
        self._graph: GraphStore | None = None
        self.sweeper: IndexSweeper | None = None  # the erasure sweep of this reader's index files
        self.signals: StampSignals | None = None  # writers' stamps: this reader catches up before a recall
        # Held while the graph store or the reader is first opened: ``AsyncMemoryClient`` calls methods from
        # many threads at once, and a second reader made by a race started threads no ``close`` stopped.
        self._opening = threading.RLock()

    # ------------------------------------------------------------------------------ plumbing
    @property
    def redis_url(self) -> str:
        if self._redis_url is None:
            from engram_api.connections import resolve_redis_url

            self._redis_url = resolve_redis_url(self.settings)
        return self._redis_url

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            with self._opening:
                if self._redis is None:
                    from engram_api.connections import redis_client

                    self._redis = redis_client(self.redis_url, self.settings)
        return self._redis

    def follow_embedded_redis(self) -> bool:
        """The embedded default only (no ``REDIS_URL``, no ``redis_url`` given): when ``engram up`` restarted
        its Redis on another port (``services.json`` says so), point this client's connections, which the
        producer and the reader share, there. True when they moved. A long-running process (``engram
        serve``) calls it after a Redis error, so that it is not cut off until restarted."""
        if self.settings.redis_url or self._url_given or self._redis_url is None:
            return False
        from engram_api.connections import resolve_redis_url

        try:
            url = resolve_redis_url(self.settings)
        except ConfigError:  # the fleet is stopped: nothing to follow yet
            return False
        if url == self._redis_url:
            return False
        self._redis_url = url
        if self._redis is not None:
            from redis.connection import parse_url

            # A new pool with the same options and the new server's host, port, password and db; the client
            # object stays (the producer's scripts and the reader hold it), the old connections are closed.
            old = self._redis.connection_pool
            kwargs = {**old.connection_kwargs, **parse_url(url)}
            self._redis.connection_pool = type(old)(connection_class=old.connection_class, **kwargs)
            old.disconnect()
        return True

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            from engram_api.producer import Producer

            self._producer = Producer(settings=self.settings, redis_client=self.redis)
        return self._producer

    @property
    def graph(self) -> GraphStore:
        if self._graph is None:
            with self._opening:
                if self._graph is None:
                    from engram_api.storage import open_graph_store

                    self._graph = open_graph_store(self.settings)
                    self._graph.ensure_schema()
        return self._graph

    def _reader_redis(self) -> redis.Redis | None:
        """Redis for the read side. With the embedded default and the fleet stopped there is none, and none
        is needed: SQLite and the FAISS files are local and no worker is writing."""
        if self.settings.redis_url or self._redis_url:
            return self.redis
        try:
            self.redis_url  # noqa: B018 - resolving it is the check: no services.json, no Redis (nor its import)
        except ConfigError:
            return None
        import redis

        try:
            self.redis.ping()
        except redis.RedisError:
            self._redis_url = None
            self._redis = None
            return None
        return self.redis

    @property
    def reader(self) -> Reader:
        reader = self._reader
        if reader is None:
            with self._opening:  # one reader (and one of each of its threads) however many threads ask at once
                reader = self._reader or self._open_reader()
        return reader

    def _open_reader(self) -> Reader:
        """The reader and the threads it needs (the erasure sweep, the stamp listener): ``close`` stops them.
        Called once, under ``_opening``."""
        from engram_api.reader import Reader
        from engram_api.storage.embedding.embedder import embedder_for
        from engram_api.storage.faiss.files import VectorStore
        from engram_api.storage.faiss.keeper import IndexKeeper

        embedder = embedder_for(self.settings)
        metrics = self._reader_metrics()
        keeper = IndexKeeper(
            graph=self.graph,
            vectors=VectorStore.from_settings(self.settings, embedder.dim),
            cache_size=self.settings.index_cache_users,
            on_load=metrics.index_loaded if metrics is not None else None,
        )
        redis_client = self._reader_redis()
        if redis_client is not None:
            # Erasure on every host: this reader's local files of users forgotten anywhere go (``erasure``).
            from engram_api.storage.faiss.erasure import IndexSweeper

            self.sweeper = IndexSweeper(keeper, redis_client, self.settings.index_sweep_interval_s, embedder).start()
        self._reader = Reader(
            settings=self.settings,
            graph=self.graph,
            keeper=keeper,
            embedder=embedder,
            redis_client=redis_client,
            metrics=metrics,
        )
        if redis_client is not None:
            from engram_api.reader.signals import StampSignals

            self.signals = StampSignals(redis_client, self._reader.signalled_stamp).start()
        return self._reader

    def _reader_metrics(self) -> ReaderMetrics | None:
        registry = self._metrics_registry
        if registry is None and self.settings.reader_metrics:
            from prometheus_client import REGISTRY as registry
        if registry is None:
            return None
        from engram_api.reader.metrics import reader_metrics

        return reader_metrics(registry)

    def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
        if self.signals is not None:
            self.signals.stop()  # before the flush: no catch-up starts after it
        if self._reader is not None:
            self._reader.close()
        if self._graph is not None:
            self._graph.close()
        if self._redis is not None:
            self._redis.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- write side
    def enqueue(
        self,
        user_id: str,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        message_id: str | None = None,
        timestamp: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        owner_name: str | None = None,
        earlier: Sequence[Mapping[str, Any]] | None = None,
        utc_offset_minutes: int | None = None,
    ) -> Receipt:
        """Validate and queue one message; returns at once (no LLM, no graph store).

        ``owner_name`` names the memory owner (a user turn with another ``name`` is another person);
        ``earlier`` are preceding turns the extractor sees as context only; ``utc_offset_minutes`` is the
        sender's offset, so relative dates are read in the sender's day.
        """
        return self.producer.enqueue(
            user_id,
            messages,
            message_id=message_id,
            timestamp=timestamp,
            metadata=metadata,
            owner_name=owner_name,
            earlier=earlier,
            utc_offset_minutes=utc_offset_minutes,
        )

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[Receipt]:
        """Queue many messages: every item is validated before any is published."""
        return self.producer.enqueue_many(items)

    def wait(
        self,
        receipts: Sequence[Receipt | tuple[str, str]] | Receipt,
        timeout: float = 60.0,
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> WaitResult:
        """Block until the messages are applied or dead-lettered; ``on_progress(finished, total)`` after
        each poll (a poll reads only the statuses still pending)."""
        items = [receipts] if isinstance(receipts, Receipt) else receipts
        return self.producer.wait(items, timeout=timeout, on_progress=on_progress)

    def dead_letters(self, user_id: str | None = None) -> list[DeadLetter]:
        return self.producer.ledger.dead_letters.list(user_id)

    def replay(self, user_id: str, message_id: str) -> Receipt:
        return self.producer.replay(user_id, message_id)

    def drop_dead_letter(self, user_id: str, message_id: str) -> bool:
        return self.producer.ledger.dead_letters.remove(user_id, message_id)

    # ------------------------------------------------------------------------------ read side
    def recall(
        self,
        user_id: str,
        query: str,
        k: int = 10,
        *,
        as_of: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> RecallResult:
        return self.reader.recall(user_id, query, k, as_of=as_of, since=since, until=until)

    def search(self, user_id: str, query: str, k: int = 10, detail_level: str = "auto") -> SearchResult:
        return self.reader.search(user_id, query, k, detail_level)  # type: ignore[arg-type]

    def get_context(self, user_id: str, query: str, max_tokens: int = 800) -> str:
        return self.reader.get_context(user_id, query, max_tokens)

    def history(
        self, user_id: str, subject: str, predicate: str | None = None, limit: int = HISTORY_LIMIT
    ) -> list[FactRecord]:
        return graph_reads.history(self.graph, user_id, subject, predicate, limit)

    def get_graph(self, user_id: str, page: int = 1, page_size: int = 50) -> GraphPage:
        return graph_reads.page(self.graph, user_id, page, page_size)

    def stats(self, user_id: str) -> UserStats:
        return graph_reads.stats(self.graph, user_id)

    def feedback(self, user_id: str, recall_id: str, useful_ids: Sequence[str]) -> int:
        return self.reader.feedback(user_id, recall_id, useful_ids)

    def forget(self, user_id: str, memory_id: str) -> ForgetResult:
        return self.reader.forget(user_id, memory_id)

    def forget_user(self, user_id: str) -> ForgetResult:
        return self.reader.forget_user(user_id)

    # ---------------------------------------------------------------------------- backup, restore
    def export_memory(self, user_id: str) -> Iterator[str]:
        """One user's memory as JSON lines (header, episodes, their chunks, entities, facts); see
        ``engram_api.backup``."""
        from engram_api.backup import export_lines

        check_user_id(user_id)
        return export_lines(self.graph, user_id)

    def import_memory(self, lines: Iterable[str]) -> ImportResult:
        """Restore an ``export_memory`` file into its user (who must hold no other messages)."""
        from engram_api.backup import read_export, restore

        snapshot = read_export(lines)
        reader = self.reader
        return restore(snapshot, graph=self.graph, embedder=reader.embedder, writes=reader.writes)

    def health(self) -> HealthReport:
        """Graph store, Redis, embedder, index directory and queue depths."""
        from engram_api.health import check_all

        return check_all(self)


def _in_thread(name: str) -> Callable[..., Any]:
    @functools.wraps(getattr(MemoryClient, name))
    async def method(self: AsyncMemoryClient, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    return method


class AsyncMemoryClient:
    """Async twin of ``MemoryClient``: the same methods, awaited, run in a worker thread."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        redis_url: str | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.sync = MemoryClient(settings=settings, redis_url=redis_url, metrics_registry=metrics_registry)

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.sync.close)

    async def export_memory(self, user_id: str) -> list[str]:
        """The export's lines, read in a worker thread (the sync method returns a lazy iterator)."""
        return await asyncio.to_thread(lambda: list(self.sync.export_memory(user_id)))

    for _name in (
        "enqueue", "enqueue_many", "wait", "dead_letters", "replay", "drop_dead_letter", "recall", "search",
        "get_context", "history", "get_graph", "stats", "feedback", "forget", "forget_user", "import_memory",
        "health", "close", "follow_embedded_redis",
    ):  # fmt: skip
        locals()[_name] = _in_thread(_name)
    del _name
