"""Health checks behind ``MemoryClient.health()`` and ``engram health``: each check is timed and
reported on its own, and touches only its own dependency, so each failing row names its own cause.

The checks reach the services through ``Dependencies`` (a ``MemoryClient`` is one), so this module
imports nothing of the client that calls it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from engram_api import keys
from engram_api.models import CheckResult, HealthReport
from engram_api.redaction import redact

if TYPE_CHECKING:
    import redis

    from engram_api.settings import Settings
    from engram_api.storage import GraphStore

__all__ = ["Dependencies", "check_all", "check_ready", "timed"]


class Dependencies(Protocol):
    """What the checks reach: the settings, and the graph store and Redis, opened on first use."""

    settings: Settings

    @property
    def graph(self) -> GraphStore: ...

    @property
    def redis(self) -> redis.Redis: ...

    @property
    def redis_url(self) -> str: ...


def timed(fn: Callable[[], str], secrets: Iterable[str]) -> CheckResult:
    """Run one check; its detail (a URL, an error) is redacted: a health report is shown to operators.
    ``secrets`` (``Settings.secrets``) has no default, so no check can forget them: a provider may echo
    the configured key in its error."""
    start = time.perf_counter()
    try:
        detail = fn()
        ok = True
    except Exception as exc:
        detail, ok = f"{type(exc).__name__}: {exc}", False
    detail = redact(detail, secrets)[:300]
    return CheckResult(ok=ok, detail=detail, latency_ms=round((time.perf_counter() - start) * 1e3, 2))


def _dependencies(client: Dependencies) -> tuple[Callable[[], str], Callable[[], str]]:
    """The graph-store and Redis checks: what a process needs to serve at all."""
    settings = client.settings

    def graph() -> str:
        client.graph.ping()
        return settings.neo4j_uri or f"sqlite {settings.sqlite_path}"

    def redis_check() -> str:
        client.redis.ping()
        return client.redis_url

    return graph, redis_check


def check_ready(client: Dependencies, *, graph: bool = True) -> HealthReport:
    """Readiness: Redis (and the graph store unless ``graph`` is False), nothing else; an outage of
    either takes a process out of rotation without restarting it (liveness checks no dependency)."""
    graph_check, redis_check = _dependencies(client)
    named = [("redis", redis_check), *([("graph_store", graph_check)] if graph else [])]
    checks = {name: timed(fn, client.settings.secrets) for name, fn in named}
    return HealthReport(ok=all(c.ok for c in checks.values()), checks=checks)


def check_all(client: Dependencies) -> HealthReport:
    settings = client.settings
    graph, redis_check = _dependencies(client)

    def embedder() -> str:
        # Its own check, not the reader's: a Redis outage must not show up as an embedder failure, and
        # finding the model's files must not cost loading it.
        from engram_api.storage.embedding.embedder import embedder_for

        model = embedder_for(settings)
        return f"{settings.embedding_model} dim={model.dim} ({'loaded' if model.loaded else 'loads on first use'})"

    def index_dir() -> str:
        # Writable is all a probe needs: no listing (a glob of 100K files took ~250 ms a probe), and the
        # directory is only this process's cache of the graph's vectors (``storage.faiss.sync``).
        root = settings.index_dir
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK):
            raise PermissionError(f"{root} is not writable")
        return f"{root} (writable; a local cache of the graph's vectors)"

    def queues() -> str:
        pipe = client.redis.pipeline(transaction=False)
        names = keys.QUEUES
        for name in names:
            pipe.llen(keys.queue_key(name))
        depths = pipe.execute()
        dead = client.redis.zcard(keys.dead_letters())
        return ", ".join(f"{n}={d}" for n, d in zip(names, depths, strict=True)) + f", dead_letters={dead}"

    checks = {
        name: timed(fn, settings.secrets)
        for name, fn in (
            ("graph_store", graph),
            ("redis", redis_check),
            ("embedder", embedder),
            ("index_dir", index_dir),
            ("queues", queues),
        )
    }
    return HealthReport(ok=all(c.ok for c in checks.values()), checks=checks)
