"""Where an ingest burst's CPU goes, worker process by worker process.

``python ops/bench/profile_ingest.py [--store neo4j|sqlite] [--messages 1000] [--bursts 2] [--spy DIR]``

The ``ingest`` benchmark's target burst (``bench_ingest``): one extract worker of 64 threads, one apply
worker of 2 prefork processes, the LLM stand-in answering scripted extractions after 1 s, N messages over
50 users. Two unmeasured warm-ups (each fresh process loads its encoder and litellm), then ``--bursts``
measured bursts, each printed as one JSON line: messages/s, our CPU per message (all worker processes),
that CPU split by worker (extract, apply with its pool children), and the Redis and Neo4j servers' CPU
per message, and the Redis commands per message (the pipeline's: the bench's own polling left out).
The first burst after the warm-ups also warms the JVM: compare like with like (the second
against the second). With ``--spy DIR`` the first burst runs under ``py-spy record --gil`` (samples of
the thread holding the GIL: Python's CPU, not its waits) per worker, written to
``DIR/<store>-<worker>.txt`` as collapsed stacks, and the top frames by own samples are printed.
Run it from each checkout (``PYTHONPATH`` = that checkout) to compare code against code.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
USERS, THREADS, LATENCY_S = 50, 64, 1.0


def top_frames(path: Path, n: int = 12) -> list[tuple[float, str]]:
    """The ``n`` leaf frames with the most samples in a collapsed-stack file, as shares of all samples."""
    leaves: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaves[stack.rsplit(";", 1)[-1]] += int(count)
    total = sum(leaves.values()) or 1
    return [(count / total, frame) for frame, count in leaves.most_common(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["neo4j", "sqlite"], default="neo4j")
    parser.add_argument("--messages", type=int, default=1_000)
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--spy", type=Path, help="profile each worker during the first burst (needs py-spy)")
    args = parser.parse_args()
    if args.spy and shutil.which("py-spy") is None:
        parser.error("--spy needs py-spy on PATH (pip install -e '.[dev]' installs it)")
    sys.path[:0] = [str(BENCH_DIR)]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import benchlib
    from bench_ingest import _warm_up, scripted_responder
    from corpus import messages
    from rich.console import Console

    os.environ.update(benchlib.env_for_children())
    workdir = Path(tempfile.mkdtemp(prefix="engram-profile-ingest-"))
    services = benchlib.Services(workdir)
    ctx = benchlib.BenchContext(
        quick=True, services=services, workdir=workdir, console=Console(stderr=True), store=args.store
    )
    labels = [f"p{i}" for i in range(args.bursts)] + ["warm0", "warm1"]
    texts = {m.text: m.extraction for label in labels for m in messages(label, args.messages)}
    services.llm.reset()
    services.llm.script(scripted_responder(texts))
    try:
        with ctx.stack("profile-ingest", llm=True) as stack:
            benchlib.start_workers(stack, extract_concurrency=THREADS)
            warm_ups = itertools.count()
            for _ in range(2):
                _warm_up(ctx, stack, warm_ups, 1)
            for i in range(args.bursts):
                print(json.dumps(_measured(ctx, stack, f"p{i}", args, spy=args.spy if i == 0 else None)), flush=True)
    finally:
        services.close()
        benchlib.clean_dir(workdir)
    if args.spy:
        for path in sorted(args.spy.glob(f"{args.store}-*.txt")):
            print(f"\n{path.name}: top frames by own samples (GIL held)")
            for share, frame in top_frames(path):
                print(f"{share * 100:5.1f}%  {frame[:150]}")


def _measured(ctx: Any, stack: Any, label: str, args: argparse.Namespace, *, spy: Path | None) -> dict[str, Any]:
    import benchlib
    from bench_ingest import _measured_burst

    workers = [p for p in stack.workers if p.name.startswith(("extract", "apply"))]
    spies = []
    if spy is not None:
        spy.mkdir(parents=True, exist_ok=True)
        for p in workers:
            out = spy / f"{args.store}-{p.name.split('-')[0]}.txt"
            argv = ["py-spy", "record", "--gil", "--subprocesses", "-f", "raw", "-r", "100", "-p", str(p.pid), "-o", str(out)]  # fmt: skip
            spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches
    before = {p.name: benchlib.cpu_seconds([p.pid]) for p in workers}
    got = _measured_burst(ctx, stack, label, args.messages, USERS, LATENCY_S, extract_threads=THREADS)
    per_worker = {
        p.name.split("-")[0]: (benchlib.cpu_seconds([p.pid]) - before[p.name]) / args.messages * 1e3 for p in workers
    }
    for s in spies:
        s.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for s in spies:
        s.wait(timeout=60)
    return {
        "burst": label,
        "store": args.store,
        "messages": args.messages,
        "msgs_per_s": round(got["msgs_per_s"], 2),
        "our_cpu_ms_per_msg": round(got["our_cpu_ms_per_msg"], 1),
        "by_worker_ms_per_msg": {name: round(ms, 1) for name, ms in per_worker.items()},
        "server_cpu_ms_per_msg": {name: round(ms, 1) for name, ms in got["server_cpu_ms_per_msg"].items()},
        "redis_commands_per_msg": round(got["redis_commands_per_msg"], 1),
        "top_redis_commands_per_msg": got["top_redis_commands_per_msg"],
        "dead": got["dead"],
        "profiled": spy is not None,
    }


if __name__ == "__main__":
    main()
