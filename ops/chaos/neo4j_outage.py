"""Scenario 3 — Neo4j outage: the graph store is stopped mid-run and started again (same port and data).

While it is down every stage that touches the graph fails with ``StoreUnavailableError``; the pipeline must
wait it out (apply: ``RetryLater`` with back-off, up to ~40 tries capped at 15 s each) rather than give
up. Proves: nothing dead-lettered, nothing lost or duplicated, and everything lands once Neo4j is back.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from harness import (
    APPLY_WORKER,
    EXTRACT_WORKER,
    AppliedMonitor,
    ScenarioResult,
    Services,
    Workload,
    audit,
    enqueue_paced,
    fleet,
    settle,
    start_workers,
    warm_up,
)

from engram_api import keys
from engram_api.models import Receipt

NAME = "Neo4j outage"


@dataclass(frozen=True)
class Params:
    users: int = 20
    per_user: int = 15
    produce_s: float = 45.0
    down_s: float = 30.0
    settle_timeout_s: float = 600.0


FULL = Params()
QUICK = Params(users=6, per_user=10, produce_s=15.0, down_s=10.0, settle_timeout_s=150.0)


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    if services.neo4j is None:
        raise RuntimeError("the Neo4j outage scenario needs a Neo4jServer it may stop and start")
    result = ScenarioResult(NAME)
    begun = time.monotonic()
    work = Workload(f"neo{os.getpid()}", users=params.users, per_user=params.per_user)
    services.llm.reset()
    services.llm.latency_s = 0.02
    with fleet(services, "neo4j-outage") as stack:
        client = stack.client
        start_workers(stack, {"extract": {**EXTRACT_WORKER, "concurrency": 8}, "apply": APPLY_WORKER})
        warm_up(stack, services.llm, work.reply)

        receipts: list[Receipt] = []
        monitor = AppliedMonitor(client, lambda: [(r.user_id, r.message_id) for r in receipts])
        producer = threading.Thread(
            target=enqueue_paced, args=(client, work.messages, receipts), kwargs={"seconds": params.produce_s}
        )
        monitor.start()
        producer.start()

        time.sleep(params.produce_s * 0.3)
        try:
            services.neo4j.stop()
            down_at = time.monotonic()
            time.sleep(params.down_s)
        finally:
            # Whatever interrupts the outage (a timeout, Ctrl-C), the shared Neo4j comes back.
            services.neo4j.start()
        up_at = time.monotonic()

        producer.join()
        tally = settle(client, receipts, timeout=params.settle_timeout_s)
        settled_at = time.monotonic()
        monitor.stop()
        result.count(tally, audit(client, work.users))

        pipe = client.redis.pipeline(transaction=False)
        for r in receipts:
            pipe.hmget(keys.status(r.user_id, r.message_id), "store_attempts", "extract_errors", "apply_errors")
        counters = [[int(v or 0) for v in row] for row in pipe.execute()]
        resumed = monitor.resumed_after(up_at)
        result.checks["nothing dead-lettered"] = not tally.dead
        result.checks["applied again after Neo4j returned"] = resumed is not None
        result.metrics.update(
            neo4j_down_s=round(up_at - down_at, 1),
            max_apply_store_retries=max((c[0] for c in counters), default=0),
            messages_with_unexpected_errors=sum(1 for c in counters if c[1] or c[2]),
            applied_again_after_restart_s=round(resumed, 1) if resumed is not None else None,
            drain_after_restart_s=round(settled_at - up_at, 1),
        )
        reasons = sorted({d.reason.splitlines()[0][:160] for d in client.dead_letters() if d.message_id in tally.dead})
        result.notes += [f"dead-letter reason: {r}" for r in reasons[:3]]
    result.seconds = round(time.monotonic() - begun, 1)
    return result
