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
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from harness import (
    APPLY_WORKER,
    EXTRACT_WORKER,
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

from engram_api.models import DeadLetter, Receipt
from engram_testing import Reply
from engram_workers.control.breaker import LLMBreaker

NAME = "flaky LLM"

RATE_PER_S = 5


@dataclass(frozen=True)
class Params:
    users: int = 30
    per_user: int = 10  # phase 1
    outage_users: int = 10
    outage_per_user: int = 2  # phase 2
    failure_rate: float = 0.3
    outage_s: float = 10.0
    settle_timeout_s: float = 600.0
    seed: int = 4


FULL = Params()
QUICK = Params(users=8, per_user=5, outage_users=6, outage_per_user=2, outage_s=8.0, settle_timeout_s=150.0)

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


class BreakerWatch(threading.Thread):
    """Polls the fleet's breaker state (through ``LLMBreaker.state``) and records every change with its time."""

    def __init__(self, breaker: LLMBreaker, every: float = 0.05) -> None:
        super().__init__(daemon=True, name="breaker-watch")
        self.breaker = breaker
        self.every = every
        self.changes: list[tuple[float, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            state = self.breaker.state
            if not self.changes or self.changes[-1][1] != state:
                self.changes.append((time.time(), state))
            self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

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


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    result = ScenarioResult(NAME)
    begun = time.monotonic()
    tag = f"llm{os.getpid()}"
    work = Workload(tag, users=params.users, per_user=params.per_user)
    outage = Workload(f"{tag}x", users=params.outage_users, per_user=params.outage_per_user)
    llm = services.llm
    llm.reset(seed=params.seed)
    llm.hang_s = 3 * float(SETTINGS["llm_timeout_s"])
    with fleet(services, "flaky-llm", **SETTINGS) as stack:
        client = stack.client
        extract = {**EXTRACT_WORKER, "concurrency": 8}
        start_workers(stack, {"extract-1": extract, "extract-2": extract, "apply": APPLY_WORKER})
        warm_up(stack, llm, work.reply, outage.reply)
        watch = BreakerWatch(
            LLMBreaker(
                redis_url=stack.env["REDIS_URL"],
                fail_max=int(SETTINGS["breaker_failures"]),
                reset_timeout=float(SETTINGS["breaker_reset_s"]),
                is_failure=lambda _: False,  # only watched: this instance never calls the model
            )
        )
        watch.start()

        # Phase 1: a 30 % mix of every failure kind.
        phase1_start = time.time()
        receipts: list[Receipt] = []
        llm.inject_failures(params.failure_rate, mix=failure_mix(), seed=params.seed)
        enqueue_paced(client, work.messages, receipts, seconds=0)
        phase1 = settle(client, receipts, timeout=params.settle_timeout_s)
        injected = llm.failures_injected
        llm.inject_failures(0.0)

        # Phase 2: the model is down for outage_s, then healthy again.
        phase2_start = time.time()
        before_outage = watch.breaker.stats()
        outage_receipts: list[Receipt] = []
        llm.inject_failures(1.0, mix=[Reply.error(503)])
        enqueue_paced(client, outage.messages, outage_receipts, seconds=0)
        time.sleep(params.outage_s)
        llm.inject_failures(0.0)
        healthy_at = time.time()
        phase2 = settle(client, outage_receipts, timeout=params.settle_timeout_s)
        watch.stop()
        stats = watch.breaker.stats()

        tally = settle(client, receipts + outage_receipts, timeout=params.settle_timeout_s)
        result.count(tally, audit(client, work.users + outage.users))

        letters = {d.message_id: d for d in client.dead_letters() if d.message_id in tally.dead}
        phase1_letters = [d for mid, d in letters.items() if mid in phase1.dead]
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
        calls_while_open = len(leaked)
        final_state = watch.breaker.state
        peak, peak_at = busiest_second(stamps)

        result.checks["every message applied or dead-lettered"] = not tally.pending
        result.checks["every dead letter has a reason"] = len(letters) == len(tally.dead) and all(
            d.reason.strip() for d in letters.values()
        )
        result.checks["every LLM call admitted by the breaker (none while open)"] = (
            len(stamps) == stats.admitted + stats.trials
        )
        result.checks["breaker opened and refused calls during the outage"] = (
            stats.opened > before_outage.opened and stats.rejected > before_outage.rejected
        )
        result.checks["breaker closed after recovery, through a trial"] = (
            final_state == "closed" and stats.trials > before_outage.trials
        )
        result.metrics.update(
            llm_calls=len(stamps),
            failures_injected_phase1=injected,
            breaker_admitted=stats.admitted,
            breaker_trials=stats.trials,
            breaker_rejected=stats.rejected,
            breaker_opened=stats.opened,
            max_calls_in_1s=peak,
            polled_open_windows=len(windows),
            calls_in_polled_open_windows=calls_while_open,
        )
        result.details.update(
            seconds_from_phase1_start={
                "phase2": round(phase2_start - phase1_start, 1),
                "healthy_again": round(healthy_at - phase1_start, 1),
                "busiest_second": round(peak_at - phase1_start, 2) if peak_at else None,
                "calls_while_open (window, offset)": leaked,
                "breaker_changes": [(round(t - phase1_start, 2), s) for t, s in watch.changes],
            },
            phase1_dead_letter_reasons=dict(_reasons(phase1_letters)),
            phase2_dead_letter_reasons=dict(_reasons([d for mid, d in letters.items() if mid in phase2.dead])),
        )
        result.notes += [f"phase-1 dead letters: {dict(_reasons(phase1_letters))}"]
    result.seconds = round(time.monotonic() - begun, 1)
    return result
