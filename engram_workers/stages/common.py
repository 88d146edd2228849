"""What the stages share: retry requests, delivery counting for poison messages, status updates."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import redis
from pydantic import ValidationError

from engram_api.models import DeadLetter, Envelope, MessageState, StageOutcome, StageResult
from engram_api.redaction import redact
from engram_api.versions import Stamp
from engram_workers.resources import WorkerResources

__all__ = [
    "Delivery",
    "RetryLater",
    "Stored",
    "backoff",
    "dead_letter",
    "deliveries",
    "envelope_or_none",
    "hooked",
    "is_forgotten",
    "keep_alive",
    "load_envelope",
    "read_stored",
    "set_state",
    "settled",
]


class RetryLater(Exception):
    """Run this task again after ``countdown`` seconds (the reason is logged by Celery: redacted)."""

    def __init__(self, countdown: float, reason: str) -> None:
        self.countdown = countdown
        reason = redact(reason)
        self.reason = reason
        super().__init__(f"retry in {countdown:.2f}s: {reason}")


def backoff(attempt: int, *, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff with full jitter (attempt 1 -> up to base, doubling, capped)."""
    return random.uniform(base / 2, min(cap, base * 2 ** max(0, attempt - 1)))


def settled(forgotten: bool, state: str | None) -> StageResult | None:
    """A stage's answer for a message with nothing left to do (forgotten, applied or dead), else None."""
    if forgotten:
        return StageResult(StageOutcome.FORGOTTEN)
    if state in (MessageState.APPLIED, MessageState.DEAD):
        return StageResult(StageOutcome.ALREADY, state)
    return None


@dataclass(frozen=True)
class Delivery:
    """A start of a stage for one message: how many earlier starts died, where the message stands, and
    whether this is the stage's first start for it (no earlier one, finished or not, within the status
    TTL): a first apply cannot find its own write in the graph, so it need not look."""

    crashed: int
    state: str | None
    forgotten: bool
    first: bool = False

    @property
    def settled(self) -> StageResult | None:
        """The stage's answer when there is nothing to do (then this start was not counted)."""
        return settled(self.forgotten, self.state)


@contextmanager
def deliveries(ctx: WorkerResources, user_id: str, message_id: str, stage: str) -> Iterator[Delivery]:
    """Count starts that never finished: a message whose processing kills the worker leaves its count up.

    Yields the ``Delivery``: how many earlier starts died (the caller dead-letters past
    ``poison_max_deliveries``), whether any start came before, the message's state and tombstone, read in
    the same round trip. A message already ``settled`` is not counted.
    """
    started, state, forgotten, earlier = ctx.ledger.enter(user_id, message_id, stage)
    delivery = Delivery(crashed=max(0, started - 1), state=state, forgotten=forgotten, first=not earlier)
    try:
        yield delivery
    finally:
        if started:
            # Redis may be the thing that failed: never let the bookkeeping mask the original error.
            with suppress(redis.RedisError):
                # Only an existing counter: one erased meanwhile (the message was forgotten) stays gone.
                ctx.ledger.leave(user_id, message_id, stage)


def set_state(
    ctx: WorkerResources,
    user_id: str,
    message_id: str,
    state: MessageState,
    *,
    extraction: str = "",
    event_time: float = 0.0,
    **fields: str,
) -> bool:
    """Record the state (and store ``extraction`` JSON if given, which files the message as ready to apply
    at ``event_time``, epoch seconds; APPLIED deletes the payload and the extraction); False if the
    message was forgotten."""
    return ctx.ledger.set_state(user_id, message_id, state, extraction=extraction, event_time=event_time, fields=fields)


def keep_alive(ctx: WorkerResources, user_id: str, message_id: str) -> None:
    """A message about to be retried keeps its payload, extraction and status for another ``status_ttl_s``:
    however long the retries take (a breaker open for days), the payload outlives them."""
    ctx.ledger.keep_alive(user_id, message_id)


def is_forgotten(ctx: WorkerResources, user_id: str, message_id: str) -> bool:
    return ctx.ledger.is_forgotten(user_id, message_id)


@dataclass(frozen=True)
class Stored:
    """What Redis holds for a message, read in one round trip: its tombstone, state, payload (envelope
    JSON) and extraction (hand-over JSON); and, when asked for, the user's published stamp (None when
    none is published, or not asked for)."""

    forgotten: bool
    state: str | None
    payload: str | None
    extraction: str | None
    published: Stamp | None = None

    @property
    def settled(self) -> StageResult | None:
        return settled(self.forgotten, self.state)


def read_stored(ctx: WorkerResources, user_id: str, message_id: str, *, published: bool = False) -> Stored:
    forgotten, state, payload, extraction, stamp = ctx.ledger.read(user_id, message_id, stamp=published)
    return Stored(forgotten, state, payload, extraction, Stamp.parse(stamp) if stamp is not None else None)


def load_envelope(ctx: WorkerResources, user_id: str, message_id: str) -> Envelope | None:
    raw = ctx.ledger.payload(user_id, message_id)
    return Envelope.model_validate_json(raw) if raw else None


def envelope_or_none(ctx: WorkerResources, user_id: str, message_id: str) -> Envelope | None:
    """The envelope to keep in a dead letter: a corrupt payload must not stop the message being dead-lettered
    (the letter's reason says what went wrong; the raw payload stays unreadable either way)."""
    try:
        return load_envelope(ctx, user_id, message_id)
    except ValidationError:
        return None


def dead_letter(
    ctx: WorkerResources,
    envelope: Envelope | None,
    *,
    user_id: str,
    message_id: str,
    stage: str,
    reason: str,
    attempts: int,
    raw_llm: str | None = None,
) -> StageResult:
    letter = DeadLetter(
        user_id=user_id,
        message_id=message_id,
        stage=stage,  # type: ignore[arg-type]
        reason=reason,
        raw_llm=raw_llm[:20_000] if raw_llm else None,
        attempts=attempts,
        envelope=envelope,
    )
    if not ctx.ledger.dead_letter(letter):
        return StageResult(StageOutcome.FORGOTTEN)
    # The letter is stored and the stage must not fail again over a notification: the hook's error goes
    # into the stored letter, where the operator looks.
    exc = ctx.hooks.try_emit("on_dead_letter", letter)
    if exc is not None:
        note = f"\non_dead_letter hook failed: {type(exc).__name__}: {exc}"[:500]
        ctx.ledger.dead_letter(letter.model_copy(update={"reason": letter.reason + note}))
    return StageResult(StageOutcome.DEAD_LETTERED, redact(reason, ctx.settings.secrets).splitlines()[0][:200])


def hooked(
    ctx: WorkerResources,
    stage: str,
    fn: Callable[[WorkerResources, str, str], StageResult],
    user_id: str,
    message_id: str,
) -> StageResult:
    """The stage between its middleware hooks, as a task runs it. In a worker everything here runs inside
    ``tasks._attempt``'s handlers: a hook that raises (or cannot even be loaded) fails the stage exactly like
    the stage's own error would."""
    started = time.perf_counter()
    ctx.hooks.emit("before_stage", stage, user_id, message_id)
    outcome = fn(ctx, user_id, message_id)
    ctx.hooks.emit("after_stage", stage, user_id, message_id, outcome, time.perf_counter() - started)
    return outcome
