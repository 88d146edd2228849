"""What every chaos scenario does the same way: the ``Scenario`` base class and its parameters.

A scenario module holds only what is its own: the workloads it sends, its fleet (``WORKERS``, settings),
and ``exercise``, what it breaks and what it checks. ``Scenario.run`` does the rest, in the same order for
every scenario: reset the LLM stand-in, start the fleet and its workers, warm up (cold starts are not
recovery), exercise, and time the whole. Each module exposes ``NAME``, ``Params``, ``FULL``, ``QUICK`` and
``run(services, params) -> ScenarioResult``; ``run_all.py`` and ``tests/test_chaos.py`` call that.

Invariants:

- the count (``Scenario.settle``) covers every message sent through ``self.receipts`` and audits the
  users of every workload the scenario names in ``workloads()``, so nothing sent escapes the audit;
- ``settle`` checks every message of those workloads against the graph (applied: its episode and each
  scripted fact once; dead-lettered: nothing), and that every receipt belongs to one of them;
- the harness's own redelivery sweep may re-send at most ``strandable()`` messages, the number the
  scenario's faults could have left nowhere in the broker (none, unless a scenario says why);
- the applied monitor samples from the first paced message until everything settled, so a recovery that
  happens while the backlog drains is seen (``recovery``);
- a service taken down by ``outage`` is brought back whatever interrupts the outage.
"""

from __future__ import annotations

import abc
import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from accounting import AppliedMonitor, ScenarioResult, Tally, audit, settle
from fleet import ONE_OF_EACH, Services, fleet, start_workers, warm_up
from workload import Message, Workload, enqueue_paced

from engram_api import MemoryClient
from engram_api.models import Receipt
from engram_workers.services.celery_worker import ManagedProcess
from tests.support.stack import Stack


@dataclass(frozen=True)
class ScenarioParams:
    """The sizes every scenario has (its ``FULL`` and ``QUICK`` say them); its own ``Params`` adds the rest."""

    users: int
    per_user: int  # messages per user, in event-time order
    produce_s: float  # messages are spread over this many seconds (0: all enqueued at once)
    moves: int = 0  # of each user's messages, how many are LIVES_IN moves (``Workload``)
    settle_timeout_s: float = 600.0  # longer than the visibility timeout: anything still pending is lost


P = TypeVar("P", bound=ScenarioParams)


@dataclass(frozen=True)
class Outage:
    """When a service went down and came back (``time.monotonic``), and what had been sent by then."""

    down_at: float
    up_at: float
    sent_before: int

    @property
    def down_s(self) -> float:
        return round(self.up_at - self.down_at, 1)


def rounded(seconds: float | None) -> float | None:
    """A duration for the table: tenths of a second, or None when it never happened."""
    return None if seconds is None else round(seconds, 1)


class Scenario(abc.ABC, Generic[P]):
    """One run of one scenario on the shared ``Services``; ``run()`` returns its ``ScenarioResult``."""

    NAME: ClassVar[str]  # the table's row
    FLEET: ClassVar[str]  # the fleet's data directory prefix
    WORKERS: ClassVar[Mapping[str, Mapping[str, Any]]] = ONE_OF_EACH
    LLM_LATENCY_S: ClassVar[float] = 0.0  # added to every stand-in answer, so messages are mid-flight

    # Set by run() once the fleet is up.
    stack: Stack
    client: MemoryClient
    workers: dict[str, ManagedProcess]

    def __init__(self, services: Services, params: P) -> None:
        self.services = services
        self.llm = services.llm
        self.params = params
        self.result = ScenarioResult(scenario=self.NAME)
        # The main workload; a scenario that sends more names it in ``workloads`` too.
        self.work = Workload(
            f"{self.FLEET}{os.getpid()}", users=params.users, per_user=params.per_user, moves=params.moves
        )
        self.receipts: list[Receipt] = []
        self.monitor: AppliedMonitor | None = None
        self.settled_at = 0.0
        self.resent_earlier: list[str] = []  # what the sweep re-sent while a phase settled (``settle_phase``)
        self._producer: threading.Thread | None = None

    # ------------------------------------------------------------------------ what a scenario says
    def workloads(self) -> Sequence[Workload]:
        """Every workload the scenario sends: scripted in the stand-in at warm-up, audited at the end."""
        return [self.work]

    @abc.abstractmethod
    def exercise(self) -> None:
        """Send, break, ``settle`` and check, writing checks, metrics and notes into ``self.result``."""

    def fleet_settings(self) -> Mapping[str, object]:
        """Settings of the fleet beyond the stack's (``ENGRAM_*`` as ``Settings`` field names)."""
        return {}

    def strandable(self) -> int:
        """How many messages this scenario's faults could leave where only the redelivery sweep finds them: taken
        from a queue by a consumer that died (or lost Redis) before kombu recorded them unacked. None by
        default: a scenario that strands messages says how many, and why, by overriding this."""
        return 0

    def prepare_llm(self) -> None:
        self.llm.reset()
        self.llm.latency_s = self.LLM_LATENCY_S

    def own_redis(self) -> contextlib.AbstractContextManager[str | None]:
        """A Redis URL for a scenario that runs on a Redis of its own; None: the shared one."""
        return contextlib.nullcontext()

    # ---------------------------------------------------------------------------------- the run
    def run(self) -> ScenarioResult:
        begun = time.monotonic()
        self.prepare_llm()
        with (
            self.own_redis() as redis_url,
            fleet(self.services, self.FLEET, redis_url=redis_url, **self.fleet_settings()) as stack,
        ):
            self.stack, self.client = stack, stack.client
            self.workers = start_workers(stack, self.WORKERS)
            warm_up(stack, self.llm, *(w.reply for w in self.workloads()))
            self.exercise()
        self.result.seconds = round(time.monotonic() - begun, 1)
        return self.result

    # ------------------------------------------------------------------- what exercise() builds on
    def produce_in_background(
        self,
        messages: Sequence[Message],
        *,
        seconds: float,
        on_error: Callable[[Message, Exception, int], float | None] | None = None,
    ) -> float:
        """Enqueue ``messages`` over ``seconds`` in a thread (receipts into ``self.receipts``) while the
        applied monitor samples; returns the ``time.monotonic`` it started at."""
        self.monitor = AppliedMonitor(self.client, lambda: [(r.user_id, r.message_id) for r in self.receipts])
        self._producer = threading.Thread(
            target=enqueue_paced,
            args=(self.client, messages, self.receipts),
            kwargs={"seconds": seconds, "on_error": on_error},
            name="producer",
        )
        started = time.monotonic()
        self.monitor.start()
        self._producer.start()
        return started

    def outage(
        self, stop: Callable[[], object], start: Callable[[], object], *, after_s: float, down_s: float
    ) -> Outage:
        """``after_s`` from now, take a service down with ``stop`` for ``down_s``, then ``start`` it again."""
        time.sleep(after_s)
        try:
            stop()
            down_at, sent_before = time.monotonic(), len(self.receipts)
            time.sleep(down_s)
        finally:
            # Whatever interrupts the outage (a timeout, Ctrl-C), the service comes back.
            start()
        return Outage(down_at=down_at, up_at=time.monotonic(), sent_before=sent_before)

    def settle(self, *, timeout: float | None = None) -> Tally:
        """Wait for the producer, then for every message in ``self.receipts`` to be applied or dead-lettered,
        and count it all into the result (duplicates over every workload's users)."""
        if self._producer is not None:
            self._producer.join()
        wait_s = self.params.settle_timeout_s if timeout is None else timeout
        tally = settle(self.client, self.receipts, timeout=wait_s)
        self.settled_at = time.monotonic()
        if self.monitor is not None:
            self.monitor.stop()  # only now: throughput may resume while the backlog drains
        self.result.count(tally, audit(self.client, [u for w in self.workloads() for u in w.users]))
        self.check_graph(tally)
        self.check_resent(tally)
        return tally

    def settle_phase(self, receipts: Sequence[Receipt], *, timeout: float) -> Tally:
        """Settle one phase's messages only (counted again, with the rest, by ``settle``); what the sweep
        re-sent meanwhile is accounted for with the rest."""
        tally = settle(self.client, receipts, timeout=timeout)
        self.resent_earlier += tally.resent
        return tally

    def check_graph(self, tally: Tally) -> None:
        """Every message sent is one of the workloads', and the graph holds what each says (``graph_mismatches``)."""
        known = {m.message_id for w in self.workloads() for m in w.messages}
        strangers = sorted({r.message_id for r in self.receipts} - known)
        wrong = [p for w in self.workloads() for p in w.graph_mismatches(self.client, tally.applied, tally.dead)]
        self.result.checks["every message's episode and facts in the graph"] = not strangers and not wrong
        self.result.metrics["graph_checked"] = len(tally.applied) + len(tally.dead)
        if strangers or wrong:
            self.result.notes.append(f"graph disagrees: {len(wrong)}, e.g. {wrong[:2]}; unknown ids: {strangers[:2]}")

    def check_resent(self, tally: Tally) -> None:
        """The harness's sweep re-sent no more than the faults could strand (``strandable``), each one named."""
        allowed, resent = self.strandable(), [*self.resent_earlier, *tally.resent]
        self.result.checks["sweep re-sent only what the faults could strand"] = len(resent) <= allowed
        self.result.metrics["sweep_resent"] = f"{len(resent)} (may: {allowed})"
        self.result.details["sweep_resent"] = resent
        if resent:
            self.result.notes.append(f"sweep re-sent {resent[:3]}")

    def resumed_after(self, t: float) -> float | None:
        """Seconds from ``t`` until applies resumed (``AppliedMonitor.resumed_after``); None: never seen."""
        assert self.monitor is not None, "throughput is sampled while produce_in_background runs"
        return self.monitor.resumed_after(t)

    def recovery(self, outage: Outage) -> dict[str, float | None]:
        """After ``settle``: when applies resumed after the service came back, and when all had drained."""
        return {
            "applied_again_after_restart_s": rounded(self.resumed_after(outage.up_at)),
            "drain_after_restart_s": round(self.settled_at - outage.up_at, 1),
        }

    def check_order(self, tally: Tally) -> None:
        """Each user's LIVES_IN chain is the applied moves in event-time order, only the last one current."""
        violations = self.work.order_violations(self.client, tally.applied)
        self.result.checks["per-user LIVES_IN order"] = not violations
        if violations:
            self.result.notes.append(f"order violated for {len(violations)} users, e.g. {violations[:2]}")
