"""What the benchmark scripts share: statistics, result tables, JSON output; every script imports from here.

The benchmarks are scripts, not tests: ``run.py`` starts what they need (a real Redis, a real Neo4j, the
LLM stand-in, real worker processes), runs them, prints tables and writes JSON under ``bench-results/``.
Absolute times on a small shared machine are noisy, so every benchmark quotes medians and a ratio to a
baseline measured in the same run. The deployment they measure (paths, services, ``BenchContext``,
workers) is in ``benchstack``, what they read besides the clock (CPU, memory, Redis commands) in
``benchmeters``; both are imported through this module.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmeters import command_calls, cpu_seconds, machine, proc_memory, process_cpu_seconds
from benchstack import (
    BENCH_DIR,
    DATASET_FILES,
    DATASETS,
    REPO,
    RESULTS,
    BenchContext,
    Services,
    env_for_children,
    restart_apply,
    restart_extract,
    start_workers,
    status_rows,
)

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "BENCH_DIR",
    "DATASETS",
    "DATASET_FILES",
    "REPO",
    "RESULTS",
    "BenchContext",
    "BenchResult",
    "Services",
    "Table",
    "clean_dir",
    "command_calls",
    "cpu_seconds",
    "dist",
    "env_for_children",
    "fmt",
    "load_json",
    "machine",
    "markdown",
    "percentile",
    "print_result",
    "proc_memory",
    "process_cpu_seconds",
    "ratio",
    "restart_apply",
    "restart_extract",
    "seconds_to_ms",
    "start_workers",
    "status_rows",
    "write_result",
]


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


def seconds_to_ms(values: Sequence[float]) -> list[float]:
    return [v * 1e3 for v in values if v == v]


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


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def clean_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
