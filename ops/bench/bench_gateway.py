"""The gateway (``engram serve``) against the library, in the same run on the same Redis and store.

- Enqueue latency: ``POST /v1/messages`` over loopback HTTP (keep-alive httpx client, real API key) vs
  ``MemoryClient.enqueue`` in process, in alternating blocks so drift on a shared machine hits both alike.
- Enqueue throughput: the same number of messages from ``_THREADS`` client threads, HTTP vs library.
- Recall latency: ``POST /v1/users/{id}/recall`` vs ``MemoryClient.recall`` on one user's ingested memory,
  alternating, every query distinct (no result cache answers either path).

The gateway is one uvicorn process; the question is whether it becomes the bottleneck in front of Redis
(no worker runs while enqueues are measured; the queue is cleared before workers ingest the recall user).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import UTC, datetime

from benchlib import BenchContext, BenchResult, Table, dist, ratio, start_workers

_BLOCK = 100
_THREADS = 8
_TEXT = (
    "I just moved to Austin last week and started a new job at a robotics startup downtown. "
    "My sister Maya is visiting next month, so I'm looking for a good barbecue place."
)


def _rate(total: int, threads: int, send: object) -> float:
    """Messages per second when ``threads`` threads each call ``send(thread, i)`` for their share."""
    per = total // threads
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        start.wait()
        for i in range(per):
            send(t, i)  # type: ignore[operator]

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    return per * threads / (time.perf_counter() - t0)


def run(ctx: BenchContext) -> BenchResult:
    import corpus
    import httpx

    from engram_api import keys
    from engram_gateway.auth import mint_key
    from engram_workers.services.celery_worker import ManagedProcess
    from tests.support.gateway import free_port

    n = ctx.size(1_000, 5_000)
    n_rate = ctx.size(2_000, 10_000)
    n_recall = ctx.size(150, 1_000)
    n_memories = ctx.size(60, 300)
    when = datetime(2024, 5, 1, tzinfo=UTC)
    key, spec = mint_key("bench", ["read", "write"], "bench")
    user = f"bench.{ctx.uid('gw')}"
    pc = time.perf_counter_ns

    with ctx.stack("gateway", llm=False, neo4j=False) as stack:
        env = {**stack.env, "ENGRAM_API_KEYS": json.dumps([spec.model_dump(mode="json")])}
        port = free_port()
        argv = [sys.executable, "-m", "engram_workers.cli", "serve", "--port", str(port)]
        proc = ManagedProcess(name="gateway", argv=argv, env=env, log_dir=stack.data_dir / "logs").start()
        try:
            proc.wait_for_log("Application startup complete", timeout=180)
            base = f"http://127.0.0.1:{port}"
            headers = {"Authorization": f"Bearer {key}"}
            client = stack.client
            http = httpx.Client(base_url=base, headers=headers, timeout=60)

            def via_http(mid: str, h: httpx.Client = http) -> None:
                r = h.post("/v1/messages", json={"user_id": user, "messages": _TEXT, "message_id": mid,
                                                  "timestamp": when.isoformat()})  # fmt: skip
                assert r.status_code == 202, r.text

            def via_lib(mid: str) -> None:
                client.enqueue(user, _TEXT, message_id=mid, timestamp=when)

            for i in range(50):  # warm both paths (connections, Lua script, route compilation)
                via_http(f"warm-h{i}")
                via_lib(f"warm-l{i}")
            ctx.log(f"enqueue latency: {n} calls each way")
            lat_http: list[float] = []
            lat_lib: list[float] = []
            for block in range(0, n, _BLOCK):
                for i in range(block, min(block + _BLOCK, n)):
                    t = pc()
                    via_http(f"h-{i}")
                    lat_http.append((pc() - t) / 1e6)
                for i in range(block, min(block + _BLOCK, n)):
                    t = pc()
                    via_lib(f"l-{i}")
                    lat_lib.append((pc() - t) / 1e6)

            ctx.log(f"enqueue throughput: {n_rate} messages each way, {_THREADS} threads")
            clients = [httpx.Client(base_url=base, headers=headers, timeout=60) for _ in range(_THREADS)]
            rate_http = _rate(n_rate, _THREADS, lambda t, i: via_http(f"rh-{t}-{i}", clients[t]))
            rate_lib = _rate(n_rate, _THREADS, lambda t, i: via_lib(f"rl-{t}-{i}"))
            for c in clients:
                c.close()
            client.redis.delete(keys.EXTRACT_QUEUE)  # the workers must not chew through the bench messages

            ctx.log(f"recall: ingesting {n_memories} messages, then {n_recall} queries each way")
            start_workers(stack, extract_concurrency=8, apply_concurrency=1)
            reader_user = f"bench.{ctx.uid('gwr')}"
            receipts = [
                client.enqueue(reader_user, m.text, message_id=f"r{m.index}", timestamp=m.timestamp)
                for m in corpus.messages("gateway", n_memories)
            ]
            client.wait(receipts, timeout=600)
            queries = corpus.queries("gateway", 2 * n_recall)
            client.recall(reader_user, "warm up", 10)
            http.post(f"/v1/users/{reader_user}/recall", json={"query": "warm up"})
            rec_http: list[float] = []
            rec_lib: list[float] = []
            for i in range(n_recall):
                t = pc()
                r = http.post(f"/v1/users/{reader_user}/recall", json={"query": queries[2 * i], "k": 10})
                rec_http.append((pc() - t) / 1e6)
                assert r.status_code == 200, r.text
                t = pc()
                client.recall(reader_user, queries[2 * i + 1], 10)
                rec_lib.append((pc() - t) / 1e6)
            http.close()
        finally:
            proc.stop()

    d_h, d_l, r_h, r_l = dist(lat_http), dist(lat_lib), dist(rec_http), dist(rec_lib)
    enq = Table(f"enqueue latency, {n} calls each (ms)", ["path", "p50", "p95", "p99", "mean"])
    enq.add("HTTP POST /v1/messages", d_h["p50"], d_h["p95"], d_h["p99"], d_h["mean"])
    enq.add("MemoryClient.enqueue (in process)", d_l["p50"], d_l["p95"], d_l["p99"], d_l["mean"])
    rate = Table(f"enqueue throughput, {n_rate} messages from {_THREADS} threads", ["path", "messages/s"])
    rate.add("HTTP (one uvicorn process)", rate_http)
    rate.add("MemoryClient.enqueue (in process)", rate_lib)
    rec = Table(
        f"recall latency, {n_recall} distinct queries each, {n_memories} messages ingested (ms)",
        ["path", "p50", "p95", "p99", "mean"],
    )
    rec.add("HTTP POST /v1/users/{id}/recall", r_h["p50"], r_h["p95"], r_h["p99"], r_h["mean"])
    rec.add("MemoryClient.recall (in process)", r_l["p50"], r_l["p95"], r_l["p99"], r_l["mean"])
    return BenchResult(
        bench="gateway",
        summary={
            "enqueue_http_ms": d_h,
            "enqueue_library_ms": d_l,
            "enqueue_p50_ratio": ratio(d_h["p50"], d_l["p50"]),
            "enqueue_http_per_s": rate_http,
            "enqueue_library_per_s": rate_lib,
            "recall_http_ms": r_h,
            "recall_library_ms": r_l,
            "recall_p50_overhead_ms": r_h["p50"] - r_l["p50"],
        },
        tables=[enq, rate, rec],
        notes=[
            "same run, same Redis (AOF on) and SQLite store; the client, the gateway and Redis share the machine",
            f"enqueue p50 ratio HTTP / library = {ratio(d_h['p50'], d_l['p50']):.2f}x",
        ],
    )
