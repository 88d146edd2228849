"""The deployment a benchmark measures: where a run reads and writes, the services it starts on demand
(Redis, Neo4j, the LLM stand-in), the ``BenchContext`` every benchmark gets, and its worker processes.

A run's services are started once, on first use, shared by all benchmarks of the run and stopped by
``Services.close``; every user id a benchmark makes is unique to the run (``BenchContext.uid``), so
benchmarks sharing one Redis and Neo4j never read each other's users. Worker processes are real ones,
started from the repository root with ``env_for_children`` so they load ``stage_timer``. Imported through
``benchlib``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from tests.support.stack import Stack


REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent
RESULTS = REPO / "bench-results"
# ../shared/datasets next to the checkout (a git worktree one level deeper finds it one level up).
DATASETS = next(
    (p / "shared" / "datasets" for p in (REPO.parent, REPO.parent.parent) if (p / "shared" / "datasets").is_dir()),
    REPO.parent / "shared" / "datasets",
)
# The files each benchmark reads below the datasets directory (they are not stored in the repository).
DATASET_FILES = {"quality": ("locomo/locomo_dev5.json", "engram_ltm_samples/sample_20.json")}


# --------------------------------------------------------------------------------------------- services
class Services:
    """Redis, Neo4j and the LLM stand-in, each started on first use and stopped by ``close``.

    Everything lives in one work directory of this run (deleted at the end unless ``keep``).
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._redis: Any = None
        self._neo4j: Any = None
        self._llm: Any = None

    @property
    def redis_url(self) -> str:
        if self._redis is None:
            from engram_workers.services.redis_server import RedisServer

            # AOF on, as deployed: enqueue latency includes what durability costs.
            self._redis = RedisServer(data_dir=self.workdir / "redis").start()
        return str(self._redis.url)

    @property
    def neo4j_uri(self) -> str:
        if self._neo4j is None:
            from engram_api.settings import Settings
            from engram_api.storage import migrate_graph_store
            from engram_testing.neo4j_server import Neo4jServer

            self._neo4j = Neo4jServer(data_dir=self.workdir / "neo4j", heap="2g").start()
            migrate_graph_store(Settings(neo4j_uri=self._neo4j.uri))  # `engram migrate`, as an operator would
        return str(self._neo4j.uri)

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from engram_testing.llm_standin import LLMStandin

            self._llm = LLMStandin().start()
        return self._llm

    def server_pids(self) -> dict[str, int]:
        """The process ids of the Redis and Neo4j servers this run started (not one given by NEO4J_URI)."""
        servers = {"redis": self._redis, "neo4j": self._neo4j}
        return {
            name: server.pid
            for name, server in servers.items()
            if server is not None and server.running and server.pid is not None
        }

    def close(self) -> None:
        for service in (self._llm, self._neo4j, self._redis):
            if service is not None:
                service.stop()


@dataclass
class BenchContext:
    quick: bool
    services: Services
    workdir: Path
    console: Console
    datasets: Path = DATASETS
    out: Path = RESULTS  # --out: results, the embedding cache and the seeds' venv all live here
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    user_llm: bool = False  # --llm: stacks that extract with an LLM use the user's LLM_MODEL, not the stand-in
    store: str = "neo4j"  # --store: the graph store of every stack that does not choose its own
    conversations: tuple[str, ...] = ()  # --conversations: the LoCoMo sample ids the quality bench runs

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def log(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

    def uid(self, label: str) -> str:
        """A user id unique to this run (the Neo4j and Redis of a run are shared by all benchmarks)."""
        return f"b{self.run_id}-{label}"

    @contextmanager
    def stack(self, name: str, *, llm: bool, neo4j: bool | None = None, **settings: object) -> Iterator[Stack]:
        """An Engram deployment on this run's services, without workers (``start_workers`` adds them).

        Every worker loads ``stage_timer.StageTimer``: it records each stage's in-worker seconds in the
        message's status hash, the same number the Prometheus histogram ``engram_stage_seconds`` gets.
        ``neo4j`` left at None means the run's ``--store``.
        """
        from tests.support.stack import engram_stack

        data_dir = self.workdir / name
        middleware = ",".join(filter(None, ["stage_timer:StageTimer", str(settings.pop("middleware", ""))]))
        with engram_stack(
            redis_url=self.services.redis_url,
            data_dir=data_dir,
            neo4j_uri=self.services.neo4j_uri if (self.store == "neo4j" if neo4j is None else neo4j) else None,
            llm_url=self.services.llm.url if llm and not self.user_llm else None,
            llm_env=os.environ if llm and self.user_llm else None,
            workers=False,
            middleware=middleware,
            **settings,
        ) as stack:
            yield stack


def start_workers(
    stack: Stack,
    *,
    extract_concurrency: int,
    apply_concurrency: int = 2,
    tag: str = "",
) -> None:
    """An extract worker (``extract_concurrency`` threads) and an apply worker (prefork, ``apply_concurrency``
    processes); ``restart_extract`` / ``restart_apply`` change them."""
    from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER

    stack.start_worker(f"extract{tag}-c{extract_concurrency}", EXTRACT_WORKER, concurrency=extract_concurrency)
    stack.start_worker(f"apply{tag}", APPLY_WORKER, concurrency=apply_concurrency)


def _replace(stack: Stack, prefix: str, spec: dict[str, Any], concurrency: int, processes: int) -> None:
    """Stop the workers whose name starts with ``prefix`` and start ``processes`` new ones (fresh log
    names, so a new worker's readiness is not read from an old one's log)."""
    for proc in [p for p in stack.workers if p.name.startswith(prefix)]:
        proc.stop()
        stack.workers.remove(proc)
    name = f"{prefix}-c{concurrency}-{uuid.uuid4().hex[:4]}"
    for i in range(processes):
        stack.start_worker(name if processes == 1 else f"{name}-p{i}", spec, concurrency=concurrency)


def restart_extract(stack: Stack, concurrency: int, *, processes: int = 1) -> None:
    """Replace the running extract worker(s) by ``processes`` worker processes of ``concurrency`` threads."""
    from engram_workers.services.celery_worker import EXTRACT_WORKER

    _replace(stack, "extract", EXTRACT_WORKER, concurrency, processes)


def restart_apply(stack: Stack, concurrency: int) -> None:
    """Replace the running apply worker by one with ``concurrency`` prefork processes."""
    from engram_workers.services.celery_worker import APPLY_WORKER

    _replace(stack, "apply", APPLY_WORKER, concurrency, 1)


def status_rows(stack: Stack, pairs: Sequence[tuple[str, str]], *, fields: Sequence[str]) -> list[dict[str, float]]:
    """The status hash fields (as floats) of each message, waiting briefly for the StageTimer's fields:
    they are written after the stage returns, a moment after the state says applied."""
    from engram_api import keys

    deadline = time.monotonic() + 10
    while True:
        pipe = stack.client.redis.pipeline(transaction=False)
        for uid, mid in pairs:
            pipe.hmget(keys.status(uid, mid), list(fields))
        raw = pipe.execute()
        if all(all(v is not None for v in row) for row in raw) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [{f: float(v) if v is not None else float("nan") for f, v in zip(fields, row, strict=True)} for row in raw]


def env_for_children() -> dict[str, str]:
    """PYTHONPATH so that worker processes (started from the repo root) import ``stage_timer``."""
    parts = [str(BENCH_DIR), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(parts))}
