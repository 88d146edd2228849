"""Engram's benchmarks: ``python ops/bench/run.py [--quick] [--only enqueue,ingest,...] [--keep]``.

Starts what the selected benchmarks need (Redis, Neo4j, the LLM stand-in, worker processes), prints a
table per measurement and writes ``bench-results/<bench>.json`` plus ``bench-results/latest.json``
(all benchmarks of this run). ``--quick`` uses small sizes (a few minutes in all); without it the full
sizes documented in docs/benchmarks.md run (much longer). See docs/benchmarks.md for how to read them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parents[1]
# The scripts import each other by module name and the project from the repository root.
for entry in (str(BENCH_DIR), str(REPO)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import benchlib  # noqa: E402

# Order matters only for the console: cheap benchmarks first.
BENCHES = {
    "enqueue": "bench_enqueue",
    "housekeeping": "bench_housekeeping",
    "encoder": "bench_encoder",
    "llm": "bench_llm",
    "vectors": "bench_vectors",
    "gateway": "bench_gateway",
    "ingest": "bench_ingest",
    "apply": "bench_apply",
    "recall": "bench_recall",
    "hosts": "bench_hosts",
    "seeds": "bench_seeds",
    "memory": "bench_memory",
    "quality": "bench_quality",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes in all)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHES)}")
    parser.add_argument(
        "--out",
        type=Path,
        default=benchlib.RESULTS,
        help="where results, caches and the seeds' venv go (default: bench-results/)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's work directory (service data, logs)")
    parser.add_argument(
        "--datasets", type=Path, default=benchlib.DATASETS, help="where the quality benchmark's data sets are"
    )
    parser.add_argument(
        "--llm",
        action="store_true",
        help="quality only: extract with your own LLM_MODEL (LLM_API_KEY, LLM_API_BASE) instead of the offline "
        "extractor and the stand-in; costs real tokens (docs/extraction.md)",
    )
    parser.add_argument(
        "--store",
        choices=("neo4j", "sqlite"),
        default="neo4j",
        help="the graph store of the benchmarks' deployments (default neo4j; the gateway bench always uses sqlite)",
    )
    parser.add_argument(
        "--conversations",
        default="",
        help="quality only: comma-separated LoCoMo sample ids to run (default: conv-30 with --quick, all five without)",
    )
    args = parser.parse_args(argv)
    chosen = [b.strip() for b in args.only.split(",") if b.strip()] or list(BENCHES)
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    args.chosen = chosen
    if args.llm and (chosen != ["quality"] or not os.environ.get("LLM_MODEL")):
        parser.error("--llm needs --only quality and LLM_MODEL set to your model (e.g. openai/gpt-4o-mini)")
    return args


def without_missing_datasets(chosen: list[str], datasets: Path, console: Any) -> list[str]:
    """``chosen`` minus the benchmarks whose data files are not in ``datasets``, each skip said with
    where the files belong: a checkout without the data still runs everything else and exits 0."""
    kept = []
    for name in chosen:
        missing = [datasets / f for f in benchlib.DATASET_FILES.get(name, ()) if not (datasets / f).is_file()]
        if missing:
            wanted = "\n".join(f"  {path}" for path in missing)
            console.print(
                f"[yellow]{name} skipped:[/yellow] its data sets are not there; put these files in place\n"
                f"{wanted}\nor point --datasets at the directory that holds them."
            )
        else:
            kept.append(name)
    return kept


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console

    # Offline by construction, and worker processes must find stage_timer on their path.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.update(benchlib.env_for_children())

    console = Console(width=max(Console().width, 120))
    mode = "quick" if args.quick else "full"
    workdir = args.out / "work" / time.strftime("%Y%m%d-%H%M%S")
    services = benchlib.Services(workdir)
    ctx = benchlib.BenchContext(
        quick=args.quick,
        services=services,
        workdir=workdir,
        console=console,
        datasets=args.datasets.resolve(),
        user_llm=args.llm,
        out=args.out,
        store=args.store,
        conversations=tuple(c.strip() for c in args.conversations.split(",") if c.strip()),
    )
    info = benchlib.machine()
    console.print(
        f"[bold]Engram benchmarks[/bold] ({mode}): {', '.join(args.chosen)}"
        + (f" extracting with YOUR model {os.environ['LLM_MODEL']}\n" if args.llm else "\n")
        + f"machine: {info['nproc']} cores, {info['cpu_model']}, {info['ram_gib']} GiB RAM, "
        f"load {info['loadavg_1_5_15min'][0]:.2f}; store {args.store}; results -> {args.out}"
    )
    runnable = without_missing_datasets(args.chosen, args.datasets.resolve(), console)
    skipped = [name for name in args.chosen if name not in runnable]
    combined: dict[str, object] = {"mode": mode, "machine": info, "results": {}, "failed": {}, "skipped": skipped}
    try:
        for name in runnable:
            console.rule(f"[bold]{name}[/bold] (load average {os.getloadavg()[0]:.1f})")
            started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            t0 = time.perf_counter()
            try:
                result = importlib.import_module(BENCHES[name]).run(ctx)
            except Exception:
                # One failed benchmark must not hide the others' numbers; the exit code still says so.
                console.print(f"[red]{name} failed:[/red]\n{traceback.format_exc()}")
                combined["failed"][name] = traceback.format_exc(limit=3)  # type: ignore[index]
                continue
            seconds = time.perf_counter() - t0
            benchlib.print_result(console, result)
            path = benchlib.write_result(result, mode=mode, started_at=started_at, seconds=seconds, out_dir=args.out)
            combined["results"][name] = json.loads(path.read_text())  # type: ignore[index]
            console.print(f"[dim]{name}: {seconds:.0f} s, wrote {path}[/dim]")
    finally:
        services.close()
        if not args.keep:
            benchlib.clean_dir(workdir)
    args.out.mkdir(parents=True, exist_ok=True)  # also when every chosen benchmark was skipped
    (args.out / "latest.json").write_text(json.dumps(combined, indent=2, default=str) + "\n")
    (args.out / "latest.md").write_text(benchlib.markdown(combined["results"]))  # type: ignore[arg-type]
    return 1 if combined["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
