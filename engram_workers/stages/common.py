"""What the stages share: retry requests, delivery counting for poison messages, status updates."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import redis
from pydantic import ValidationError

from engram_api import keys
from engram_api.models import DeadLetter, Envelope, MessageState, StageOutcome, StageResult
from engram_api.redaction import redact
from engram_api.versions import Stamp
from engram_workers.context import WorkerContext

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

# Stage writes check the message's tombstone in the same script (see engram_api.erasure): a stage that
# was running when the message was forgotten writes nothing back.
# A stored extraction makes the message ready to apply (keys.ready, scored by event time); a finished
# message leaves its user's backlog (keys.pending) and the ready set.
# An applied message's payload and extraction go with its status write.
# KEYS: tombstone, status, extraction, pending, ready, payload. ARGV: ttl, extraction json ('' = none), event
# time, finished ('1'/'0'), message id, applied ('1'/'0'), field, value, ...
_STAGE_WRITE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[1])
  redis.call('ZADD', KEYS[5], ARGV[3], ARGV[5])
  redis.call('EXPIRE', KEYS[5], ARGV[1])
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[5])
  redis.call('ZREM', KEYS[5], ARGV[5])
end
if ARGV[6] == '1' then redis.call('DEL', KEYS[6], KEYS[3]) end
redis.call('HSET', KEYS[2], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""

# A start of a stage, in one round trip: a message already finished (applied, dead) or forgotten is not
# counted, since its task has nothing to do; otherwise the start is counted. The counter outlives a
# finished start (back at 0), so its absence says no start of this stage came before. Returns {count or 0,
# state, forgotten, earlier start}. KEYS: deliveries counter, status, tombstone. ARGV: ttl.
_ENTER = """
local state = redis.call('HGET', KEYS[2], 'state') or ''
local forgotten = redis.call('EXISTS', KEYS[3])
local earlier = redis.call('EXISTS', KEYS[1])
if forgotten == 1 or state == 'applied' or state == 'dead' then return {0, state, forgotten, earlier} end
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {n, state, forgotten, earlier}
"""

_DECR_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('DECR', KEYS[1]) end
return 0
"""


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
def deliveries(ctx: WorkerContext, user_id: str, message_id: str, stage: str) -> Iterator[Delivery]:
    """Count starts that never finished: a message whose processing kills the worker leaves its count up.

    Yields the ``Delivery``: how many earlier starts died (the caller dead-letters past
    ``poison_max_deliveries``), whether any start came before, the message's state and tombstone, read in
    the same round trip. A message already ``settled`` is not counted.
    """
    key = keys.deliveries(user_id, message_id, stage)
    started, state, forgotten, earlier = ctx.script(_ENTER)(
        keys=[key, keys.status(user_id, message_id), keys.forgotten(user_id, message_id)],
        args=[ctx.settings.status_ttl_s],
    )
    state = state.decode() if isinstance(state, bytes) else state
    delivery = Delivery(
        crashed=max(0, int(started) - 1), state=state or None, forgotten=bool(forgotten), first=not earlier
    )
    try:
        yield delivery
    finally:
        if started:
            # Redis may be the thing that failed: never let the bookkeeping mask the original error.
            with suppress(redis.RedisError):
                # Only an existing counter: one erased meanwhile (the message was forgotten) stays gone.
                ctx.script(_DECR_IF_EXISTS)(keys=[key])


def set_state(
    ctx: WorkerContext,
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
    mapping = {"state": state.value, f"{state.value}_at": str(time.time()), **fields}
    script = ctx.script(_STAGE_WRITE)
    finished = "1" if state in (MessageState.APPLIED, MessageState.DEAD) else "0"
    written = script(
        keys=[
            keys.forgotten(user_id, message_id),
            keys.status(user_id, message_id),
            keys.extraction(user_id, message_id),
            keys.pending(user_id),
            keys.ready(user_id),
            keys.message_payload(user_id, message_id),
        ],
        args=[
            ctx.settings.status_ttl_s, extraction, repr(event_time), finished, message_id,
            "1" if state is MessageState.APPLIED else "0", *(x for pair in mapping.items() for x in pair),
        ],
    )  # fmt: skip
    return bool(written)


def keep_alive(ctx: WorkerContext, user_id: str, message_id: str) -> None:
    """A message about to be retried keeps its payload, extraction and status for another ``status_ttl_s``:
    however long the retries take (a breaker open for days), the payload outlives them."""
    pipe = ctx.redis.pipeline(transaction=False)
    for key in (keys.message_payload(user_id, message_id), keys.extraction(user_id, message_id)):
        pipe.expire(key, ctx.settings.status_ttl_s)
    pipe.expire(keys.status(user_id, message_id), ctx.settings.status_ttl_s)
    pipe.execute()


def is_forgotten(ctx: WorkerContext, user_id: str, message_id: str) -> bool:
    return bool(ctx.redis.exists(keys.forgotten(user_id, message_id)))


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


def read_stored(ctx: WorkerContext, user_id: str, message_id: str, *, published: bool = False) -> Stored:
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.exists(keys.forgotten(user_id, message_id))
    pipe.hget(keys.status(user_id, message_id), "state")
    pipe.get(keys.message_payload(user_id, message_id))
    pipe.get(keys.extraction(user_id, message_id))
    if published:
        pipe.get(keys.user_version(user_id))
    forgotten, state, payload, extraction, *stamp = pipe.execute()
    return Stored(
        bool(forgotten), state, payload, extraction, Stamp.parse(stamp[0]) if stamp and stamp[0] is not None else None
    )


def load_envelope(ctx: WorkerContext, user_id: str, message_id: str) -> Envelope | None:
    raw = ctx.redis.get(keys.message_payload(user_id, message_id))
    return Envelope.model_validate_json(raw) if raw else None


def envelope_or_none(ctx: WorkerContext, user_id: str, message_id: str) -> Envelope | None:
    """The envelope to keep in a dead letter: a corrupt payload must not stop the message being dead-lettered
    (the letter's reason says what went wrong; the raw payload stays unreadable either way)."""
    try:
        return load_envelope(ctx, user_id, message_id)
    except ValidationError:
        return None


def dead_letter(
    ctx: WorkerContext,
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
    if not ctx.dead_letters.put(letter):
        return StageResult(StageOutcome.FORGOTTEN)
    # The letter is stored and the stage must not fail again over a notification: the hook's error goes
    # into the stored letter, where the operator looks.
    exc = ctx.hooks.try_emit("on_dead_letter", letter)
    if exc is not None:
        note = f"\non_dead_letter hook failed: {type(exc).__name__}: {exc}"[:500]
        ctx.dead_letters.put(letter.model_copy(update={"reason": letter.reason + note}))
    return StageResult(StageOutcome.DEAD_LETTERED, redact(reason, ctx.settings.secrets).splitlines()[0][:200])


def hooked(
    ctx: WorkerContext, stage: str, fn: Callable[[WorkerContext, str, str], StageResult], user_id: str, message_id: str
) -> StageResult:
    """The stage between its middleware hooks, as a task runs it. In a worker everything here runs inside
    ``tasks._attempt``'s handlers: a hook that raises (or cannot even be loaded) fails the stage exactly like
    the stage's own error would."""
    started = time.perf_counter()
    ctx.hooks.emit("before_stage", stage, user_id, message_id)
    outcome = fn(ctx, user_id, message_id)
    ctx.hooks.emit("after_stage", stage, user_id, message_id, outcome, time.perf_counter() - started)
    return outcome
