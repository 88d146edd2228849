"""Enqueue latency: ``MemoryClient.enqueue`` against a real Redis vs a bare redis-py LPUSH.

The baseline pushes a payload as large as the Celery message our enqueue leaves on the queue, through the
producer's own redis-py client (so the same connection pool and socket settings), on the same server, in
the same run. The two are measured in alternating blocks so that drift on a shared machine hits both
alike. Where the time goes is printed beside: Redis' own time per call of each (``INFO commandstats``),
the rest being the client's Python and the round trip. Targets: p99 <= 2 ms and p50 ratio <= 3.
The messages go to ``_USERS`` users in turn, each under the default backlog limit
(``ENGRAM_MAX_PENDING_PER_USER``, 10,000): the limit is checked by every enqueue, and refuses none.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from benchlib import BenchContext, BenchResult, Table, dist, ratio

P99_TARGET_MS = 2.0
RATIO_TARGET = 3.0
_BLOCK = 250
_USERS = 8
_TEXT = (
    "I just moved to Austin last week and started a new job at a robotics startup downtown. "
    "My sister Maya is visiting next month, so I'm looking for a good barbecue place and a quiet "
    "running trail near the river. Also, remind me that I switched from coffee to green tea."
)


def run(ctx: BenchContext) -> BenchResult:
    from engram_api import MemoryClient, keys
    from engram_api.producer import build_envelope
    from engram_api.settings import Settings

    n = ctx.size(2_000, 10_000)
    url = ctx.services.redis_url.rsplit("/", 1)[0] + "/0"
    settings = Settings(redis_url=url, data_dir=ctx.workdir / "enqueue")
    client = MemoryClient(settings=settings, redis_url=url)
    bare = client.redis  # the baseline's client is the producer's own
    bare.flushdb()
    when = datetime(2024, 5, 1, tzinfo=UTC)
    users = [ctx.uid(f"enq{k}") for k in range(_USERS)]

    # Warm up both paths (connection pools, Lua script load, Celery producer set-up).
    for i in range(50):
        client.enqueue(users[i % _USERS], _TEXT, message_id=f"warm-{i}", timestamp=when)
    payload = bare.lindex(keys.EXTRACT_QUEUE, 0)
    assert payload is not None, "enqueue left nothing on the extract queue"
    body = b"x" * len(payload)
    for _ in range(50):
        bare.lpush("bench:baseline", body)

    ours: list[float] = []
    base: list[float] = []
    pc = time.perf_counter_ns
    for block in range(0, n, _BLOCK):
        size = min(_BLOCK, n - block)
        for _ in range(size):
            t = pc()
            bare.lpush("bench:baseline", body)
            base.append((pc() - t) / 1e6)
        for i in range(block, block + size):
            t = pc()
            client.enqueue(users[i % _USERS], _TEXT, message_id=f"m-{i}", timestamp=when)
            ours.append((pc() - t) / 1e6)

    # Where the time goes: validation alone (no I/O), and Redis commands per enqueue.
    validate: list[float] = []
    for i in range(min(n, 2_000)):
        t = pc()
        build_envelope(settings, users[i % _USERS], _TEXT, message_id=f"v-{i}", timestamp=when)
        validate.append((pc() - t) / 1e6)
    bare.config_resetstat()
    probe = 200
    for i in range(probe):
        client.enqueue(users[i % _USERS], _TEXT, message_id=f"probe-{i}", timestamp=when)
    stats = bare.info("commandstats")
    per_call = {k.removeprefix("cmdstat_"): v["calls"] / probe for k, v in stats.items() if v["calls"] >= probe}
    per_call.pop("config", None)
    server_us = {"MemoryClient.enqueue": stats["cmdstat_evalsha"]["usec_per_call"]}
    bare.config_resetstat()
    for _ in range(probe):
        bare.lpush("bench:baseline", body)
    server_us["redis-py LPUSH (baseline)"] = bare.info("commandstats")["cmdstat_lpush"]["usec_per_call"]
    bare.flushdb()
    client.close()

    d_ours, d_base, d_val = dist(ours), dist(base), dist(validate)
    p50_ratio = ratio(d_ours["p50"], d_base["p50"])
    p99_ratio = ratio(d_ours["p99"], d_base["p99"])
    table = Table(
        f"enqueue latency, {n} calls each, message {len(_TEXT)} chars (ms)",
        ["path", "p50", "p95", "p99", "mean"],
        caption=f"baseline payload = {len(body)} bytes, the size of the Celery message our enqueue pushes",
    )
    table.add("MemoryClient.enqueue", d_ours["p50"], d_ours["p95"], d_ours["p99"], d_ours["mean"])
    table.add("redis-py LPUSH (baseline)", d_base["p50"], d_base["p95"], d_base["p99"], d_base["mean"])
    table.add("build_envelope only (no I/O)", d_val["p50"], d_val["p95"], d_val["p99"], d_val["mean"])
    server = Table(
        "Redis' own time per call (INFO commandstats over 200 calls, µs)",
        ["path", "usec_per_call"],
        rows=[[k, v] for k, v in server_us.items()],
        caption="the script's time includes its commands'; the rest of a call is the client and the round trip",
    )
    targets = Table("enqueue targets", ["target", "measured", "met"])
    targets.add(f"p99 <= {P99_TARGET_MS} ms", f"{d_ours['p99']:.3f} ms", d_ours["p99"] <= P99_TARGET_MS)
    targets.add(f"p50 ratio to LPUSH <= {RATIO_TARGET}", f"{p50_ratio:.2f}x", p50_ratio <= RATIO_TARGET)
    targets.add("p99 ratio to LPUSH (info)", f"{p99_ratio:.2f}x", "-")
    commands = Table(
        "Redis commands per enqueue (INFO commandstats over 200 calls)",
        ["command", "calls per enqueue"],
        rows=[[k, v] for k, v in sorted(per_call.items())],
    )
    return BenchResult(
        bench="enqueue",
        summary={
            "n": n,
            "enqueue_ms": d_ours,
            "lpush_ms": d_base,
            "validate_ms": d_val,
            "payload_bytes": len(body),
            "ratio_p50": p50_ratio,
            "ratio_p99": p99_ratio,
            "redis_commands_per_enqueue": per_call,
            "redis_usec_per_call": server_us,
            "target_p99_met": d_ours["p99"] <= P99_TARGET_MS,
            "target_ratio_met": p50_ratio <= RATIO_TARGET,
        },
        tables=[table, targets, commands, server],
        notes=["ratio = MemoryClient.enqueue p50 / LPUSH p50, both measured in alternating blocks in this run"],
    )
