"""A real Engram fleet for tests: worker processes on the real Redis and graph store, LLM stand-in.

Each stack gets its own Redis database number (one no other live stack holds) and data directory, so
stacks (and their queues, rate limits and breakers) never see each other; tests inside a stack isolate by
unique user ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from engram_api import MemoryClient
from engram_api.settings import Settings
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER, ManagedProcess, worker_command

if TYPE_CHECKING:
    from engram_workers.resources import WorkerResources

# How long a test waits for messages to settle: a hang guard, not a performance bound (benchmarks measure
# speed). Cold workers on a loaded 2-core machine take minutes over their first message (litellm import,
# the embedding model loading in each prefork child); pytest-timeout (300 s a test) stays the last resort.
SETTLE_S = 240.0

# Database 0 is left to whoever else uses the server; an external Redis has 16 databases by default.
_DATABASES = range(1, 16)
_databases_in_use: set[int] = set()

# Workers run from the source root: tests load middleware from tests.support (e.g. faults).
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def redis_db_url(base_url: str, number: int) -> str:
    """``base_url`` (scheme, credentials, host, port and query kept) pointing at database ``number``."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("redis", "rediss", "unix", "sentinel"):
        raise ValueError(f"not a Redis URL: {base_url!r}")
    if parts.scheme == "unix":  # unix:///path/to.sock?db=N: the database is a query parameter
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(number))]
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query)}"  # urlunsplit would drop the "//"
    return urlunsplit(parts._replace(path=f"/{number}"))


@contextmanager
def own_database() -> Iterator[int]:
    """A database number no live stack of this process uses (each stack flushes its database on start)."""
    free = [n for n in _DATABASES if n not in _databases_in_use]
    if not free:
        raise RuntimeError(f"all Redis databases {_DATABASES.start}..{_DATABASES.stop - 1} are in use by live stacks")
    number = free[0]
    _databases_in_use.add(number)
    try:
        yield number
    finally:
        _databases_in_use.discard(number)


@dataclass
class Stack:
    env: dict[str, str]
    data_dir: Path
    client: MemoryClient
    workers: list[ManagedProcess] = field(default_factory=list)
    resources: list[WorkerResources] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.client.settings

    def worker_resources(self, settings: Settings | None = None, **kwargs: Any) -> WorkerResources:
        """A worker process's resources in this process (the stack's settings unless given), closed with the
        stack: its erasure sweep must not outlive the stack's Redis."""
        from engram_workers.resources import WorkerResources

        ctx = WorkerResources(settings=settings or self.settings, **kwargs)
        self.resources.append(ctx)
        return ctx

    def start_worker(self, name: str, spec: Mapping[str, object], **overrides: object) -> ManagedProcess:
        args = {**spec, **overrides}
        proc = ManagedProcess(
            name=name,
            argv=worker_command(
                queues=args["queues"], pool=str(args["pool"]), concurrency=int(args["concurrency"]), name=name
            ),
            env=self.env,
            log_dir=self.data_dir / "logs",
            cwd=SOURCE_ROOT,
        ).start()
        proc.wait_for_log("ready.", timeout=90)
        self.workers.append(proc)
        return proc

    def stop(self) -> None:
        for ctx in self.resources:
            ctx.close()
        for proc in self.workers:
            proc.stop()
        self.client.close()


@contextmanager
def engram_stack(
    *,
    redis_url: str,
    data_dir: Path,
    neo4j_uri: str | None,
    llm_url: str | None,
    workers: bool = True,
    llm_env: Mapping[str, str] | None = None,
    database: int | None = None,
    **settings: object,
) -> Iterator[Stack]:
    """``llm_env`` (LLM_MODEL, LLM_API_KEY, LLM_API_BASE) points the stack at a real model instead of the
    stand-in at ``llm_url`` (``engram bench --llm``). ``database`` uses that database of ``redis_url`` (a
    server of the caller's own, e.g. as the embedded one, on database 0) instead of a free one."""
    with own_database() if database is None else nullcontext(database) as number:
        yield from _stack(redis_url=redis_db_url(redis_url, number), data_dir=data_dir, neo4j_uri=neo4j_uri,
                          llm_url=llm_url, workers=workers, llm_env=llm_env, settings=settings)  # fmt: skip


def _stack(
    *,
    redis_url: str,
    data_dir: Path,
    neo4j_uri: str | None,
    llm_url: str | None,
    workers: bool,
    llm_env: Mapping[str, str] | None,
    settings: Mapping[str, object],
) -> Iterator[Stack]:
    env = {
        "REDIS_URL": redis_url,
        "ENGRAM_DATA_DIR": str(data_dir),
        "NEO4J_URI": neo4j_uri or "",
        "LLM_MODEL": "openai/standin" if llm_url else "",
        "LLM_API_BASE": llm_url or "",
        "LLM_API_KEY": "test-key" if llm_url else "",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ENGRAM_LLM_MAX_ATTEMPTS": "3",
        "ENGRAM_LLM_TIMEOUT_S": "3",
        "ENGRAM_LLM_RATE_PER_S": "500",
        "ENGRAM_BREAKER_FAILURES": "1000",
        "ENGRAM_VISIBILITY_TIMEOUT_S": "60",
        "ENGRAM_APPLY_LOCK_TTL_S": "10",
        "ENGRAM_CACHE_TTL_S": "30",
    }
    if llm_env is not None:
        env.update({k: llm_env.get(k, "") for k in ("LLM_MODEL", "LLM_API_KEY", "LLM_API_BASE")})
    env.update({f"ENGRAM_{k.upper()}": str(v) for k, v in settings.items()})
    fields = {k.lower().removeprefix("engram_"): v for k, v in env.items() if v != ""}
    fields = {k: v for k, v in fields.items() if k in Settings.model_fields}
    client = MemoryClient(settings=Settings(**fields), redis_url=env["REDIS_URL"])
    client.redis.flushdb()
    stack = Stack(env=env, data_dir=data_dir, client=client)
    try:
        if workers:
            stack.start_worker("extract", EXTRACT_WORKER, concurrency=16)
            stack.start_worker("apply", APPLY_WORKER)
        yield stack
    finally:
        stack.stop()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")
