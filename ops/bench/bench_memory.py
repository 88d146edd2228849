"""Peak memory of an apply worker (prefork: main process and pool children) and of a reader process.

Peak RSS is the kernel's high-water mark (VmHWM in /proc/PID/status); USS (memory unique to the process,
via psutil) says how much of it is not shared libraries or copy-on-write pages. The baseline is a process
that only loads the embedding model: every Engram process that embeds pays that much.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_ingest import scripted_responder
from benchlib import BenchContext, BenchResult, Table, proc_memory, ratio, start_workers
from bulk import bulk_load
from corpus import messages


def _probe(stack: Any, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("reader_probe.py")), *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(ctx: BenchContext) -> BenchResult:
    import psutil

    n_msgs, n_users = ctx.size(60, 400), 3
    big = ctx.size(2_000, 10_000)
    msgs = list(messages("memory", n_msgs))
    llm = ctx.services.llm
    llm.reset()
    llm.script(scripted_responder({m.text: m.extraction for m in msgs}))
    users = [ctx.uid(f"mem{u}") for u in range(n_users)]
    table = Table(
        "memory per process (MiB)", ["process", "peak RSS", "RSS at end", "USS at end", "peak RSS / model-only"]
    )
    summary: dict[str, Any] = {}
    with ctx.stack("memory", llm=True) as stack:
        start_workers(stack, extract_concurrency=8)
        ctx.log(f"memory: {n_msgs} messages over {n_users} users through the pipeline")
        receipts = stack.client.enqueue_many(
            [
                {
                    "user_id": users[m.index % n_users],
                    "messages": m.text,
                    "message_id": f"m{m.index}",
                    "timestamp": m.timestamp,
                }
                for m in msgs
            ]
        )
        stack.client.wait(receipts, timeout=1800)
        ctx.log(f"memory: bulk-loading a {big}-fact user for the reader")
        big_user = ctx.uid("mem-big")
        reader = stack.client.reader
        bulk_load(
            stack.client.graph, reader.keeper, reader.embedder, stack.client.redis, big_user, big, str(big), out=ctx.out
        )
        floor = _probe(stack, "none", "--model-only")["final"]
        summary["model_only"] = floor
        table.add("model only (baseline)", floor["peak_rss_mib"], floor["rss_mib"], floor["uss_mib"], 1.0)
        for proc in stack.workers:
            main = psutil.Process(proc.pid)
            for p in [main, *main.children(recursive=True)]:
                role = "main" if p.pid == proc.pid else "pool child"
                got = proc_memory(p.pid)
                label = f"{proc.name.split('-')[0]} worker {role} (pid {p.pid})"
                summary[label] = got
                table.add(
                    label,
                    got["peak_rss_mib"],
                    got["rss_mib"],
                    got["uss_mib"],
                    ratio(got["peak_rss_mib"], floor["peak_rss_mib"]),
                )
        ctx.log("memory: reader process")
        probe = _probe(stack, *users, big_user, "--queries", str(ctx.size(20, 100)))
        for user, got in probe["after_user"].items():
            label = f"reader after recalls of {'the ' + str(big) + '-fact user' if user == big_user else user}"
            table.add(
                label,
                got["peak_rss_mib"],
                got["rss_mib"],
                got["uss_mib"],
                ratio(got["peak_rss_mib"], floor["peak_rss_mib"]),
            )
        summary["reader"] = probe
    llm.reset()
    return BenchResult(
        bench="memory",
        summary=summary,
        tables=[table],
        notes=[
            "apply worker: prefork, 2 pool children; each child loads torch + MiniLM after the fork",
            "reader: a fresh process (reader_probe.py) recalling for each user in turn; its FAISS indexes "
            "stay cached in IndexKeeper for the life of the process",
            "RSS counts shared library pages in every process; USS does not",
            "the extract worker loads the model only for its slim-context lookup of a user who already has "
            "memories; with the stand-in at 0 s a burst is extracted before the first apply, so here it may not",
        ],
    )
