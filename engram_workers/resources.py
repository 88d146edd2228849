"""Per-process resources of a worker (``WorkerResources``: settings, Redis, the graph store, the encoder,
the index keeper, the LLM controls, ...), created on first use (after the pool forks, never before).

Nothing here connects or loads a model at import: Celery's prefork pool forks after importing the task
modules, and a Neo4j driver, a Redis pool or torch state copied across a fork is a bug waiting to happen.
So each pool child drops what it inherited (``reset_resources`` on ``worker_process_init``) and closes
its own on the way out (``close_resources``, which a one-shot command such as ``engram maintenance`` also
calls when its job ends); the handlers are connected when the task modules import this one, in the parent.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Any

import redis
from celery.signals import worker_process_init, worker_process_shutdown

from engram_api.connections import redis_client, resolve_redis_url
from engram_api.ledger import MessageLedger
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

__all__ = ["WorkerResources", "close_resources", "get_resources", "reset_resources"]


class WorkerResources:
    def __init__(self, *, settings: Settings, dispatch: Dispatch = send) -> None:
        self.settings = settings
        # How stages publish the next task: the worker's Celery app unless a caller injects another.
        self.dispatch = dispatch
        self._warm = False
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
        return redis_client(self.redis_url, self.settings)

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
        # This process's share of erasure on every host: its local files of forgotten users go (``erasure``), and
        # their texts in its encoder cache.
        self.sweeper = IndexSweeper(keeper, self.redis, self.settings.index_sweep_interval_s, self.embedder).start()
        return keeper

    @cached_property
    def writes(self) -> UserWrites:
        return UserWrites(
            graph=self.graph, keeper=self.keeper, redis_client=self.redis, lease_ttl_s=self.settings.apply_lock_ttl_s
        )

    @cached_property
    def ledger(self) -> MessageLedger:
        """Every Redis transition of a message (``engram_api.ledger``) on this context's client."""
        return MessageLedger(self.redis, status_ttl_s=self.settings.status_ttl_s, secrets=self.settings.secrets)

    @cached_property
    def rate_limiter(self) -> LLMRateLimiter:
        # Both controls read numbers only: no decoding; a short timeout, so an absent Redis is a quick retry.
        return LLMRateLimiter(
            redis=redis_client(self.redis_url, self.settings, timeout_s=5, decode_responses=False),
            per_second=self.settings.llm_rate_per_s,
        )

    @cached_property
    def breaker(self) -> LLMBreaker:
        return LLMBreaker(
            redis=redis_client(self.redis_url, self.settings, timeout_s=5),
            fail_max=self.settings.breaker_failures,
            reset_timeout=self.settings.breaker_reset_s,
            is_failure=is_service_failure,
        )

    @cached_property
    def hooks(self) -> Hooks:
        return build_hooks(self.settings)

    def close(self) -> None:
        """Stop the erasure sweep (before the stores it reads go), then close what was opened."""
        if self.sweeper is not None:
            self.sweeper.stop()
        if "graph" in self.__dict__:
            self.graph.close()
        if "redis" in self.__dict__:
            self.redis.close()
        for control in ("rate_limiter", "breaker"):  # each has its own client (no decoding, short timeouts)
            if control in self.__dict__:
                self.__dict__[control].redis.close()


_resources: WorkerResources | None = None
_lock = threading.Lock()


def get_resources() -> WorkerResources:
    global _resources
    with _lock:
        if _resources is None:
            _resources = WorkerResources(settings=load_settings())
        return _resources


def reset_resources() -> None:
    """Drop everything inherited from a parent process (called in each pool child after fork)."""
    global _resources
    with _lock:
        _resources = None


def close_resources() -> None:
    """Close this process's resources, if any were made, and forget them (the next use makes new ones).

    Never creates them only to close them; the erasure sweep's thread ends here."""
    global _resources
    with _lock:
        current, _resources = _resources, None
    if current is not None:
        current.close()


@worker_process_init.connect
def _fresh_resources_after_fork(**_: Any) -> None:
    # A pool child must not reuse sockets or model state copied from its parent.
    reset_resources()


@worker_process_shutdown.connect
def _close_resources(**_: Any) -> None:
    close_resources()
