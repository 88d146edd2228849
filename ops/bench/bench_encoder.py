"""Encoder: ONNX Runtime (the default backend) vs sentence-transformers on torch, same weights, same run.

Both encoders load the bundled MiniLM in this process on one thread (as each worker process does). The
single-query figures alternate blocks between the two so machine drift hits both alike; the batch figure
is the apply stage's shape (a message's texts embedded together). Vectors are compared on every text.
Also printed: the query cache's hit cost and a fresh process's start-up until its first vector, with the
export already cached (the reader and CLI case).
"""

from __future__ import annotations

import subprocess
import sys
import time

from benchlib import BenchContext, BenchResult, Table, dist, ratio

_QUERIES = [
    "where does the user live?",
    "what does my brother do for a living?",
    "When did Caroline go to the LGBTQ support group?",
    "favourite food",
    "Which city did Melanie visit with her kids last summer, and what did they see there?",
    "books",
]
_PASSAGE = (
    "I just moved to Austin last week and started a new job at a robotics startup downtown. "
    "My sister Maya is visiting next month, so I'm looking for a good barbecue place."
)
_FRESH = (
    "import time; t = time.perf_counter(); import sys; from engram_api.storage.embedding.embedder import Embedder; "
    "e = Embedder(model='all-MiniLM-L6-v2', backend='{backend}'); e.encode_one('warm up'); "
    "print(time.perf_counter() - t, e.backend, 'torch' in sys.modules)"
)


def _fresh_process(backend: str) -> tuple[float, str, bool]:
    out = subprocess.run([sys.executable, "-c", _FRESH.format(backend=backend)], capture_output=True, text=True)
    seconds, name, torch_loaded = out.stdout.split()
    return float(seconds), name, torch_loaded == "True"


def run(ctx: BenchContext) -> BenchResult:
    import numpy as np

    from engram_api.storage.embedding.embedder import Embedder

    onnx = Embedder(model="all-MiniLM-L6-v2", backend="onnx", query_cache_size=0)
    torch = Embedder(model="all-MiniLM-L6-v2", backend="torch", query_cache_size=0)
    batch = [f"{_PASSAGE} ({i})" for i in range(32)]
    for enc in (onnx, torch):
        enc.encode(_QUERIES + batch)  # load and warm up

    rounds = ctx.size(20, 100)
    times: dict[str, list[float]] = {"onnx": [], "torch": []}
    batch_times: dict[str, list[float]] = {"onnx": [], "torch": []}
    pc = time.perf_counter
    for _ in range(rounds):
        for name, enc in (("onnx", onnx), ("torch", torch)):
            for q in _QUERIES:
                t = pc()
                enc.encode([q])
                times[name].append((pc() - t) * 1000)
            t = pc()
            enc.encode(batch)
            batch_times[name].append((pc() - t) * 1000)

    texts = _QUERIES + batch
    cosines = (onnx.encode(texts) * torch.encode(texts)).sum(axis=1)
    cached = Embedder(model="all-MiniLM-L6-v2", backend="onnx")
    cached.encode_one(_QUERIES[0])
    hits: list[float] = []
    for _ in range(1_000):
        t = pc()
        cached.encode_one(_QUERIES[0])
        hits.append((pc() - t) * 1000)

    d_on, d_to = dist(times["onnx"]), dist(times["torch"])
    b_on, b_to = dist(batch_times["onnx"]), dist(batch_times["torch"])
    d_hit = dist(hits)
    table = Table(
        f"one query, {len(times['onnx'])} encodes each, one thread (ms)", ["encoder", "p50", "p95", "p99", "mean"]
    )
    table.add("ONNX Runtime (default)", d_on["p50"], d_on["p95"], d_on["p99"], d_on["mean"])
    table.add("sentence-transformers on torch", d_to["p50"], d_to["p95"], d_to["p99"], d_to["mean"])
    btable = Table(f"a batch of {len(batch)} passages (ms)", ["encoder", "p50", "p95", "mean"])
    btable.add("ONNX Runtime", b_on["p50"], b_on["p95"], b_on["mean"])
    btable.add("torch", b_to["p50"], b_to["p95"], b_to["mean"])

    starts = Table(
        "fresh process until its first query vector (export cached)", ["backend", "seconds", "imports torch"]
    )
    fresh = {}
    for backend in ("onnx", "torch"):
        seconds, name, torch_loaded = _fresh_process(backend)
        fresh[backend] = seconds
        starts.add(name, seconds, torch_loaded)
    return BenchResult(
        bench="encoder",
        summary={
            "query_ms": {"onnx": d_on, "torch": d_to, "cache_hit": d_hit},
            "batch32_ms": {"onnx": b_on, "torch": b_to},
            "query_ratio_p50": ratio(d_on["p50"], d_to["p50"]),
            "batch_ratio_p50": ratio(b_on["p50"], b_to["p50"]),
            "min_cosine": float(np.min(cosines)),
            "fresh_process_s": fresh,
        },
        tables=[table, btable, starts],
        notes=[
            f"ONNX / torch p50: one query {ratio(d_on['p50'], d_to['p50']):.2f}x, "
            f"batch {ratio(b_on['p50'], b_to['p50']):.2f}x; min cosine over {len(texts)} texts "
            f"{float(np.min(cosines)):.6f}",
            f"query cache hit p50 {d_hit['p50'] * 1000:.1f} µs, p99 {d_hit['p99'] * 1000:.1f} µs",
        ],
    )
