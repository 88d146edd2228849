"""Scenario 1 — worker SIGKILL: messages keep flowing while worker processes are killed at random.

Each kill is a SIGKILL of either a worker's main process (its pool children are orphaned, its unacked
messages come back only after the broker's visibility timeout; the script restarts the worker) or one
prefork pool child (the main process respawns it and re-queues its message at once, acks_late +
reject_on_worker_lost). Proves: nothing lost, nothing duplicated, and per-user order holds (each user's
LIVES_IN chain follows event time, only the last move is current) however messages were redelivered.
"""

from __future__ import annotations

import random
import statistics
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
    kill_pid,
    pool_children,
    restart_worker,
    settle,
    start_workers,
    warm_up,
)

from engram_api.models import Receipt

NAME = "worker SIGKILL"


@dataclass(frozen=True)
class Params:
    users: int = 50
    per_user: int = 20
    moves: int = 4
    kills: int = 10
    produce_s: float = 90.0  # kills are spread over the production window
    settle_timeout_s: float = 600.0
    seed: int = 1


FULL = Params()
QUICK = Params(users=10, per_user=10, moves=3, kills=3, produce_s=20.0, settle_timeout_s=150.0)


@dataclass
class Kill:
    at: float
    worker: str
    target: str  # "main" or "child"
    pid: int
    hit: bool = False  # the process was alive when the signal was sent
    restart_s: float | None = None


def _kinds(rng: random.Random, n: int) -> list[str]:
    # Both kinds in every run, even a short one; the rest at random.
    return (["child", "main"] + [rng.choice(["child", "main"]) for _ in range(max(0, n - 2))])[:n]


def _children(pid: int, timeout: float = 10.0) -> list[int]:
    """The pool children of ``pid``, waiting while Celery respawns one that an earlier kill took."""
    deadline = time.monotonic() + timeout
    while not (children := pool_children(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not children:
        raise RuntimeError(f"worker {pid} has no pool children after {timeout}s")
    return children


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    result = ScenarioResult(NAME)
    begun = time.monotonic()
    rng = random.Random(params.seed)
    work = Workload(f"kill{rng.randrange(10**6)}", users=params.users, per_user=params.per_user, moves=params.moves)
    services.llm.reset()
    services.llm.latency_s = 0.02

    with fleet(services, "worker-kill") as stack:
        client = stack.client
        workers = start_workers(
            stack, {"extract": {**EXTRACT_WORKER, "concurrency": 8}, "apply-1": APPLY_WORKER, "apply-2": APPLY_WORKER}
        )
        warm_up(stack, services.llm, work.reply)
        started = time.monotonic()
        receipts: list[Receipt] = []
        monitor = AppliedMonitor(client, lambda: [(r.user_id, r.message_id) for r in receipts])
        producer = threading.Thread(
            target=enqueue_paced, args=(client, work.messages, receipts), kwargs={"seconds": params.produce_s}
        )
        monitor.start()
        producer.start()

        kills: list[Kill] = []
        for i, target in enumerate(_kinds(rng, params.kills)):
            due = started + params.produce_s * (i + 1) / (params.kills + 1)
            time.sleep(max(0.0, due - time.monotonic()))
            if target == "child":
                name = rng.choice(["apply-1", "apply-2"])
                pid, orphans = rng.choice(_children(workers[name].pid)), []
            else:
                name = rng.choice(sorted(workers))
                pid, orphans = workers[name].pid, pool_children(workers[name].pid)
            kill = Kill(at=time.monotonic(), worker=name, target=target, pid=pid)
            kill.hit = kill_pid(pid)
            if target == "main":
                kill.restart_s = restart_worker(workers[name], orphans=orphans)
            kills.append(kill)

        producer.join()
        tally = settle(client, receipts, timeout=params.settle_timeout_s)
        settled_at = time.monotonic()
        monitor.stop()
        dup = audit(client, work.users)
        result.count(tally, dup)

        violations = work.order_violations(client, tally.applied)
        result.checks["every kill hit a live process"] = len(kills) == params.kills and all(k.hit for k in kills)
        result.checks["per-user LIVES_IN order"] = not violations
        if violations:
            result.notes.append(f"order violated for {len(violations)} users, e.g. {violations[:2]}")

        resumed = [r for k in kills if (r := monitor.resumed_after(k.at)) is not None]
        restarts = [k.restart_s for k in kills if k.restart_s is not None]
        result.metrics.update(
            kills=f"{len(kills)} ({sum(k.target == 'main' for k in kills)} main, "
            f"{sum(k.target == 'child' for k in kills)} child)",
            throughput_resumed_s_median=round(statistics.median(resumed), 1) if resumed else None,
            throughput_resumed_s_max=round(max(resumed), 1) if resumed else None,
            worker_restart_s_max=round(max(restarts), 1) if restarts else None,
            drain_after_last_kill_s=round(settled_at - kills[-1].at, 1) if kills else None,
        )
        result.details["kills"] = [
            {
                "worker": k.worker,
                "target": k.target,
                "at_s": round(k.at - started, 1),
                "hit": k.hit,
                "restart_s": k.restart_s,
            }
            for k in kills
        ]
    result.seconds = round(time.monotonic() - begun, 1)
    return result
