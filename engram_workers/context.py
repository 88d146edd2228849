"""Per-process resources of a worker, created on first use (after the pool forks, never before).

Nothing here connects or loads a model at import: Celery's prefork pool forks after importing the task
modules, and a Neo4j driver, a Redis pool or torch state copied across a fork is a bug waiting to happen.
"""

from __future__ import annotations

import threading
from functools import cached_property

import redis
from redis.commands.core import Script

from engram_api.connections import redis_client, resolve_redis_url
from engram_api.deadletters import DeadLetterStore
from engram_api.settings import Settings, load_settings
from engram_api.storage import GraphStore, open_graph_store
from engram_api.storage.embedding.embedder import Embedder, embedder_for
from engram_api.storage.faiss.erasure import IndexSweeper
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.writer.userwrite import UserWrites
from engram_workers.control import LLMBreaker, LLMRateLimiter
from engram_workers.dispatch import Dispatch, send
from engram_workers.extraction.llm import is_service_failure
from engram_workers.extraction.query_batch import QueryBatcher
from engram_workers.metrics import INDEX_LOADS
from engram_workers.middleware import Hooks, build_hooks

__all__ = ["WorkerContext", "get_context", "reset_context"]


class WorkerContext:
    def __init__(self, *, settings: Settings, dispatch: Dispatch = send) -> None:
        self.settings = settings
        # How stages publish the next task: the worker's Celery app unless a caller injects another.
        self.dispatch = dispatch
        self._warm = False
        self._scripts: dict[str, Script] = {}
        self.sweeper: IndexSweeper | None = None  # started with the keeper

    def warm_up(self) -> None:
        """Load and run the embedding model once and import FAISS: tens of seconds in a cold process on a
        busy host, which the apply stage must not spend holding a user's (renewed) lease."""
        if not self._warm:
            self.embedder.encode(["warm-up"])
            self.keeper.vectors.warm_up()
            self._warm = True

    @cached_property
    def redis_url(self) -> str:
        return resolve_redis_url(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_client(self.redis_url)

    def script(self, source: str) -> Script:
        """The Lua script ``source`` on this context's Redis client, registered once: ``register_script``
        hashes the source on every call (1.7 % of an apply worker's Python CPU in an ingest burst, py-spy)."""
        script = self._scripts.get(source)
        if script is None or script.registered_client is not self.redis:
            script = self._scripts[source] = self.redis.register_script(source)
        return script

    @cached_property
    def graph(self) -> GraphStore:
        store = open_graph_store(self.settings)
        store.ensure_schema()
        return store

    @cached_property
    def embedder(self) -> Embedder:
        return embedder_for(self.settings)

    @cached_property
    def queries(self) -> QueryBatcher:
        """Query vectors of this process's extract threads, encoded in batches when they coincide."""
        return QueryBatcher(self.embedder)

    @cached_property
    def keeper(self) -> IndexKeeper:
        vectors = VectorStore.from_settings(self.settings, self.embedder.dim)
        keeper = IndexKeeper(
            graph=self.graph,
            vectors=vectors,
            cache_size=self.settings.index_cache_users,
            on_load=lambda how: INDEX_LOADS.labels(how=how).inc(),
        )
        # This process's share of erasure on every host: its local files of forgotten users go (``erasure``).
        self.sweeper = IndexSweeper(keeper, self.redis, self.settings.index_sweep_interval_s).start()
        return keeper

    @cached_property
    def writes(self) -> UserWrites:
        return UserWrites(
            graph=self.graph, keeper=self.keeper, redis_client=self.redis, lease_ttl_s=self.settings.apply_lock_ttl_s
        )

    @cached_property
    def dead_letters(self) -> DeadLetterStore:
        return DeadLetterStore(
            redis_client=self.redis, status_ttl_s=self.settings.status_ttl_s, secrets=self.settings.secrets
        )

    @cached_property
    def rate_limiter(self) -> LLMRateLimiter:
        return LLMRateLimiter(redis_url=self.redis_url, per_second=self.settings.llm_rate_per_s)

    @cached_property
    def breaker(self) -> LLMBreaker:
        return LLMBreaker(
            redis_url=self.redis_url,
            fail_max=self.settings.breaker_failures,
            reset_timeout=self.settings.breaker_reset_s,
            is_failure=is_service_failure,
        )

    @cached_property
    def hooks(self) -> Hooks:
        return build_hooks(self.settings)

    def close(self) -> None:
        if "graph" in self.__dict__:
            self.graph.close()


_context: WorkerContext | None = None
_lock = threading.Lock()


def get_context() -> WorkerContext:
    global _context
    with _lock:
        if _context is None:
            _context = WorkerContext(settings=load_settings())
        return _context


def reset_context() -> None:
    """Drop everything inherited from a parent process (called in each pool child after fork)."""
    global _context
    with _lock:
        _context = None
