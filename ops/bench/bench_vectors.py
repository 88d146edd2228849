"""Vectors: the FAISS index update per write (delta log vs whole-file rewrite) and the index kind by size.

Update cost: ``IndexKeeper.advance`` with one message's change (5 vectors added, one removed every fourth
message) for a 169-vector user and a large user (10K quick, 100K full), interleaved, in a separate
process per code tree: this checkout ("after") and the commit before the delta log ("before", exported
with ``git archive``), both in this run. Printed as the large / small ratio (target <= 1.3x) at p50 and
as a mean that includes the compactions that ran. Writes go to real files with fsync.

Index kind: recall@10 and search time of IVF-SQ8 with exact re-rank against flat on the same vectors
(seeded unit vectors around 150 topics, as a user's sentence embeddings cluster), same queries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import REPO, BenchContext, BenchResult, Table, dist, ratio

SMALL = 169
_MARKER = "FAISS delta log per user index"  # the commit that introduced the delta log; "before" is its parent


def _measure(sizes: list[int], messages: int, root: str) -> dict[str, Any]:
    """Runs in the child process, on whichever tree is first on its path."""
    import numpy as np

    from engram_api.storage.faiss.files import VectorStore
    from engram_api.storage.faiss.keeper import IndexKeeper
    from engram_api.versions import Stamp

    dim, rng = 384, np.random.default_rng(15)

    def unit(n: int) -> np.ndarray:
        x = rng.standard_normal((n, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    store = VectorStore(root=Path(root), dim=dim)
    keeper = IndexKeeper(graph=None, vectors=store)  # type: ignore[arg-type]  # never rebuilds: files are current
    for size in sizes:
        index = store.new()
        index.upsert((f"{size}-{i}", "fact", v) for i, v in enumerate(unit(size)))
        index.stamp = Stamp(1, 1)
        store.save(f"user{size}", index)
        keeper.current(f"user{size}", Stamp(1, 1))
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for step in range(messages):
        for size in sizes:
            vectors = unit(5)
            ups = [(f"{size}-m{step}-{j}", "fact" if j < 3 else "entity", vectors[j]) for j in range(5)]
            gone = [f"{size}-{step}"] if step % 4 == 3 else []
            t = time.perf_counter()
            keeper.advance(
                f"user{size}", from_stamp=Stamp(1, step + 1), to_stamp=Stamp(1, step + 2), upserts=ups, removals=gone
            )
            times[size].append((time.perf_counter() - t) * 1000)
    assert keeper.rebuilds == 0
    out: dict[str, Any] = {"times": {str(k): v for k, v in times.items()}}
    large = keeper.current(f"user{sizes[-1]}", Stamp(1, messages + 1))
    if hasattr(large, "log_end"):  # the delta log: what one compaction of the large user costs, and how often
        from engram_api.storage.faiss.files import _read_head

        records = large.version - _read_head(store.path_for(f"user{sizes[-1]}"))[1]  # since the last compaction
        per_message = os.path.getsize(store.log_path_for(f"user{sizes[-1]}")) / max(records, 1)
        t = time.perf_counter()
        compacted = store.save(f"user{sizes[-1]}", large)
        out["compaction_ms"] = (time.perf_counter() - t) * 1000
        threshold = max(store.compact_min_bytes, store.compact_ratio * compacted.base_bytes)
        out["messages_per_compaction"] = threshold / per_message
    return out


def _tree_before(workdir: Path) -> Path:
    first = subprocess.run(
        ["git", "log", "--format=%H", f"--grep={_MARKER}", "-F", "--reverse"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    tree = workdir / "before"
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", f"{first}^", "engram_api"], cwd=REPO, capture_output=True, check=True)
    with tempfile.TemporaryFile() as fh:
        fh.write(archive.stdout)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(tree, filter="data")
    return tree


def _run_tree(tree: Path, sizes: list[int], messages: int, workdir: Path) -> dict[str, Any]:
    root = tempfile.mkdtemp(dir=workdir)
    code = f"import json, bench_vectors; print(json.dumps(bench_vectors._measure({sizes}, {messages}, {root!r})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parent)])}
    # cwd = the tree: "python -c" puts the working directory first on the path.
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _kinds(ctx: BenchContext, n: int) -> tuple[Table, dict[str, Any]]:
    import numpy as np

    from engram_api.storage.faiss.files import VectorStore
    from engram_api.versions import Stamp

    dim, rng = 384, np.random.default_rng(15)
    topics = rng.standard_normal((150, dim)).astype(np.float32)
    x = topics[rng.integers(0, 150, n)] + 0.4 * rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries = x[rng.integers(0, n, 200)] + 0.3 * rng.standard_normal((200, dim)).astype(np.float32)
    built = {}
    for name, flat_max in (("flat", n), ("ivf-sq8", n - 1)):
        store = VectorStore(root=ctx.workdir / f"kinds-{name}", dim=dim, flat_max=flat_max)
        index = store.new()
        index.upsert((f"f{i}", "fact", v) for i, v in enumerate(x))
        index.stamp = Stamp(1, 1)
        t = time.perf_counter()
        built[name] = (store.save("u", index), time.perf_counter() - t)
    ms: dict[str, list[float]] = {"flat": [], "ivf-sq8": []}
    found = 0
    for q in queries:
        hits = {}
        for name, (index, _) in built.items():
            t = time.perf_counter()
            hits[name] = {h.node_id for h in index.search(q, 10)}
            ms[name].append((time.perf_counter() - t) * 1000)
        found += len(hits["flat"] & hits["ivf-sq8"])
    recall = found / (10 * len(queries))
    d_flat, d_ivf = dist(ms["flat"]), dist(ms["ivf-sq8"])
    table = Table(
        f"index kind at {n:,} vectors: top-10 search, {len(queries)} queries (ms)",
        ["kind", "p50", "p95", "build+save s", "recall@10 vs flat"],
    )
    table.add("flat", d_flat["p50"], d_flat["p95"], built["flat"][1], 1.0)
    table.add("ivf-sq8 + exact re-rank", d_ivf["p50"], d_ivf["p95"], built["ivf-sq8"][1], recall)
    return table, {"n": n, "recall_at_10": recall, "flat_ms": d_flat, "ivf_ms": d_ivf}


def run(ctx: BenchContext) -> BenchResult:
    large = ctx.size(10_000, 100_000)
    messages = ctx.size(200, 1_000)
    sizes = [SMALL, large]
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    trees = {"before (whole-file rewrite)": _tree_before(ctx.workdir), "after (delta log)": REPO}
    table = Table(
        f"index update per message (5 vectors added), {messages} messages per user, interleaved (ms)",
        ["code", f"{SMALL} p50", f"{large:,} p50", "ratio p50", f"{SMALL} mean", f"{large:,} mean", "ratio mean"],
    )
    summary: dict[str, Any] = {"load_avg_1min": os.getloadavg()[0], "sizes": sizes, "messages": messages}
    for name, tree in trees.items():
        ctx.log(f"update cost: {name} (load {os.getloadavg()[0]:.1f})")
        measured = _run_tree(tree, sizes, messages, ctx.workdir)
        times = measured["times"]
        small, big = dist(times[str(SMALL)]), dist(times[str(large)])
        table.add(
            name, small["p50"], big["p50"], ratio(big["p50"], small["p50"]),
            small["mean"], big["mean"], ratio(big["mean"], small["mean"]),
        )  # fmt: skip
        summary[name] = {"small_ms": small, "large_ms": big, "ratio_p50": ratio(big["p50"], small["p50"])}
        if "compaction_ms" in measured:
            every, cost = measured["messages_per_compaction"], measured["compaction_ms"]
            summary["compaction"] = {"large_ms": cost, "every_messages": every, "amortized_ms": cost / every}
    ctx.log("index kinds: recall and search time")
    kinds, summary["kinds"] = _kinds(ctx, large)
    comp = summary.get("compaction", {})
    return BenchResult(
        bench="vectors",
        summary=summary,
        tables=[table, kinds],
        notes=[
            f"load average {summary['load_avg_1min']:.1f} (1 min) at the start; ratios are within one process",
            "mean includes the compactions that ran (the log is folded into the file when it passes "
            "max(index_log_compact_bytes, index_log_compact_ratio x file)); p50 is the append alone",
            f"one compaction of the {large:,}-vector user: {comp.get('large_ms', 0):.0f} ms, due every "
            f"~{comp.get('every_messages', 0):.0f} such messages: {comp.get('amortized_ms', 0):.2f} ms per message",
        ],
    )
