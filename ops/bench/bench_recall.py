"""Recall latency and how it scales, against the floor of query embedding + FAISS search alone.

Users: one with ~1K memories ingested through the real pipeline (quick: ~200), and bulk-loaded users with
10K and (full run) 100K facts. Each recall is split by ``RecallResult.timings_ms`` into embed / faiss /
keyword (the wait left after embedding: it runs meanwhile) / graph step / other record reads / late
interaction's MaxSim (``late``, the second look's; ~0 for the bulk-loaded users, whose facts carry no
token states) / fusion; the floor (encode the query, search the user's FAISS index) is timed on the same queries,
interleaved, in the same process. Growth with the number of users: the small user is measured again after
more users are loaded into the same Neo4j. A FAISS micro-benchmark (flat vs IVF vs scalar-quantized) on
the bulk-loaded vectors says when an approximate index would pay off.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_ingest import scripted_responder
from benchlib import BenchContext, BenchResult, Table, dist, ratio, start_workers, status_rows
from bulk import bulk_load, embed_cached, statements
from corpus import messages, queries

_PARTS = ("embed", "faiss", "keyword", "graph", "records", "late", "fusion")


def measure(reader: Any, user_id: str, qs: list[str], *, graph_expansion: bool = True) -> dict[str, Any]:
    """Recall each query once (distinct queries: the result cache never answers), and the floor."""
    index = reader.keeper.current(user_id, reader.graph.user_stamp(user_id))
    reader.cache.drop_user(user_id)  # an earlier measurement's results must not answer these queries
    for q in qs[:3]:  # warm: index load, driver pool, weights lookup, the user's snapshot (loaded behind)
        reader.recall(user_id, f"warm-up {q}", k=10, graph_expansion=graph_expansion)
        reader.flush()  # steady state: a load still running would answer the first timed recalls from the store
    totals, floor, parts = [], [], {p: [] for p in _PARTS}
    for q in qs[3:]:
        start = time.perf_counter()
        result = reader.recall(user_id, q, k=10, graph_expansion=graph_expansion)
        totals.append((time.perf_counter() - start) * 1e3)
        if result.cached:
            raise RuntimeError(f"recall of {q!r} came from the result cache: every measurement needs fresh queries")
        for p in _PARTS:
            parts[p].append(result.timings_ms.get(p, 0.0))
        # The floor encodes through ``encode`` (no query cache): ``encode_one`` would answer from the LRU
        # the recall above just filled, leaving FAISS alone as the "floor".
        start = time.perf_counter()
        index.search(reader.embedder.encode([q])[0], 30)
        floor.append((time.perf_counter() - start) * 1e3)
    return {
        "total_ms": dist(totals),
        "floor_ms": dist(floor),
        "parts_ms": {p: dist(v) for p, v in parts.items()},
        "ratio_p50": ratio(dist(totals)["p50"], dist(floor)["p50"]),
        "ratio_p95": ratio(dist(totals)["p95"], dist(floor)["p95"]),
        "vectors": len(index),
    }


def _apply_cost(ctx: BenchContext, stack: Any, user_id: str, label: str, n: int) -> dict[str, float]:
    """In-worker apply seconds of ``n`` more messages for an existing user, one at a time."""
    pairs = []
    for m in messages(label, n):
        receipt = stack.client.enqueue(user_id, m.text, message_id=f"{label}-{m.index}", timestamp=m.timestamp)
        stack.client.wait(receipt, timeout=300)
        pairs.append((user_id, receipt.message_id))
    return dist([r["bench_apply_s"] * 1e3 for r in status_rows(stack, pairs, fields=("bench_apply_s",))])


def faiss_micro(vectors: np.ndarray, qvecs: np.ndarray, k: int = 30) -> list[dict[str, Any]]:
    """Flat vs IVF vs scalar-quantized on the same vectors: build time, bytes, query p50, recall@10."""
    import faiss

    n, d = vectors.shape
    flat = faiss.IndexFlatIP(d)
    flat.add(vectors)
    _, exact = flat.search(qvecs, 10)
    # FAISS wants >= 39 training points per list; 4 * sqrt(n) lists otherwise (its usual advice).
    nlist = max(16, min(int(4 * np.sqrt(n)), n // 39))
    specs: list[tuple[str, Any, dict[str, int]]] = [
        ("flat (exact, current)", lambda: faiss.IndexFlatIP(d), {}),
        (
            "SQ8 flat",
            lambda: faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT),
            {},
        ),
        (
            f"IVF{nlist} flat, nprobe 8",
            lambda: faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT),
            {"nprobe": 8},
        ),
        (
            f"IVF{nlist} flat, nprobe 32",
            lambda: faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT),
            {"nprobe": 32},
        ),
        (
            f"IVF{nlist} SQ8, nprobe 16",
            lambda: faiss.IndexIVFScalarQuantizer(
                faiss.IndexFlatIP(d), d, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
            ),
            {"nprobe": 16},
        ),
    ]
    rows = []
    for name, make, params in specs:
        index = make()
        start = time.perf_counter()
        if not index.is_trained:
            index.train(vectors)
        index.add(vectors)
        build = time.perf_counter() - start
        for key, value in params.items():
            setattr(index, key, value)
        lat = []
        for q in qvecs:
            t = time.perf_counter()
            index.search(q.reshape(1, -1), k)
            lat.append((time.perf_counter() - t) * 1e3)
        _, got = index.search(qvecs, 10)
        hit = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), exact.tolist(), strict=True)])
        rows.append(
            {
                "n": n,
                "index": name,
                "build_s": build,
                "mib": faiss.serialize_index(index).nbytes / 2**20,
                "search_ms": dist(lat),
                "recall_at_10": float(hit),
            }
        )
    return rows


def _rss_mib() -> float:
    """This process's resident set (the reader runs here, with its caches and the users' indexes loaded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(ctx: BenchContext) -> BenchResult:
    small_facts = ctx.size(200, 1_000)
    big_sizes = [10_000] if ctx.quick else [10_000, 100_000]
    neighbours = ctx.size(4, 20)
    n_queries = ctx.size(60, 300) + 3
    llm = ctx.services.llm
    small_msgs = list(messages("recall-small", int(small_facts / 2.5) + 1))
    llm.reset()
    llm.script(scripted_responder({m.text: m.extraction for m in small_msgs}))
    summary: dict[str, Any] = {"users": [], "growth": [], "faiss": [], "apply_cost": {}}
    latency = Table(
        "recall latency by memories per user (ms): ours vs the floor (query embedding + FAISS search alone)",
        [
            "user",
            "facts",
            "vectors",
            "p50",
            "p95",
            "floor p50",
            "floor p95",
            "ratio p50",
            "ratio p95",
            "vector-only p50",
            "reader RSS MiB",
        ],
    )
    parts = Table(
        "recall broken down (RecallResult.timings_ms, ms)",
        ["user", *[f"{p} p50" for p in _PARTS], "graph p95"],
    )

    def add_row(label: str, uid: str, facts: int) -> dict[str, Any]:
        got = measure(reader, uid, queries(f"recall-{label}", n_queries))
        vec_only = measure(reader, uid, queries(f"recall-{label}-vec", n_queries), graph_expansion=False)
        got.update(user=label, facts=facts, vector_only_ms=vec_only["total_ms"], reader_rss_mib=_rss_mib())
        latency.add(
            label,
            facts,
            got["vectors"],
            got["total_ms"]["p50"],
            got["total_ms"]["p95"],
            got["floor_ms"]["p50"],
            got["floor_ms"]["p95"],
            got["ratio_p50"],
            got["ratio_p95"],
            vec_only["total_ms"]["p50"],
            got["reader_rss_mib"],
        )
        parts.add(label, *[got["parts_ms"][p]["p50"] for p in _PARTS], got["parts_ms"]["graph"]["p95"])
        summary["users"].append(got)
        return got

    with ctx.stack("recall", llm=True) as stack:
        start_workers(stack, extract_concurrency=8)
        client = stack.client
        reader = client.reader
        small = ctx.uid("recall-small")
        ctx.log(f"recall: ingesting {len(small_msgs)} messages for one user through the pipeline")
        receipts = client.enqueue_many(
            [
                {"user_id": small, "messages": m.text, "message_id": f"m{m.index}", "timestamp": m.timestamp}
                for m in small_msgs
            ]
        )
        client.wait(receipts, timeout=1800)
        small_stats = client.stats(small)
        first = add_row("pipeline user, alone", small, small_stats.facts)

        big_users = []
        for size in big_sizes:
            uid = ctx.uid(f"recall-{size}")
            ctx.log(f"recall: bulk-loading {size} facts")
            bulk_load(
                client.graph, reader.keeper, reader.embedder, client.redis, uid, size, seed=str(size), out=ctx.out
            )
            big_users.append((uid, size))
        ctx.log(f"recall: bulk-loading {neighbours} more users of 1K facts each")
        for i in range(neighbours):
            bulk_load(
                client.graph, reader.keeper, reader.embedder, client.redis, ctx.uid(f"nb{i}"), 1_000, "nb", out=ctx.out
            )
        total = small_stats.facts + sum(s for _, s in big_users) + neighbours * 1_000
        again = add_row(f"pipeline user, +{len(big_users) + neighbours} users", small, small_stats.facts)
        for uid, size in big_users:
            add_row(f"bulk {size // 1000}K", uid, size)
        growth = Table(
            "recall cost vs number of users in the store (same pipeline user, fresh queries of the same kind)",
            ["store", "facts in store", "recall p50 ms", "graph p50 ms", "ratio to floor p50"],
        )
        for label, facts, got in (("1 user", small_stats.facts, first), ("all users", total, again)):
            growth.add(label, facts, got["total_ms"]["p50"], got["parts_ms"]["graph"]["p50"], got["ratio_p50"])
            summary["growth"].append({"store": label, "facts": facts, "recall_ms": got["total_ms"]})

        ctx.log("recall: apply cost for a small vs a 10K user (one message at a time)")
        apply_n = ctx.size(5, 20)
        cost = Table(
            "apply-stage cost vs user size (in-worker seconds, one message at a time)",
            ["user", "facts", "apply p50 ms", "apply p95 ms"],
        )
        for label, uid, facts in (("small", small, small_stats.facts), ("10K", big_users[0][0], big_users[0][1])):
            got = _apply_cost(ctx, stack, uid, f"cost-{label}", apply_n)
            summary["apply_cost"][label] = got
            cost.add(label, facts, got["p50"], got["p95"])

        ctx.log("recall: FAISS flat vs IVF vs SQ8")
        qvecs = reader.embedder.encode(queries("recall-faiss", n_queries))
        micro = Table(
            "FAISS index types on the bulk-loaded fact vectors (single-query search, k=30)",
            ["vectors", "index", "build s", "MiB", "search p50 ms", "search p95 ms", "recall@10 vs flat"],
        )
        for size in big_sizes:
            vectors = embed_cached(reader.embedder, [s for s, _, _ in statements(str(size), size)], ctx.out)
            for row in faiss_micro(np.ascontiguousarray(vectors, dtype=np.float32), qvecs):
                micro.add(
                    row["n"],
                    row["index"],
                    row["build_s"],
                    row["mib"],
                    row["search_ms"]["p50"],
                    row["search_ms"]["p95"],
                    row["recall_at_10"],
                )
                summary["faiss"].append(row)
    llm.reset()
    summary["ratio_p50_by_user"] = {u["user"]: u["ratio_p50"] for u in summary["users"]}
    return BenchResult(
        bench="recall",
        summary=summary,
        tables=[latency, parts, growth, cost, micro],
        notes=[
            "recall = MemoryClient.reader.recall(k=10), distinct queries (no result-cache hits), in this process",
            "floor = Embedder.encode([query]) (uncached) + UserIndex.search(top 30), the same queries, interleaved",
            "bulk users: WritePlans of 1,000 facts through GraphStore.apply, then IndexKeeper.rebuild; 80% of "
            "facts have the user as subject, so graph expansion through an entity reaches many facts",
            "vector-only = recall(..., graph_expansion=False)",
            "reader RSS = this process's resident set after measuring that user (the reader and its caches run here)",
        ],
    )
