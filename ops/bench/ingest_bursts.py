"""Bursts of messages through the real pipeline for the ingest benchmark, and what each one measured.

A burst enqueues its messages at once and waits for every one; its figures come from the message status
hashes (``enqueued_at``/``applied_at`` and ``stage_timer.StageTimer``'s stage seconds) and from differences
of counters read just before its first enqueue and just after its last message is applied (worker and
server CPU, Redis commands, the wait's own status reads taken off). The stand-in must have the burst's
label scripted (``scripted_responder`` over ``corpus.messages`` of that label). Warm-ups are bursts whose
figures are thrown away: they load a fresh worker's encoder and litellm, or warm a fresh Neo4j's JIT.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from benchlib import BenchContext, command_calls, cpu_seconds, dist, seconds_to_ms, status_rows
from corpus import messages

_FIELDS = ("enqueued_at", "applied_at", "bench_extract_s", "bench_apply_s")


def scripted_responder(texts: dict[str, dict[str, Any]]):  # type: ignore[no-untyped-def]
    """The stand-in's answer for a prompt: the scripted extraction of the message text in it."""
    from engram_testing.llm_standin import Reply
    from tests.support.extractions import message_text

    def respond(request: dict[str, Any]) -> Reply:
        return Reply.json(texts.get(message_text(request), {"entities": [], "facts": []}))

    return respond


def _apply_retries(stack: Any) -> int:
    """Apply tasks re-queued because another process held the user's lock (from the worker log)."""
    return sum(
        p.log_path.read_text(errors="replace").count("another worker is applying")
        for p in stack.workers
        if p.name.startswith("apply") and p.log_path.exists()
    )


def _burst(ctx: BenchContext, stack: Any, label: str, n: int, users: int) -> dict[str, Any]:
    """Enqueue ``n`` messages over ``users`` users at once and wait for all of them."""
    uids = [ctx.uid(f"{label}-u{u}") for u in range(users)]
    items = [
        {"user_id": uids[m.index % users], "messages": m.text, "message_id": f"m{m.index}", "timestamp": m.timestamp}
        for m in messages(label, n)
    ]
    retries_before = _apply_retries(stack)
    ours = [p.pid for p in stack.workers if p.name.startswith(("extract", "apply"))]
    servers = ctx.services.server_pids()
    cpu_before = cpu_seconds(ours), {name: cpu_seconds([pid]) for name, pid in servers.items()}
    calls_before = command_calls(stack.client.redis)
    start = time.time()
    receipts = []
    for lo in range(0, len(items), 500):
        receipts += stack.client.enqueue_many(items[lo : lo + 500])
    polled = [n]  # the statuses each poll of the wait reads: those still pending after the poll before

    def progress(finished: int, total: int) -> None:
        polled.append(total - finished)

    result = stack.client.wait(receipts, timeout=600 + n, on_progress=progress)
    calls = command_calls(stack.client.redis, since=calls_before)
    calls["hget"] -= sum(polled[:-1])  # the wait's own reads: the bench's, not the pipeline's
    ours_s = cpu_seconds(ours) - cpu_before[0]
    servers_s = {name: cpu_seconds([pid]) - cpu_before[1][name] for name, pid in servers.items()}
    rows = status_rows(stack, [(r.user_id, r.message_id) for r in receipts], fields=_FIELDS)
    end = max(r["applied_at"] for r in rows)
    return {
        "n": n,
        "users": users,
        "dead": len(result.dead_lettered),
        "msgs_per_s": n / (end - start),
        "e2a_ms": dist(seconds_to_ms([r["applied_at"] - r["enqueued_at"] for r in rows])),
        "extract_s": [r["bench_extract_s"] for r in rows],
        "apply_ms": dist(seconds_to_ms([r["bench_apply_s"] for r in rows])),
        "lock_retries": _apply_retries(stack) - retries_before,
        "worker_processes": len(ours),
        "our_cpu_ms_per_msg": ours_s / n * 1e3,
        "server_cpu_ms_per_msg": {name: seconds / n * 1e3 for name, seconds in servers_s.items()},
        "redis_commands_per_msg": sum(calls.values()) / n,
        "top_redis_commands_per_msg": {c: round(k / n, 2) for c, k in calls.most_common(16)},
    }


def _measured_burst(
    ctx: BenchContext, stack: Any, label: str, n: int, users: int, latency: float, **setup: int
) -> dict[str, Any]:
    """``_burst`` with the stand-in at ``latency`` seconds, its extract time less that latency, and the
    worker setup (``setup``: thread and process counts) recorded with the result."""
    ctx.services.llm.latency_s = latency
    workers = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in setup.items())
    ctx.log(f"ingest burst {label}: latency {latency} s, {workers}, {n} messages / {users} users")
    got = _burst(ctx, stack, label, n, users)
    own_extract = dist(seconds_to_ms([s - latency for s in got.pop("extract_s") if s == s]))
    return got | setup | {"latency_s": latency, "extract_minus_llm_ms": own_extract}


_WARM_UPS = 16  # labels scripted for warm-up bursts: more than the restarts of a full run


def _warm_up(ctx: BenchContext, stack: Any, count: itertools.count[int], processes: int) -> None:
    """An unmeasured burst at 0 s latency after workers (re)start: a fresh worker loads its encoder and
    litellm on its first tasks, CPU that is no message's cost. Eight messages per extract process over
    eight users reach each process and apply pool child in practice (not guaranteed: the brokers hand out
    the tasks)."""
    label = f"warm{next(count)}"
    ctx.services.llm.latency_s = 0.0
    ctx.log(f"ingest warm-up {label}: {8 * processes} messages")
    _burst(ctx, stack, label, 8 * processes, 8)


# The quick run's warm-up of a fresh Neo4j server's JVM (see ``_warm_server``): messages, users.
_SERVER_WARM_UP = (1_000, 50)
_SERVER_NOTE = [
    "quick on Neo4j: an unmeasured 0 s burst of 1,000 messages warms the fresh server's JVM before the first "
    "64-thread burst (a cold JIT costs the server several times the CPU a message)"
]


def _warm_server(ctx: BenchContext, stack: Any) -> None:
    """Quick run on Neo4j only: an unmeasured 0 s burst of 1,000 messages through the 64-thread extract
    worker before its first measured burst. A fresh JVM spends several times the CPU a transaction until its
    JIT has compiled Neo4j's hot paths: measured 2026-12-05, the quick target burst, after ~250 messages,
    cost the server 44 ms a message; the full run's, after 8,000, 10 ms. Without it the quick figure
    measures the server's warm-up, not the pipeline; a production server runs warm. (SQLite has no JIT.)"""
    n, users = _SERVER_WARM_UP
    ctx.services.llm.latency_s = 0.0
    ctx.log(f"ingest server warm-up: {n} messages / {users} users")
    _burst(ctx, stack, "warm-server", n, users)


def _one_at_a_time(ctx: BenchContext, stack: Any, label: str, n: int) -> dict[str, float]:
    """Enqueue-to-applied with an idle pipeline: each message waits for the previous one."""
    uid = ctx.uid(f"{label}-seq")
    pairs = []
    for m in messages(label, n):
        receipt = stack.client.enqueue(uid, m.text, message_id=f"m{m.index}", timestamp=m.timestamp)
        stack.client.wait(receipt, timeout=120)
        pairs.append((uid, receipt.message_id))
    rows = status_rows(stack, pairs, fields=_FIELDS)
    return dist(seconds_to_ms([r["applied_at"] - r["enqueued_at"] for r in rows]))
