"""What the benchmark scripts share: services started on demand, statistics, result tables, JSON output.

The benchmarks are scripts, not tests: ``run.py`` starts what they need (a real Redis, a real Neo4j, the
LLM stand-in, real worker processes), runs them, prints tables and writes JSON under ``bench-results/``.
Absolute times on a small shared machine are noisy, so every benchmark quotes medians and a ratio to a
baseline measured in the same run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import shutil
import statistics
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
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


# ----------------------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def dist(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, p99 and mean of a sample (same unit as the sample)."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def ratio(ours: float, base: float) -> float:
    return ours / base if base > 0 else float("nan")


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


# ---------------------------------------------------------------------------------------------- results
@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    caption: str = ""

    def add(self, *cells: Any) -> None:
        self.rows.append(list(cells))


@dataclass
class BenchResult:
    bench: str
    summary: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores, CPU model, RAM, and the load averages right now (other
    processes share the two cores: a high load makes absolute times meaningless, ratios less so)."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = float("nan")
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024**2, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "loadavg_1_5_15min": list(os.getloadavg()),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None  # NaN is not JSON
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_result(result: BenchResult, *, mode: str, started_at: str, seconds: float, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "bench": result.bench,
        "mode": mode,
        "started_at": started_at,
        "seconds": round(seconds, 1),
        "machine": machine(),
        "summary": result.summary,
        "tables": [asdict(t) for t in result.tables],
        "notes": result.notes,
    }
    path = out_dir / f"{result.bench}.json"
    path.write_text(json.dumps(_jsonable(payload), indent=2, default=str) + "\n")
    return path


def markdown(results: dict[str, Any]) -> str:
    """The tables and notes of written results (``{bench: result JSON}``) as Markdown, for the docs."""
    out = []
    for name, result in results.items():
        out.append(f"### {name} ({result['mode']}, {result['seconds']} s)\n")
        for table in result["tables"]:
            out.append(f"**{table['title']}**\n")
            out.append("| " + " | ".join(table["columns"]) + " |")
            out.append("|" + "---|" * len(table["columns"]))
            out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in table["rows"]]
            out.append(f"\n_{table['caption']}_\n" if table["caption"] else "")
        out += [f"- {note}" for note in result["notes"]]
        out.append("")
    return "\n".join(out)


def print_result(console: Console, result: BenchResult) -> None:
    from rich.table import Table as RichTable

    for table in result.tables:
        rich_table = RichTable(title=table.title, caption=table.caption or None, title_justify="left")
        for col in table.columns:
            rich_table.add_column(col, overflow="fold")
        for row in table.rows:
            rich_table.add_row(*(fmt(c) for c in row))
        console.print(rich_table)
    for note in result.notes:
        console.print(f"  [dim]note:[/dim] {note}")
    console.print()


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


def seconds_to_ms(values: Sequence[float]) -> list[float]:
    return [v * 1e3 for v in values if v == v]


def proc_memory(pid: int) -> dict[str, float]:
    """Peak and current resident set size of a process in MiB (VmHWM/VmRSS from /proc), plus its unique
    set size (USS: memory freed if it exited) when psutil is installed."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) / 1024
    out = {"peak_rss_mib": fields.get("VmHWM", float("nan")), "rss_mib": fields.get("VmRSS", float("nan"))}
    out["uss_mib"] = float("nan")
    try:
        import psutil
    except ImportError:
        return out
    with contextlib.suppress(OSError, psutil.Error):
        out["uss_mib"] = psutil.Process(pid).memory_full_info().uss / 2**20
    return out


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in children.read_text().split()]
    return out


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of one process so far, from one read of /proc/<pid>/stat:
    cheap enough to take around every store call (``cpu_seconds`` walks the process tree). NaN without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def command_calls(client: Any, *, since: Mapping[str, int] | None = None) -> collections.Counter[str]:
    """Calls per Redis command (``INFO commandstats``: a pipeline counts each of its commands, a script one
    ``evalsha`` plus what it calls), since the server started or since an earlier reading."""
    stats = client.info("commandstats")
    calls = collections.Counter({name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()})
    calls.subtract(since or {})
    return calls


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU seconds (user + system, all threads) used so far by ``pids`` and all their descendants, from
    /proc/<pid>/stat. Reaped children count through their parent's cutime/cstime, so a pool child that
    exits between two readings is not lost. NaN where /proc is not available."""
    if not Path("/proc/self/stat").exists():
        return float("nan")
    ticks = 0
    for root in pids:
        for pid in _tree(root):
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
                ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime (fields 14-17)
    return ticks / _CLK_TCK


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def clean_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def env_for_children() -> dict[str, str]:
    """PYTHONPATH so that worker processes (started from the repo root) import ``stage_timer``."""
    parts = [str(BENCH_DIR), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(parts))}
