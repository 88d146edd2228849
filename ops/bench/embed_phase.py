"""A recall's embedding phase against the encoder's own time, and the Python the recall runs beside it.

``PYTHONPATH=<tree>:ops/bench python ops/bench/embed_phase.py --workdir DIR --facts N [--queries 120]``

A SQLite bulk user under ``DIR`` (``recall_dump.py load``), its snapshot held, a Redis of its own (as
``recall_dump.py`` sets it up); in this process, by turns: a recall with nothing written since ("no write"),
and a recall right after a second client (same data, its own ``MemoryClient``, no signals: another host's
writer) wrote one fact ("after a write"; the reader's copies are then one write behind, so the recall
catches them up itself). Per recall: its "embed" part (``timings_ms``: from its start until it holds the
query's vector and what it started beside the encoder), the encoder's own time (``Embedder.encode`` of the
same query alone, right after: the floor's encoder; ``excess`` the difference), when ONNX Runtime's
``session.run`` began after the recall's call (``run_at``), how long it ran until its caller held the GIL
again, split into its thread CPU, its time on a run queue (waiting for a core: ``/proc/thread-self/schedstat``)
and what is left (``run_gil``: waiting for the GIL), how long the recall's end of the embedding ran after it
(``after_run``), and the thread CPU and wall time of the keyword search and of the catch-up. Medians, one
JSON line per kind. ``--switch MS`` sets ``sys.setswitchinterval`` first. Run it from each tree, alternated
in fresh processes, to compare code against code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


class _Clock:
    """Start/end (``perf_counter``) and thread CPU of each call of a wrapped function, in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, float]] = []
        self._lock = threading.Lock()

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.calls.append((start, time.perf_counter(), (time.thread_time() - cpu) * 1e3))

        return timed

    def since(self, mark: float) -> list[tuple[float, float, float]]:
        with self._lock:
            return [c for c in self.calls if c[0] >= mark]


def _waited_ms() -> float:
    """This thread's time on a run queue, ready but not running (``/proc/thread-self/schedstat``): what the
    CPU's other tenants cost it, as opposed to a wait for the GIL, where the thread sleeps."""
    with open("/proc/thread-self/schedstat") as fh:
        return int(fh.read().split()[1]) / 1e6


class _Session:
    """ONNX Runtime's session with its ``run`` timed (both trees call ``self.session.run``): start, end (once
    the caller holds the GIL again), thread CPU and run-queue wait of each call."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.calls: list[tuple[float, float, float, float]] = []

    def run(self, *args: Any, **kwargs: Any) -> Any:
        start, cpu, queued = time.perf_counter(), time.thread_time(), _waited_ms()
        try:
            return self._session.run(*args, **kwargs)
        finally:
            queued = _waited_ms() - queued
            self.calls.append((start, time.perf_counter(), (time.thread_time() - cpu) * 1e3, queued))

    def since(self, mark: float) -> list[tuple[float, float, float, float]]:
        return [c for c in self.calls if c[0] >= mark]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def measure(workdir: Path, facts: int, n: int) -> None:
    from corpus import queries
    from recall_dump import _reader, _warm
    from snapshot_refresh import write_one

    import engram_api.reader.recall as recall_module
    from engram_api import MemoryClient
    from engram_api.reader.catchup import CatchUps

    user_id = f"dump-{facts}"
    with _reader(workdir, workdir / f"data-{facts}", user_id) as client:
        client.reader  # noqa: B018
        client.signals.stop()  # the recall catches its copies up itself, as a reader host right after a write
        writer = MemoryClient(settings=client.settings, redis_url=client.redis_url)
        writer.reader  # noqa: B018
        writer.signals.stop()
        reader = client.reader
        _warm(reader, user_id)
        encoder = reader.embedder._load()
        runs, keyword, catchup = _Session(encoder.session), _Clock(), _Clock()
        encoder.session = runs
        recall_module.keyword_hits = keyword.wrap(recall_module.keyword_hits)
        CatchUps._catch_up = catchup.wrap(CatchUps._catch_up)  # type: ignore[method-assign]
        rows: dict[str, list[dict[str, float]]] = {"no write": [], "after a write": []}
        try:
            for i, q in enumerate(queries(f"embed-phase-{time.time_ns()}", 2 * n)):
                kind = ("no write", "after a write")[i % 2]
                if kind == "after a write":
                    write_one(writer, user_id, i, read_index=True)
                reader.flush()
                start = time.perf_counter()
                result = reader.recall(user_id, q, k=10)
                assert not result.cached
                run = runs.since(start)[0]
                row = {
                    "embed": result.timings_ms["embed"],
                    "run_at": (run[0] - start) * 1e3,
                    "run": (run[1] - run[0]) * 1e3,
                    "run_cpu": run[2],
                    "run_queued": run[3],
                    # what is left: the wait for the GIL once the model is done
                    "run_gil": (run[1] - run[0]) * 1e3 - run[2] - run[3],
                    "after_run": (start + result.timings_ms["embed"] / 1e3 - run[1]) * 1e3,
                }
                for name, clock in (("keyword", keyword), ("catchup", catchup)):
                    for s, e, cpu in clock.since(start)[:1]:
                        row[f"{name}_wall"], row[f"{name}_cpu"] = (e - s) * 1e3, cpu
                reader.flush()
                mark, cpu = time.perf_counter(), time.thread_time()
                reader.embedder.encode([q])
                row["encoder"] = (time.perf_counter() - mark) * 1e3
                row["encoder_cpu"] = (time.thread_time() - cpu) * 1e3
                row["excess"] = row["embed"] - row["encoder"]
                rows[kind].append(row)
        finally:
            writer.close()
        for kind, got in rows.items():
            names = dict.fromkeys(name for row in got for name in row)
            out = {name: round(statistics.median(r[name] for r in got if name in r), 3) for name in names}
            out["embed_over_encoder"] = round(out["embed"] / out["encoder"], 3)
            print(json.dumps({"kind": kind, "facts": facts, **out, "load": os.getloadavg()[0]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--facts", type=int, default=10_000, help="the bulk user of this size (under --workdir)")
    parser.add_argument("--queries", type=int, default=120, help="recalls of each kind")
    parser.add_argument("--switch", type=float, help="sys.setswitchinterval, in ms")
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    if args.switch:
        sys.setswitchinterval(args.switch / 1e3)
    measure(args.workdir, args.facts, args.queries)


if __name__ == "__main__":
    main()
