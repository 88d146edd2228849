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
import time
from dataclasses import dataclass
from types import MappingProxyType

from accounting import ScenarioResult
from fleet import EXTRACT_8, Services, kill_pid, pool_children, restart_worker
from scenario import Scenario, ScenarioParams, rounded

from engram_workers.services.celery_worker import APPLY_WORKER

NAME = "worker SIGKILL"


@dataclass(frozen=True)
class Params(ScenarioParams):
    kills: int = 10  # spread evenly over the production window
    seed: int = 1


FULL = Params(users=50, per_user=20, produce_s=90.0, moves=4)
QUICK = Params(users=10, per_user=10, produce_s=20.0, moves=3, kills=3, settle_timeout_s=150.0)


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


class WorkerKill(Scenario[Params]):
    NAME = NAME
    FLEET = "worker-kill"
    WORKERS = MappingProxyType({"extract": EXTRACT_8, "apply-1": APPLY_WORKER, "apply-2": APPLY_WORKER})
    LLM_LATENCY_S = 0.02

    def __init__(self, services: Services, params: Params) -> None:
        super().__init__(services, params)
        self.rng = random.Random(params.seed)
        self.kills: list[Kill] = []

    def strandable(self) -> int:
        # A main process SIGKILLed between kombu's BRPOP and its unacked record holds one message that is
        # nowhere in Redis (celery/celery#7950): at most one per main-process kill (one consumer, one BRPOP in
        # flight). A pool child's death never strands a task (its main process requeues it). And any process
        # killed between a message's finish and its extraction turn's pass-on (a main process or an apply pool
        # child) leaves its user's earliest parked message without its wake-up: the sweep re-sends that one
        # (``Turns.left_waiting``).
        return sum(2 if k.target == "main" else 1 for k in self.kills if k.hit)

    def kill(self, target: str) -> Kill:
        """SIGKILL a pool child of an apply worker, or the main process of any worker (then restart it)."""
        if target == "child":
            name = self.rng.choice(["apply-1", "apply-2"])
            pid, orphans = self.rng.choice(_children(self.workers[name].pid)), []
        else:
            name = self.rng.choice(sorted(self.workers))
            pid, orphans = self.workers[name].pid, pool_children(self.workers[name].pid)
        kill = Kill(at=time.monotonic(), worker=name, target=target, pid=pid)
        kill.hit = kill_pid(pid)
        if target == "main":
            kill.restart_s = restart_worker(self.workers[name], orphans=orphans)
        return kill

    def exercise(self) -> None:
        params, result = self.params, self.result
        started = self.produce_in_background(self.work.messages, seconds=params.produce_s)
        kills = self.kills
        for i, target in enumerate(_kinds(self.rng, params.kills)):
            due = started + params.produce_s * (i + 1) / (params.kills + 1)
            time.sleep(max(0.0, due - time.monotonic()))
            kills.append(self.kill(target))

        tally = self.settle()
        result.checks["every kill hit a live process"] = len(kills) == params.kills and all(k.hit for k in kills)
        self.check_order(tally)
        resumed = [r for k in kills if (r := self.resumed_after(k.at)) is not None]
        restarts = [k.restart_s for k in kills if k.restart_s is not None]
        result.metrics.update(
            kills=f"{len(kills)} ({sum(k.target == 'main' for k in kills)} main, "
            f"{sum(k.target == 'child' for k in kills)} child)",
            throughput_resumed_s_median=rounded(statistics.median(resumed)) if resumed else None,
            throughput_resumed_s_max=rounded(max(resumed, default=None)),
            worker_restart_s_max=rounded(max(restarts, default=None)),
            drain_after_last_kill_s=round(self.settled_at - kills[-1].at, 1) if kills else None,
        )
        result.details["kills"] = [
            {"worker": k.worker, "target": k.target, "at_s": round(k.at - started, 1), "hit": k.hit,
             "restart_s": k.restart_s}
            for k in kills
        ]  # fmt: skip


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return WorkerKill(services, params).run()
