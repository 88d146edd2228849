"""Recall at 10K facts per user while the user is being written: the graph step through the store
(``ENGRAM_SNAPSHOT_MAX_RECORDS`` below the user's size) against the in-memory snapshot kept current by
refreshes (``GraphStore.refresh_snapshot``: only the records written since), in one run, interleaved.

``python ops/bench/snapshot_refresh.py [--facts 10000] [--queries 60] [--every 0,4] [--rounds 2]``

One 10K-fact user is bulk-loaded per backend (``recall_ab.load``). Then, round after round, a fresh reader
process per (backend, bound, write rate) answers distinct queries; with ``--every N`` a writer in the same
process (its own client, as a worker would be: its writes do not touch the reader's caches) applies one
message of one new fact through ``UserWrites`` (fence, FAISS delta, published stamp) before every Nth
recall. Each process prints recall p50/p95 and their ratios to its floor (query embedding + FAISS search,
top 30, interleaved), how many recalls the snapshot answered, and its CPU seconds over the loop (the
writer's share is the same in both bounds; the difference is what refreshing costs against what it saves).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parents[1]
BOUNDS = {"store step": 5_000, "snapshot": 20_000}


def write_one(
    client: Any, user_id: str, n: int, *, read_index: bool = False, published: bool = False, tag: str | None = None
) -> float:
    """One message with one new fact about the user, as the apply stage writes it; with ``read_index`` the
    plan first reads the writer's index, as consolidation does; with ``published`` the write is fenced on
    the published stamp, as a message's first start in the apply stage is; ``tag`` names the
    message (``probe-ep-<tag>``) and its fact (``probe-<tag>``), unique when None. Returns the write's milliseconds (the
    ``UserWrites.run``, the text's embedding left out)."""
    from engram_api.models import EpisodeRecord, FactRecord, WritePlan, utcnow
    from engram_api.naming import self_entity_id

    text = f"The user noted probe item {n} at {time.time_ns()}."
    embedding = client.reader.embedder.encode([text])[0].tolist()

    def body(write: Any) -> None:
        if read_index:
            write.index()
        now = utcnow()
        named = tag or f"{os.getpid()}-{time.time_ns()}"
        fact = FactRecord(
            id=f"probe-{named}", user_id=user_id, subject_id=self_entity_id(user_id), predicate="NOTED",
            statement=text, valid_from=now, created_at=now, embedding=embedding,
        )  # fmt: skip
        episode = EpisodeRecord(id=f"probe-ep-{named}", user_id=user_id, content=text, event_time=now)
        client.graph.apply(WritePlan(user_id=user_id, episode=episode, new_facts=[fact]))
        write.finish(upserts=[(fact.id, "fact", embedding)])

    start = time.perf_counter()
    client.reader.writes.run(user_id, body, wait=10.0, published=published)
    return (time.perf_counter() - start) * 1e3


def measure(user_id: str, n_queries: int, every: int) -> dict[str, Any]:
    """In a reader process configured from the environment: recalls, floor, snapshot use, CPU."""
    from corpus import queries
    from recall_ab import against_floor

    from engram_api import MemoryClient
    from engram_api.versions import read_stamp

    reader = MemoryClient().reader
    writer = MemoryClient() if every else None
    qs = queries(f"refresh-{time.time_ns()}", n_queries + 5)
    for q in qs[:5]:  # warm: model, index, driver pool, query plans, the snapshot's first whole load
        reader.recall(user_id, f"warm-up {q}", k=10)
        reader.flush()
    totals, floor, from_snapshot = [], [], 0
    cpu = time.process_time()
    for i, q in enumerate(qs[5:]):
        if writer is not None and i % every == 0:
            write_one(writer, user_id, i)
        stamp = read_stamp(reader.redis, user_id) or reader.graph.user_stamp(user_id)
        from_snapshot += reader.snapshots.get(user_id, stamp) is not None
        start = time.perf_counter()
        reader.recall(user_id, q, k=10)
        totals.append((time.perf_counter() - start) * 1e3)
        index = reader.keeper.current(user_id, stamp)
        start = time.perf_counter()
        index.search(reader.embedder.encode([q])[0], 30)
        floor.append((time.perf_counter() - start) * 1e3)
    reader.flush()
    cpu = time.process_time() - cpu
    return {
        **against_floor(totals, floor),
        "from_snapshot": from_snapshot,
        "recalls": len(totals),
        "cpu_s": cpu,
        "load": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--every", default="0,4", help="write before every Nth recall (0: never), comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backends", default="neo4j,sqlite", help="comma-separated subset of: neo4j, sqlite")
    parser.add_argument("--workdir", type=Path, default=None, help="keep data here (reused by a later run)")
    parser.add_argument("--measure", default="", help=argparse.SUPPRESS)  # child mode: the user id
    parser.add_argument("--write-every", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    if args.measure:
        print(json.dumps(measure(args.measure, args.queries, args.write_every)))
        return

    from recall_ab import load, reader_env, run_reader, stores

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="snapshot-refresh-"))
    backends = args.backends.split(",")
    with stores(workdir, "" if "neo4j" in backends else "none") as (redis_url, uri):
        data_dirs = {b: workdir / f"data-{b}" for b in backends}
        user_id = load(uri, data_dirs, redis_url, args.facts, workdir)
        rows: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for backend, data_dir in data_dirs.items():
                for every in (int(e) for e in args.every.split(",")):
                    for label, bound in BOUNDS.items():
                        env = reader_env(REPO, data_dir, backend, uri, redis_url)
                        env["ENGRAM_SNAPSHOT_MAX_RECORDS"] = str(bound)
                        cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", user_id]
                        cmd += ["--queries", str(args.queries), "--write-every", str(every)]
                        got = run_reader(cmd, env, REPO, f"{backend} {label}")
                        rows.setdefault(f"{backend}/{every}/{label}", []).append(got)
                        print(_row(backend, every, label, got), flush=True)
        (workdir / "snapshot_refresh.json").write_text(json.dumps(rows, indent=1))


def _row(backend: str, every: int, label: str, got: dict[str, Any]) -> str:
    r, f = got["recall_ms"], got["floor_ms"]
    writes = f"a write every {every} recalls" if every else "no writes"
    return (
        f"{backend:6} {writes:24} {label:10}: recall p50 {r['p50']:.1f} ms p95 {r['p95']:.1f} | floor p50 "
        f"{f['p50']:.1f} | ratio p50 {got['ratio_p50']:.2f}x p95 {got['ratio_p95']:.2f}x | snapshot answered "
        f"{got['from_snapshot']}/{got['recalls']} | CPU {got['cpu_s']:.1f} s | load {got['load'][0]:.2f}"
    )


if __name__ == "__main__":
    main()
