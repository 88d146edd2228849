"""Scenario 2 — Redis restart: the broker and every piece of pipeline state go away mid-run and come back.

Redis (AOF on, ``appendfsync everysec``) is SIGKILLed while producers enqueue and workers process, kept
down for a while, and started again on the same port from its AOF. Proves: nothing lost or duplicated;
producers get ``StoreUnavailableError`` ("Redis unavailable, nothing enqueued") while it is down and
succeed when they retry with back-off; workers reconnect by themselves, or, when kombu 5.7 crashes one on
the lost connection, a supervisor restarts it as production's restart policy would (the table says how
often). Messages a worker held unacked when Redis died come back after the visibility timeout; a task that
hit the outage mid-way is rejected back onto the queue, never acked.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

from harness import (
    APPLY_WORKER,
    EXTRACT_WORKER,
    AppliedMonitor,
    Message,
    ScenarioResult,
    Services,
    Workload,
    audit,
    enqueue_paced,
    fleet,
    restart_worker,
    settle,
    start_workers,
    warm_up,
)

from engram_api.errors import StoreUnavailableError
from engram_api.models import Receipt
from engram_workers.services import RedisServer
from engram_workers.services.celery_worker import ManagedProcess

NAME = "Redis restart"


@dataclass(frozen=True)
class Params:
    users: int = 20
    per_user: int = 25
    produce_s: float = 40.0
    down_s: float = 10.0
    settle_timeout_s: float = 600.0


FULL = Params()
QUICK = Params(users=6, per_user=10, produce_s=12.0, down_s=4.0, settle_timeout_s=150.0)


class ProducerErrors:
    """What enqueue raised while Redis was down; the producer retries the same message with back-off."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, message: Message, exc: Exception, attempt: int) -> float:
        # The text before the first ':' is Engram's own wording; the rest is the driver's detail.
        with self.lock:
            self.seen[f"{type(exc).__name__}: {str(exc).split(':', 1)[0]}"] += 1
        return min(2.0, 0.1 * 2 ** (attempt - 1))

    @property
    def only_store_unavailable(self) -> bool:
        return all(kind.startswith(f"{StoreUnavailableError.__name__}:") for kind in self.seen)


class Supervisor(threading.Thread):
    """Restarts worker processes that exit, as a process supervisor would in production."""

    def __init__(self, workers: dict[str, ManagedProcess], every: float = 0.5) -> None:
        super().__init__(daemon=True, name="supervisor")
        self.workers = workers
        self.every = every
        self.restarts: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            for name, proc in self.workers.items():
                if not proc.alive():
                    self.restarts.append(name)
                    restart_worker(proc)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=150)


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    result = ScenarioResult(NAME)
    begun = time.monotonic()
    work = Workload(f"redis{os.getpid()}", users=params.users, per_user=params.per_user)
    services.llm.reset()
    # A model that takes a moment to answer, as real ones do: some messages are mid-flight when Redis dies.
    services.llm.latency_s = 0.3
    # A Redis of its own: stopping the shared one would take other users of it down too.
    redis = RedisServer(data_dir=services.work_dir / f"redis-restart-{time.monotonic_ns()}", appendonly=True).start()
    try:
        with fleet(services, "redis-restart", redis_url=redis.url) as stack:
            client = stack.client
            workers = start_workers(stack, {"extract": {**EXTRACT_WORKER, "concurrency": 8}, "apply": APPLY_WORKER})
            warm_up(stack, services.llm, work.reply)
            # kombu 5.7 can crash a worker whose broker connection drops while it holds unacked messages
            # ("Unrecoverable error" closing the channel). Production runs workers under a restart policy
            # (compose `restart: unless-stopped`, systemd); so does this scenario, and it says how often.
            supervisor = Supervisor(workers)
            supervisor.start()

            receipts: list[Receipt] = []
            errors = ProducerErrors()
            monitor = AppliedMonitor(client, lambda: [(r.user_id, r.message_id) for r in receipts])
            producer = threading.Thread(
                target=enqueue_paced,
                args=(client, work.messages, receipts),
                kwargs={"seconds": params.produce_s, "on_error": errors},
            )
            started = time.monotonic()
            monitor.start()
            producer.start()

            time.sleep(params.produce_s * 0.4)
            redis.kill()
            down_at = time.monotonic()
            sent_before = len(receipts)
            time.sleep(params.down_s)
            redis.start()
            up_at = time.monotonic()

            producer.join()
            tally = settle(client, receipts, timeout=params.settle_timeout_s)
            settled_at = time.monotonic()
            monitor.stop()
            supervisor.stop()
            result.count(tally, audit(client, work.users))

            resumed = monitor.resumed_after(up_at)
            result.checks["producer saw StoreUnavailableError while down"] = bool(errors.seen)
            result.checks["producer saw nothing but StoreUnavailableError"] = errors.only_store_unavailable
            result.checks["workers back at work after the restart"] = resumed is not None
            if supervisor.restarts:
                result.notes.append(
                    f"worker processes that died and were restarted by the supervisor: {supervisor.restarts}"
                )
            duplicates = sum(r.duplicate for r in receipts)
            if duplicates:
                result.notes.append(f"{duplicates} retried enqueues came back as duplicate receipts")
            result.metrics.update(
                redis_down_s=round(up_at - down_at, 1),
                enqueued_before_kill=sent_before,
                enqueue_errors=sum(errors.seen.values()),
                applied_again_after_restart_s=round(resumed, 1) if resumed is not None else None,
                drain_after_restart_s=round(settled_at - up_at, 1),
            )
            result.details.update(
                producer_errors=dict(errors.seen),
                started_offset_s={"kill": round(down_at - started, 1), "restart": round(up_at - started, 1)},
            )
            result.notes += [f"producer got {kind!r} x{n}" for kind, n in errors.seen.most_common()]
    finally:
        redis.stop()
    result.seconds = round(time.monotonic() - begun, 1)
    return result
