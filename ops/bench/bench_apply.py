"""Apply micro-batching: in-process apply CPU per message with ``apply_batch=1`` vs ``apply_batch=8``.

A backlog of N messages of an existing user is left ready to apply (``bench_ingest.ready_to_apply``:
payload and extraction as the producer and extract leave them, the slim-context vectors carried), then
every message's apply task runs in this process in arrival order (``run_apply`` between the built-in
stage hooks, as in a worker): with batching the first task applies up to 8 and the others' tasks find
their message applied (their cost is counted too, as in the fleet). Measured: this process's CPU seconds
(``time.process_time``: the apply code, the encoder, the drivers; not the Neo4j server's) divided by N.
The two settings alternate round by round on fresh users of the same messages, after an untimed warm-up
of each, so drift in the shared machine's load hits both alike; the figure is the ratio of the medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench_ingest import ready_to_apply
from benchlib import BenchContext, BenchResult, Table, cpu_seconds, ratio
from corpus import messages

_SETTINGS = (1, 8)


def _round(
    stack: Any, extractor: Any, worker: Any, uid: str, n: int, server: int | None
) -> tuple[float, float, float | None]:
    """CPU, wall and Neo4j server CPU seconds (None when the server is not this run's) of applying a
    backlog of ``n`` messages of a fresh user (``server``: the Neo4j server's pid). Untimed: the user's first message, applied alone (an
    existing user: extract's slim context carries the chunk vectors, as in the fleet), and the backlog's
    preparation."""
    from engram_workers.stages.apply import run_apply
    from engram_workers.stages.common import hooked

    first, *backlog = messages("apply-batch", n + 1)
    run_apply(worker, uid, ready_to_apply(stack, extractor, uid, first))
    mids = [ready_to_apply(stack, extractor, uid, m) for m in backlog]
    cpu, wall = time.process_time(), time.perf_counter()
    neo4j = cpu_seconds([server]) if server else 0.0
    for mid in mids:  # each task between the stage hooks, as a worker runs it (batch members pass them too)
        hooked(worker, "apply", run_apply, uid, mid)
    neo4j = cpu_seconds([server]) - neo4j if server else None
    return time.process_time() - cpu, time.perf_counter() - wall, neo4j


def run(ctx: BenchContext) -> BenchResult:
    from engram_workers.resources import WorkerResources

    n, rounds = ctx.size(24, 48), ctx.size(3, 5)
    per_message: dict[int, list[float]] = {b: [] for b in _SETTINGS}
    server_per_message: dict[int, list[float]] = {b: [] for b in _SETTINGS}
    table = Table(
        f"apply stage in-process: a backlog of {n} messages of one user, apply_batch 1 vs 8 alternated",
        ["round", "apply_batch", "CPU ms / message", "wall ms / message", "Neo4j CPU ms / message"],
    )
    with ctx.stack("apply-batch", llm=False) as stack:
        extractor = WorkerResources(settings=stack.settings)
        # The built-in middleware (logging, metrics): the stack's StageTimer is for worker processes.
        workers = {
            b: WorkerResources(settings=stack.settings.model_copy(update={"apply_batch": b, "middleware": ""}))
            for b in _SETTINGS
        }
        server = ctx.services.server_pids().get("neo4j") if stack.settings.neo4j_uri else None
        for b, worker in workers.items():
            _round(stack, extractor, worker, ctx.uid(f"warm-b{b}"), 8, server)  # model, drivers, FAISS: not per message
        for r in range(rounds):
            # ABBA order: neither setting always runs first in a round.
            for b in _SETTINGS if r % 2 == 0 else reversed(_SETTINGS):
                ctx.log(f"apply batch: round {r + 1}/{rounds}, apply_batch={b}, {n} messages")
                cpu, wall, neo4j = _round(stack, extractor, workers[b], ctx.uid(f"r{r}-b{b}"), n, server)
                per_message[b].append(cpu / n * 1e3)
                if neo4j is not None:
                    server_per_message[b].append(neo4j / n * 1e3)
                table.add(r + 1, b, cpu / n * 1e3, wall / n * 1e3, "-" if neo4j is None else neo4j / n * 1e3)
        for worker in (extractor, *workers.values()):
            worker.close()
    medians = {b: statistics.median(v) for b, v in per_message.items()}
    figure = ratio(medians[8], medians[1])
    server = {b: statistics.median(v) if v else None for b, v in server_per_message.items()}
    for b in _SETTINGS:
        table.add("median", b, medians[b], float("nan"), "-" if server[b] is None else server[b])
    ctx.log(f"apply CPU per message, batch 8 / batch 1: {figure:.2f}")
    return BenchResult(
        bench="apply",
        summary={
            "messages": n,
            "rounds": rounds,
            "cpu_ms_per_message": per_message,
            "median_cpu_ms_per_message": medians,
            "neo4j_cpu_ms_per_message": server_per_message,
            "ratio_batch8_to_batch1": figure,
        },
        tables=[table],
        notes=[
            "CPU = time.process_time() of this process over all N apply tasks (the batch's and the ALREADY "
            "answers of the other members' tasks), divided by N; the Neo4j server's CPU is not in it",
            "Neo4j CPU = the server process's user+system CPU over the same tasks (/proc), divided by N; '-' "
            "with a server this run did not start (NEO4J_URI) or on SQLite",
            f"ratio (batch 8 / batch 1, medians of {rounds} rounds each): {figure:.2f}",
        ],
    )
