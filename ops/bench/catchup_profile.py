"""Where one catch-up of one write goes: a reader host whose copies (FAISS index, held snapshot) are one write
behind another host's, its catch-up split into its parts, each timed on this thread (CPU and wall).

``PYTHONPATH=<tree>:ops/bench python ops/bench/catchup_profile.py --data DIR --user ID [--writes 30] [--recalls 30]``

``DIR``: a SQLite user's folder (``recall_dump.py load``'s ``data-<N>``, user ``dump-<N>``); it is written to
(one fact a write), so use a copy. A Redis of its own; the writer and the reader are two clients of one
process with index folders of their own (the reader's copies move only by the change feed, as another
host's). Per write, on the reader, the steps ``CatchUps._catch_up`` runs, each timed on its own:

- stamp: ``read_stamp`` (the recall's Redis GET);
- feed read: its round trip, as a transaction with the stamp and as one command bounded by the stamp the
  recall read (``read_feed``'s ``upto``), then ``changes_of`` (the entries parsed);
- held: ``IndexKeeper.held`` (the copy moved on by its local log: one probe);
- index apply: ``IndexKeeper.apply`` (a copy of the overlay, the delta, the local log's record);
- snapshot: ``SnapshotCache.caught_up`` (the overlay records) and ``fold_soon``;
then the whole ``_catch_up`` on a copy behind (every other write: the sum as it runs); before those, after
each of ``--recalls`` writes a recall right after it and one of the same words with no write since (CPU of
this thread and the reader's pool, ``hosts_pairs.reader_meter``; their per-pair ratio). Medians, one JSON
line. Alternate trees in fresh processes (on fresh copies of ``DIR``) to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


def _clock() -> tuple[float, float]:
    return time.thread_time(), time.perf_counter()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    cpu, wall = _clock()
    return (cpu - start[0]) * 1e3, (wall - start[1]) * 1e3


def profile(data: Path, user_id: str, writes: int, recall_writes: int) -> dict[str, Any]:
    from corpus import queries
    from hosts_pairs import reader_meter, timed_recall
    from snapshot_refresh import write_one

    from engram_api import MemoryClient, keys
    from engram_api.settings import Settings
    from engram_api.storage.faiss.feed import changes_of
    from engram_api.storage.faiss.files import VectorStore
    from engram_api.versions import Stamp, publish_stamp, read_stamp
    from engram_workers.services import RedisServer

    work = Path(tempfile.mkdtemp(prefix="catchup-profile-"))
    redis = RedisServer(data_dir=work / "redis", appendonly=False)
    redis.start()
    try:
        settings = Settings(data_dir=data, neo4j_uri=None)
        writer = MemoryClient(settings=settings, redis_url=redis.url)
        reader_client = MemoryClient(settings=settings, redis_url=redis.url)
        for client, name in ((writer, "writer"), (reader_client, "reader")):
            keeper = client.reader.keeper
            keeper.vectors = VectorStore(root=work / name, dim=keeper.vectors.dim)
            client.signals.stop()
        reader = reader_client.reader
        publish_stamp(writer.redis, user_id, writer.graph.user_stamp(user_id))
        for i in range(6):  # the reader's copy, its snapshot held; the writer's copy
            reader.recall(user_id, f"warm-up query number {i}", k=10)
            reader.flush()
        write_one(writer, user_id, -1, read_index=True)
        reader.recall(user_id, "warm-up after a write", k=10)
        reader.flush()
        parts: dict[str, list[tuple[float, float]]] = {}
        meter = reader_meter(reader_client)
        recalls: dict[str, list[float]] = {"right after a write": [], "no write since": []}

        def took(part: str, start: tuple[float, float]) -> None:
            parts.setdefault(part, []).append(_since(start))

        qs = queries(f"catchup-{time.time_ns()}", recall_writes)
        for n, q in enumerate(qs):  # a recall right after a write, then one of the same words with no write since
            write_one(writer, user_id, 1000 + n, read_index=True)
            for label, text in (("right after a write", q), ("no write since", f"again {q}")):
                timed, _ = timed_recall(reader_client, user_id, text, meter)
                recalls[label].append(timed.cpu_ms)
        for n in range(writes):
            write_one(writer, user_id, n, read_index=True)
            held_snapshot = reader.snapshots.peek(user_id)
            if n % 2 == 1:  # the whole catch-up as the recall starts it, on this thread
                t = _clock()
                stamp = read_stamp(reader.redis, user_id)
                reader.catchups._catch_up(user_id, stamp, answering=True)
                took("whole catch-up", t)
                reader.flush()
                continue
            t = _clock()
            stamp = read_stamp(reader.redis, user_id)
            took("stamp", t)
            t = _clock()
            index = reader.keeper.held(user_id)
            took("held", t)
            since = min(index.version, held_snapshot.stamp.version)
            t = _clock()
            with reader.redis.pipeline(transaction=True) as pipe:
                pipe.get(keys.user_version(user_id))
                pipe.zrangebyscore(keys.change_feed(user_id), f"({since}", "+inf")
                raw_stamp, raw = pipe.execute()
            took("feed round trip: stamp and entries, one transaction", t)
            t = _clock()
            bounded = reader.redis.zrangebyscore(keys.change_feed(user_id), f"({since}", stamp.version)
            took("feed round trip: entries up to the stamp", t)
            assert bounded == raw
            t = _clock()
            changes = changes_of(raw, since, Stamp.parse(raw_stamp))
            took("feed parse", t)
            assert changes is not None and changes.vectors.stamp == stamp
            t = _clock()
            reader.keeper.apply(user_id, index, changes.vectors)
            took("index apply", t)
            t = _clock()
            reader.snapshots.caught_up(held_snapshot, changes, stamp, answering=True)
            took("snapshot caught up", t)
            t = _clock()
            reader.snapshots.fold_soon(user_id, reader._threads.when_idle)
            took("fold_soon", t)
            reader.flush()
        out = {
            part: {"cpu_ms": statistics.median(c for c, _ in v), "wall_ms": statistics.median(w for _, w in v)}
            for part, v in parts.items()
        }
        out["recall_cpu_ms"] = {label: statistics.median(v) for label, v in recalls.items() if v}
        if recall_writes:
            out["recall_cpu_ratio_p50"] = statistics.median(a / b for a, b in zip(*recalls.values(), strict=True))
        out["load"] = os.getloadavg()
        writer.close()
        reader_client.close()
        return out
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--writes", type=int, default=30)
    parser.add_argument("--recalls", type=int, default=30, help="writes each followed by the two recalls")
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    print(json.dumps(profile(args.data, args.user, args.writes, args.recalls)))


if __name__ == "__main__":
    main()
