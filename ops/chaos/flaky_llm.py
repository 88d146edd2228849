"""Scenario 4 — flaky LLM: failures of every kind, a hard outage, and two extract processes sharing a rate limit.

Phase 1: the stand-in fails 30 % of calls with a mix of HTTP 500, 429 + Retry-After, hangs beyond
``ENGRAM_LLM_TIMEOUT_S``, truncated bodies, bodies that are not JSON, answers that are not JSON and JSON
that breaks the schema. Every message must end applied or dead-lettered with its reason.

Phase 2: the stand-in fails every call for a while. The fleet-wide circuit breaker (state in Redis) must
open after ``ENGRAM_BREAKER_FAILURES`` consecutive failures, refuse calls while open, and close again
(through a half-open trial) once the model is healthy.

The checks are counts, never timings (two loaded cores make any timing margin flaky): the breaker counts
its own decisions (``LLMBreaker.stats``), and every request the stand-in received must be one the breaker
admitted, so no call reached the model while it was open. Timing-derived figures are recorded only: calls
the stand-in saw inside a polled "open" span, and the busiest 1 s at the stand-in for the shared
``ENGRAM_LLM_RATE_PER_S=5`` of two extract processes (the limiter's spacing is tested in
tests/test_controls.py).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from accounting import ScenarioResult
from fleet import EXTRACT_8, Poller, Services
from scenario import Scenario, ScenarioParams
from workload import Workload, enqueue_paced

from engram_api.connections import redis_client
from engram_api.models import DeadLetter, Receipt
from engram_api.settings import Settings
from engram_testing import Reply
from engram_workers.control.breaker import LLMBreaker
from engram_workers.services.celery_worker import APPLY_WORKER

NAME = "flaky LLM"

RATE_PER_S = 5


@dataclass(frozen=True)
class Params(ScenarioParams):
    # users x per_user messages in phase 1, all enqueued at once (produce_s 0)
    outage_users: int = 10
    outage_per_user: int = 2  # phase 2
    failure_rate: float = 0.3
    outage_s: float = 10.0
    seed: int = 4


FULL = Params(users=30, per_user=10, produce_s=0.0)
QUICK = Params(users=8, per_user=5, produce_s=0.0, outage_users=6, outage_s=8.0, settle_timeout_s=150.0)

SETTINGS = {
    "llm_rate_per_s": RATE_PER_S,
    "llm_burst": RATE_PER_S,
    "llm_timeout_s": 2,
    "llm_max_attempts": 3,
    "breaker_failures": 4,
    "breaker_reset_s": 4,
}


def failure_mix() -> list[Reply]:
    return [
        Reply.error(500),
        Reply.rate_limited(1),
        Reply(hang=True),  # the stand-in's hang_s is set well beyond llm_timeout_s
        Reply(truncate=True),
        Reply.malformed(),
        Reply(content="Sure! The user collects stamps and paints landscapes."),
        Reply.json({"facts": [{"subject": "user", "importance": "very"}]}),
    ]


def busiest_second(timestamps: Sequence[float]) -> tuple[int, float | None]:
    """The most requests inside any half-open 1 s window, and where that window starts."""
    ts = sorted(timestamps)
    best, start, lo = 0, None, 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= 1.0:
            lo += 1
        if hi - lo + 1 > best:
            best, start = hi - lo + 1, ts[lo]
    return best, start


class BreakerWatch(Poller):
    """Polls the fleet's breaker state (through ``LLMBreaker.state``) and records every change with its time."""

    def __init__(self, breaker: LLMBreaker, every: float = 0.05) -> None:
        super().__init__("breaker-watch", every, join_timeout=5)
        self.breaker = breaker
        self.changes: list[tuple[float, str]] = []

    def poll(self) -> None:
        state = self.breaker.state
        if not self.changes or self.changes[-1][1] != state:
            self.changes.append((time.time(), state))

    def open_windows(self) -> list[tuple[float, float]]:
        """Spans in which the breaker was open: no call may leave the fleet (the trial comes when half-open)."""
        return [
            (t, nxt[0] if nxt else time.time())
            for (t, state), nxt in zip(self.changes, [*self.changes[1:], None], strict=True)
            if state == "open"
        ]


def _reasons(letters: Sequence[DeadLetter]) -> Counter[str]:
    # "LLM failed 3 times; last: InternalServerError: ..." -> "InternalServerError"
    return Counter(d.reason.split("last: ", 1)[-1].split(":", 1)[0][:60] for d in letters)


class FlakyLLM(Scenario[Params]):
    NAME = NAME
    FLEET = "flaky-llm"
    # Two extract processes share the fleet-wide rate limit and breaker.
    WORKERS = MappingProxyType({"extract-1": EXTRACT_8, "extract-2": EXTRACT_8, "apply": APPLY_WORKER})

    def __init__(self, services: Services, params: Params) -> None:
        super().__init__(services, params)
        self.outage_work = Workload(
            f"{self.FLEET}x{os.getpid()}", users=params.outage_users, per_user=params.outage_per_user
        )

    def workloads(self) -> list[Workload]:
        return [self.work, self.outage_work]

    def fleet_settings(self) -> Mapping[str, object]:
        return SETTINGS

    def prepare_llm(self) -> None:
        self.llm.reset(seed=self.params.seed)
        self.llm.hang_s = 3 * float(SETTINGS["llm_timeout_s"])

    def exercise(self) -> None:
        params, llm = self.params, self.llm
        watch = BreakerWatch(
            LLMBreaker(
                redis=redis_client(self.stack.env["REDIS_URL"], Settings()),
                fail_max=int(SETTINGS["breaker_failures"]),
                reset_timeout=float(SETTINGS["breaker_reset_s"]),
                is_failure=lambda _: False,  # only watched: this instance never calls the model
            )
        )
        watch.start()

        # Phase 1: a 30 % mix of every failure kind.
        phase1_start = time.time()
        llm.inject_failures(params.failure_rate, mix=failure_mix(), seed=params.seed)
        enqueue_paced(self.client, self.work.messages, self.receipts, seconds=params.produce_s)
        phase1 = self.settle_phase(self.receipts, timeout=params.settle_timeout_s)
        injected = llm.failures_injected
        llm.inject_failures(0.0)

        # Phase 2: the model is down for outage_s, then healthy again.
        phase2_start = time.time()
        before_outage = watch.breaker.stats()
        outage_receipts: list[Receipt] = []
        llm.inject_failures(1.0, mix=[Reply.error(503)])
        enqueue_paced(self.client, self.outage_work.messages, outage_receipts, seconds=params.produce_s)
        time.sleep(params.outage_s)
        llm.inject_failures(0.0)
        healthy_at = time.time()
        phase2 = self.settle_phase(outage_receipts, timeout=params.settle_timeout_s)
        watch.stop()
        stats = watch.breaker.stats()

        self.receipts += outage_receipts
        tally = self.settle()
        letters = {d.message_id: d for d in self.client.dead_letters() if d.message_id in tally.dead}
        phase1_reasons = _reasons([d for mid, d in letters.items() if mid in phase1.dead])
        windows = watch.open_windows()
        stamps = [r.timestamp for r in llm.requests]
        # Recorded, not checked: a call already on the wire when the breaker opened lands just after, and the
        # state is polled every 50 ms, so the trial that ends a span may be seen before the change.
        margin = 0.1
        leaked = [
            (round(lo - phase1_start, 2), round(t - lo, 3))
            for t in stamps
            for lo, hi in windows
            if lo + margin < t < hi - margin
        ]
        peak, peak_at = busiest_second(stamps)

        checks = self.result.checks
        checks["every message applied or dead-lettered"] = not tally.pending
        checks["every dead letter has a reason"] = len(letters) == len(tally.dead) and all(
            d.reason.strip() for d in letters.values()
        )
        checks["every LLM call admitted by the breaker (none while open)"] = (
            len(stamps) == stats.admitted + stats.trials
        )
        checks["breaker opened and refused calls during the outage"] = (
            stats.opened > before_outage.opened and stats.rejected > before_outage.rejected
        )
        checks["breaker closed after recovery, through a trial"] = (
            watch.breaker.state == "closed" and stats.trials > before_outage.trials
        )
        self.result.metrics.update(
            llm_calls=len(stamps),
            failures_injected_phase1=injected,
            breaker_admitted=stats.admitted,
            breaker_trials=stats.trials,
            breaker_rejected=stats.rejected,
            breaker_opened=stats.opened,
            max_calls_in_1s=peak,
            polled_open_windows=len(windows),
            calls_in_polled_open_windows=len(leaked),
        )
        self.result.details.update(
            seconds_from_phase1_start={
                "phase2": round(phase2_start - phase1_start, 1),
                "healthy_again": round(healthy_at - phase1_start, 1),
                "busiest_second": round(peak_at - phase1_start, 2) if peak_at else None,
                "calls_while_open (window, offset)": leaked,
                "breaker_changes": [(round(t - phase1_start, 2), s) for t, s in watch.changes],
            },
            phase1_dead_letter_reasons=dict(phase1_reasons),
            phase2_dead_letter_reasons=dict(_reasons([d for mid, d in letters.items() if mid in phase2.dead])),
        )
        self.result.notes += [f"phase-1 dead letters: {dict(phase1_reasons)}"]


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return FlakyLLM(services, params).run()
