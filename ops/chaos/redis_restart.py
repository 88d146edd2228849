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

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from accounting import ScenarioResult
from fleet import Services, Supervisor
from scenario import Scenario, ScenarioParams
from workload import Message

from engram_api.errors import StoreUnavailableError
from engram_workers.services import RedisServer

NAME = "Redis restart"


@dataclass(frozen=True)
class Params(ScenarioParams):
    down_s: float = 10.0  # Redis is killed 40 % into the production window and kept down this long


FULL = Params(users=20, per_user=25, produce_s=40.0)
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


class RedisRestart(Scenario[Params]):
    NAME = NAME
    FLEET = "redis-restart"
    # A model that takes a moment to answer, as real ones do: some messages are mid-flight when Redis dies.
    LLM_LATENCY_S = 0.3

    redis: RedisServer

    @contextlib.contextmanager
    def own_redis(self) -> Iterator[str]:
        # A Redis of its own: stopping the shared one would take other users of it down too.
        data_dir = self.services.work_dir / f"redis-restart-{time.monotonic_ns()}"
        with RedisServer(data_dir=data_dir, appendonly=True) as self.redis:
            yield self.redis.url

    def strandable(self) -> int:
        # Redis SIGKILLed right after a consumer's BRPOP took a message (the pop is in the AOF) but before the
        # reply reached the worker: that message is nowhere. One BRPOP in flight per worker main process.
        return len(self.workers)

    def exercise(self) -> None:
        params, result = self.params, self.result
        # kombu 5.7 can crash a worker whose broker connection drops while it holds unacked messages
        # ("Unrecoverable error" closing the channel). Production runs workers under a restart policy;
        # so does this scenario, and it says how often.
        supervisor = Supervisor(self.workers)
        supervisor.start()
        errors = ProducerErrors()
        started = self.produce_in_background(self.work.messages, seconds=params.produce_s, on_error=errors)
        outage = self.outage(self.redis.kill, self.redis.start, after_s=params.produce_s * 0.4, down_s=params.down_s)
        self.settle()
        supervisor.stop()

        recovered = self.recovery(outage)
        result.checks["producer saw StoreUnavailableError while down"] = bool(errors.seen)
        result.checks["producer saw nothing but StoreUnavailableError"] = errors.only_store_unavailable
        result.checks["workers back at work after the restart"] = recovered["applied_again_after_restart_s"] is not None
        if supervisor.restarts:
            result.notes.append(
                f"worker processes that died and were restarted by the supervisor: {supervisor.restarts}"
            )
        if duplicates := sum(r.duplicate for r in self.receipts):
            result.notes.append(f"{duplicates} retried enqueues came back as duplicate receipts")
        result.metrics.update(
            redis_down_s=outage.down_s,
            enqueued_before_kill=outage.sent_before,
            enqueue_errors=sum(errors.seen.values()),
            **recovered,
        )
        result.details.update(
            producer_errors=dict(errors.seen),
            started_offset_s={"kill": round(outage.down_at - started, 1), "restart": round(outage.up_at - started, 1)},
        )
        result.notes += [f"producer got {kind!r} x{n}" for kind, n in errors.seen.most_common()]


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return RedisRestart(services, params).run()
