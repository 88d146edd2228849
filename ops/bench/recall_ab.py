"""Recall at 10K facts per user on Neo4j and on SQLite: this checkout against another one (e.g. main),
measured in one run, interleaved, each as a ratio to the floor its own reader process measured.

``python ops/bench/recall_ab.py --other /work/main [--facts 10000] [--queries 60] [--rounds 2]``

One 10K-fact user is bulk-loaded per backend (``bulk.bulk_load``: real ``GraphStore.apply`` and
``IndexKeeper.rebuild``). Then, round after round and checkout after checkout, a fresh reader process
(``PYTHONPATH`` = that checkout) answers distinct queries and, interleaved on the same queries, times the
floor (query embedding + FAISS search of the user's index, top 30) and the same query again (a result
cache hit). Each process prints recall p50/p95 and their ratios to its floor, cache-hit p50 and its RSS.
The machine's load average is printed with every row: absolute times on a loaded machine are inflated,
the ratios (and the two checkouts side by side) are what to read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parents[1]
BACKENDS = ("neo4j", "sqlite")


def measure(user_id: str, n_queries: int) -> dict[str, Any]:
    """In a reader process configured from the environment: recall, floor and cache hits for ``user_id``."""
    from benchlib import dist, proc_memory
    from corpus import queries

    from engram_api import MemoryClient

    reader = MemoryClient().reader
    qs = queries(f"ab-{time.time_ns()}", n_queries + 5)
    for q in qs[:5]:  # warm: model, index load, driver pool, query plans, the user's snapshot (loaded behind)
        reader.recall(user_id, f"warm-up {q}", k=10)
        reader.flush()
    index = reader.keeper.current(user_id, reader.graph.user_stamp(user_id))
    totals, floor, hits = [], [], []
    for q in qs[5:]:
        start = time.perf_counter()
        result = reader.recall(user_id, q, k=10)
        totals.append((time.perf_counter() - start) * 1e3)
        if result.cached:
            raise RuntimeError(f"recall of {q!r} came from the result cache")
        # The floor encodes through ``encode`` (no query cache): ``encode_one`` would answer from the LRU
        # the recall above just filled, leaving FAISS alone as the "floor".
        start = time.perf_counter()
        index.search(reader.embedder.encode([q])[0], 30)
        floor.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()  # right away: a loaded machine could outlast the cache's TTL
        if not reader.recall(user_id, q, k=10).cached:
            raise RuntimeError(f"repeated recall of {q!r} missed the result cache")
        hits.append((time.perf_counter() - start) * 1e3)
    return {
        **against_floor(totals, floor),
        "cache_hit_ms": dist(hits),
        "vectors": len(index),
        "memory": proc_memory(os.getpid()),
        "load": os.getloadavg(),
    }


def against_floor(totals: list[float], floor: list[float]) -> dict[str, Any]:
    """Recall and floor distributions (ms) and their ratios at p50 and p95."""
    from benchlib import dist, ratio

    total, base = dist(totals), dist(floor)
    return {
        "recall_ms": total,
        "floor_ms": base,
        "ratio_p50": ratio(total["p50"], base["p50"]),
        "ratio_p95": ratio(total["p95"], base["p95"]),
    }


def backend_redis(redis_url: str, backend: str) -> str:
    """A Redis database per backend: the same user id lives in both, and a stamp one backend published
    would send the other's reader into a rebuild of the user's index on every recall."""
    return f"{redis_url.rsplit('/', 1)[0]}/{BACKENDS.index(backend)}"


@contextlib.contextmanager
def stores(workdir: Path, neo4j_uri: str = "") -> Iterator[tuple[str, str]]:
    """A Redis, and a Neo4j unless ``neo4j_uri`` names one ("none": no Neo4j), with their data under
    ``workdir``: yields (Redis URL, Neo4j URI or "")."""
    from engram_api.settings import Settings
    from engram_api.storage import migrate_graph_store
    from engram_testing import Neo4jServer
    from engram_workers.services import RedisServer

    workdir.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(data_dir=workdir / "redis", appendonly=False)
    redis.start()
    neo4j = Neo4jServer(data_dir=workdir / "neo4j").start() if not neo4j_uri else None
    if neo4j is not None:
        migrate_graph_store(Settings(neo4j_uri=neo4j.uri))  # `engram migrate`, as an operator would
    try:
        yield redis.url, str(neo4j.uri) if neo4j is not None else ("" if neo4j_uri == "none" else neo4j_uri)
    finally:
        redis.stop()
        if neo4j is not None:
            neo4j.stop()


def reader_env(tree: Path, data_dir: Path, backend: str, neo4j_uri: str, redis_url: str) -> dict[str, str]:
    """The environment of a reader process of checkout ``tree`` over ``backend``'s stores."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(BENCH_DIR)]),
        "ENGRAM_DATA_DIR": str(data_dir),
        "NEO4J_URI": neo4j_uri if backend == "neo4j" else "",
        # the published stamp: a cache hit asks Redis, not the store
        "REDIS_URL": backend_redis(redis_url, backend),
        "HF_HUB_OFFLINE": "1",
        # Neo4j counts (re)planning against the timeout, and it replans after the bulk load and
        # per list-size bucket: seconds each on a loaded machine. Latency is measured here, not that.
        "ENGRAM_NEO4J_QUERY_TIMEOUT_S": "300",
    }


def run_reader(cmd: list[str], env: dict[str, str], cwd: Path, what: str) -> dict[str, Any]:
    """Run a measuring child process; the JSON its last line prints."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(neo4j_uri: str, data_dirs: dict[str, Path], redis_url: str, facts: int, out: Path) -> str:
    """Bulk-load one user of ``facts`` facts into each backend; returns the user id."""
    from bulk import bulk_load

    from engram_api import MemoryClient
    from engram_api.settings import Settings
    from engram_api.versions import publish_stamp

    user_id = f"ab-{facts}"
    for backend, data_dir in data_dirs.items():
        settings = Settings(data_dir=data_dir, neo4j_uri=neo4j_uri if backend == "neo4j" else None)
        client = MemoryClient(settings=settings, redis_url=backend_redis(redis_url, backend))
        reader = client.reader
        if client.graph.user_version(user_id) == 0:
            print(f"loading {facts} facts into {backend}", flush=True)
            bulk_load(client.graph, reader.keeper, reader.embedder, client.redis, user_id, facts, "ab", out=out)
        else:
            # A reused data dir meets this run's fresh Redis: publish the stamp as the apply stage would
            # have, or every cache hit falls back to reading the stamp from the store.
            publish_stamp(client.redis, user_id, client.graph.user_stamp(user_id))
        client.close()
    return user_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", type=Path, required=True, help="the checkout to compare with (e.g. /work/main)")
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--neo4j-uri", default="", help="use this Neo4j (default: start one)")
    parser.add_argument("--backends", default="neo4j,sqlite", help="comma-separated subset of: neo4j, sqlite")
    parser.add_argument("--workdir", type=Path, default=None, help="keep data here (reused by a later run)")
    parser.add_argument("--measure", default="", help=argparse.SUPPRESS)  # child mode: the user id
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    if args.measure:
        print(json.dumps(measure(args.measure, args.queries)))
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="recall-ab-"))
    with stores(workdir, args.neo4j_uri or ("" if "neo4j" in args.backends else "none")) as (redis_url, uri):
        data_dirs = {b: workdir / f"data-{b}" for b in args.backends.split(",")}
        user_id = load(uri, data_dirs, redis_url, args.facts, workdir)
        trees = {"this": REPO, "other": args.other.resolve()}
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for backend, data_dir in data_dirs.items():
                for label, tree in trees.items():
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--other", str(tree)]
                    cmd += ["--measure", user_id, "--queries", str(args.queries)]
                    env = reader_env(tree, data_dir, backend, uri, redis_url)
                    got = run_reader(cmd, env, tree, f"{label} on {backend}")
                    rows.setdefault((backend, label), []).append(got)
                    print(_row(backend, label, tree, got), flush=True)
        (workdir / "recall_ab.json").write_text(json.dumps({f"{b}/{t}": v for (b, t), v in rows.items()}, indent=1))


def _row(backend: str, label: str, tree: Path, got: dict[str, Any]) -> str:
    r, f = got["recall_ms"], got["floor_ms"]
    return (
        f"{backend:6} {label:5} ({tree}) vectors {got['vectors']}: recall p50 {r['p50']:.1f} ms p95 {r['p95']:.1f} ms"
        f" | floor p50 {f['p50']:.1f} p95 {f['p95']:.1f} | ratio p50 {got['ratio_p50']:.2f}x p95 {got['ratio_p95']:.2f}x"
        f" | cache hit p50 {got['cache_hit_ms']['p50']:.3f} ms | RSS {got['memory']['rss_mib']:.0f} MiB"
        f" | load {' '.join(f'{x:.1f}' for x in got['load'])}"
    )


if __name__ == "__main__":
    main()
