"""What the stages share: retry requests, delivery counting for poison messages, status updates."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import redis

from engram_api import keys
from engram_api.models import DeadLetter, Envelope, MessageState
from engram_workers.context import WorkerContext

__all__ = ["RetryLater", "backoff", "dead_letter", "deliveries", "load_envelope", "set_state"]


class RetryLater(Exception):
    """Run this task again after ``countdown`` seconds."""

    def __init__(self, countdown: float, reason: str) -> None:
        self.countdown = countdown
        self.reason = reason
        super().__init__(f"retry in {countdown:.2f}s: {reason}")


def backoff(attempt: int, *, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff with full jitter (attempt 1 -> up to base, doubling, capped)."""
    return random.uniform(base / 2, min(cap, base * 2 ** max(0, attempt - 1)))


@contextmanager
def deliveries(ctx: WorkerContext, user_id: str, message_id: str, stage: str) -> Iterator[int]:
    """Count starts that never finished: a message whose processing kills the worker leaves its count up.

    Yields how many earlier starts died; the caller dead-letters past ``poison_max_deliveries``.
    """
    key = keys.deliveries(user_id, message_id, stage)
    pipe = ctx.redis.pipeline()
    pipe.incr(key)
    pipe.expire(key, ctx.settings.status_ttl_s)
    started = int(pipe.execute()[0])
    try:
        yield started - 1
    finally:
        # Redis may be the thing that failed: never let the bookkeeping mask the original error.
        with suppress(redis.RedisError):
            ctx.redis.decr(key)


def set_state(ctx: WorkerContext, user_id: str, message_id: str, state: MessageState, **fields: str) -> None:
    key = keys.status(user_id, message_id)
    pipe = ctx.redis.pipeline()
    pipe.hset(key, mapping={"state": state.value, f"{state.value}_at": str(time.time()), **fields})
    pipe.expire(key, ctx.settings.status_ttl_s)
    pipe.execute()


def state_of(ctx: WorkerContext, user_id: str, message_id: str) -> str | None:
    return ctx.redis.hget(keys.status(user_id, message_id), "state")


def load_envelope(ctx: WorkerContext, user_id: str, message_id: str) -> Envelope | None:
    raw = ctx.redis.get(keys.message_payload(user_id, message_id))
    return Envelope.model_validate_json(raw) if raw else None


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
) -> str:
    letter = DeadLetter(
        user_id=user_id,
        message_id=message_id,
        stage=stage,  # type: ignore[arg-type]
        reason=reason,
        raw_llm=raw_llm[:20_000] if raw_llm else None,
        attempts=attempts,
        envelope=envelope,
    )
    ctx.dead_letters.put(letter)
    for m in ctx.middleware:
        m.on_dead_letter(letter)
    return f"dead-lettered: {reason.splitlines()[0][:200]}"
