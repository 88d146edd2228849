"""Where a recall's CPU goes: cProfile over distinct recalls and over result-cache hits, in one process.

``python ops/bench/profile_recall.py --workdir DIR [--facts 10000] [--queries 40] [--top 25]``

The user is bulk-loaded once into SQLite under ``DIR`` with ``recall_ab.load`` (reused by later runs),
with a Redis started here for the published stamp, as a reader process would have it. Then, in this
process: recalls of distinct queries, each followed by the floor (query embedding + FAISS search, top 30)
and by the same recall again (a cache hit), all timed; then the same under cProfile. Prints p50s, each
recall's ratio to the floor measured in this run, the load average, and the profiles' top functions by
own time and engram_api's by cumulative time. Run it from each checkout (``PYTHONPATH`` = that checkout)
to compare code against code.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="data (kept between runs)")
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    from benchlib import dist, ratio
    from corpus import queries
    from recall_ab import backend_redis, load

    from engram_api import MemoryClient
    from engram_api.settings import Settings
    from engram_workers.services import RedisServer

    data_dir = args.workdir / "data-sqlite"
    redis = RedisServer(data_dir=args.workdir / "redis", appendonly=False)
    redis.start()
    try:
        user_id = load("", {"sqlite": data_dir}, redis.url, args.facts, args.workdir)
        # the database load() published the stamp in, as a reader process would find it
        client = MemoryClient(
            settings=Settings(data_dir=data_dir, neo4j_uri=None), redis_url=backend_redis(redis.url, "sqlite")
        )
        reader = client.reader
        qs = queries(f"profile-{time.time_ns()}", 3 * args.queries + 5)
        for q in qs[:5]:  # warm: model, index load, fact cache, weights
            reader.recall(user_id, f"warm-up {q}", k=10)
        index = reader.keeper.current(user_id, reader.graph.user_stamp(user_id))

        def timed(batch: list[str]) -> dict[str, list[float]]:
            out: dict[str, list[float]] = {"recall": [], "floor": [], "hit": []}
            for q in batch:
                start = time.perf_counter()
                reader.recall(user_id, q, k=10)
                out["recall"].append((time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
                index.search(reader.embedder.encode([q])[0], 30)
                out["floor"].append((time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
                assert reader.recall(user_id, q, k=10).cached
                out["hit"].append((time.perf_counter() - start) * 1e3)
            return out

        got = {name: dist(v) for name, v in timed(qs[5 : 5 + args.queries]).items()}
        r, f, h = got["recall"], got["floor"], got["hit"]
        print(
            f"recall p50 {r['p50']:.2f} ms p95 {r['p95']:.2f} | floor p50 {f['p50']:.2f} p95 {f['p95']:.2f}"
            f" | ratio p50 {ratio(r['p50'], f['p50']):.2f}x p95 {ratio(r['p95'], f['p95']):.2f}x"
            f" | cache hit p50 {h['p50']:.3f} ms p95 {h['p95']:.3f} | load {os.getloadavg()[0]:.1f}"
        )
        fresh = qs[5 + args.queries : 5 + 2 * args.queries]
        with cProfile.Profile() as misses:
            for q in fresh:
                reader.recall(user_id, q, k=10)
        with cProfile.Profile() as hits:
            for q in fresh:
                reader.recall(user_id, q, k=10)
        for name, prof in (("recalls (misses)", misses), ("cache hits", hits)):
            print(f"\n== {name}: {len(fresh)} calls, top by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
            print(f"== {name}: engram_api by cumulative time (the channels and store calls)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats("engram_api", args.top)
        client.close()
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
