"""The producer: validates a message, records it in Redis and puts an extract task on the queue.

It never calls the LLM or a graph store, and never imports Celery. Enqueue is ``MessageLedger.enqueue``,
ONE Lua script: it stores the payload and the status and pushes the task message onto the extract queue
atomically, so a message is either fully enqueued or not at all (no "recorded but never published"
window), in one round trip. A message id that is already known returns its original receipt with
``duplicate=True``. The task message is Celery's own wire format (``engram_api.ledger.wire``).
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis

from engram_api import tracing
from engram_api.errors import (
    BackPressureError,
    InvalidInputError,
    NotFoundError,
    StoreUnavailableError,
    WaitTimeoutError,
)
from engram_api.ledger import MessageLedger
from engram_api.models import (
    META_KEY_CHARS,
    META_KEYS,
    META_VALUE_CHARS,
    ChatMessage,
    Envelope,
    MessageState,
    Receipt,
    WaitResult,
    check_aware,
    check_message_id,
    check_user_id,
    utcnow,
)
from engram_api.settings import Settings

__all__ = ["MessageInput", "Producer", "build_envelope", "still_pending"]

MessageInput = str | Sequence[Mapping[str, Any] | ChatMessage]


def _backlog_full(user_id: str, pending: int, limit: int) -> BackPressureError:
    return BackPressureError(
        f"user {user_id!r} has {pending} messages pending (limit {limit}); nothing enqueued",
        user_id=user_id,
        pending=pending,
        limit=limit,
    )


def _messages(messages: object, settings: Settings) -> list[ChatMessage]:
    if isinstance(messages, str):
        items: list[ChatMessage] = [ChatMessage(role="user", content=messages)]
    elif isinstance(messages, Sequence) and not isinstance(messages, bytes | bytearray):
        if len(messages) > settings.max_messages_per_call:
            raise InvalidInputError("messages", f"at most {settings.max_messages_per_call} per call")
        items = []
        for i, m in enumerate(messages):
            if isinstance(m, ChatMessage):
                items.append(m)
            elif isinstance(m, Mapping) and isinstance(m.get("content"), str):
                role = m.get("role", "user")
                if role not in ("user", "assistant", "system", "tool"):
                    raise InvalidInputError(f"messages[{i}].role", f"unknown role {str(role)[:20]!r}")
                name = _speaker(m.get("name"), f"messages[{i}].name")
                items.append(ChatMessage(role=role, content=m["content"], name=name))
            else:
                raise InvalidInputError(f"messages[{i}]", "must be {'role': ..., 'content': str}")
    else:
        raise InvalidInputError("messages", f"must be a string or a list of messages, got {type(messages).__name__}")
    if not items:
        raise InvalidInputError("messages", "is empty")
    total = 0
    for i, m in enumerate(items):
        content = _utf8(m.content, f"messages[{i}].content")
        if "\x00" in content:
            raise InvalidInputError(f"messages[{i}].content", "contains a NUL character")
        total += len(content)
    if not any(m.content.strip() for m in items):
        raise InvalidInputError("messages", "has no non-blank content")
    if total > settings.max_message_chars:
        raise InvalidInputError("messages", f"{total} characters exceeds the limit of {settings.max_message_chars}")
    return items


# Optional extraction context an envelope may carry (see Envelope).
_CONTEXT_KEYS = ("owner_name", "earlier", "utc_offset_minutes")
_ITEM_KEYS = {"user_id", "messages", "message_id", "timestamp", "metadata", *_CONTEXT_KEYS}
_NAME_CHARS = 100
_EARLIER_TURNS = 20


def _utf8(text: str, field: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(field, "is not valid UTF-8 (lone surrogate)") from None
    return text


def _metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata", "must be a mapping of str to str/int/float/bool")
    if len(metadata) > META_KEYS:
        raise InvalidInputError("metadata", f"at most {META_KEYS} keys")
    for k, v in metadata.items():
        field = f"metadata[{str(k)[:30]!r}]"
        if not isinstance(k, str) or not k or len(k) > META_KEY_CHARS:
            raise InvalidInputError(field, f"keys are non-empty strings of at most {META_KEY_CHARS} characters")
        _utf8(k, field)
        if not isinstance(v, str | int | float | bool):
            raise InvalidInputError(field, "values are str/int/float/bool")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidInputError(field, "must be a finite number (JSON has no NaN or Infinity)")
        if isinstance(v, str):
            _utf8(v, field)
            if len(v) > META_VALUE_CHARS:
                raise InvalidInputError(field, f"at most {META_VALUE_CHARS} characters")
    return dict(metadata)


def _speaker(name: object, field: str) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or len(name) > _NAME_CHARS:
        raise InvalidInputError(field, f"must be a non-blank string of at most {_NAME_CHARS} characters")
    return _utf8(name.strip(), field)


def _utc_offset(minutes: object) -> int | None:
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not -840 <= minutes <= 840:
        raise InvalidInputError("utc_offset_minutes", "must be an integer number of minutes in -840..840")
    return minutes


def _earlier(turns: object, settings: Settings) -> list[ChatMessage]:
    if turns is None:
        return []
    if isinstance(turns, str | bytes) or not isinstance(turns, Sequence):
        raise InvalidInputError("earlier", "must be a list of {'role': ..., 'content': str, 'name'?: str}")
    if len(turns) > _EARLIER_TURNS:
        raise InvalidInputError("earlier", f"at most {_EARLIER_TURNS} turns")
    try:
        return _messages(list(turns), settings) if turns else []
    except InvalidInputError as exc:
        raise InvalidInputError("earlier" + exc.field.removeprefix("messages"), exc.problem) from None


def build_envelope(
    settings: Settings,
    user_id: object,
    messages: object,
    *,
    message_id: object = None,
    timestamp: object = None,
    metadata: object = None,
    owner_name: object = None,
    earlier: object = None,
    utc_offset_minutes: object = None,
) -> Envelope:
    """Validate everything a caller passed; raises ``InvalidInputError`` naming the field."""
    uid = check_user_id(user_id)
    mid = check_message_id(message_id) if message_id is not None else uuid.uuid4().hex
    if timestamp is not None and not isinstance(timestamp, datetime):
        raise InvalidInputError("timestamp", f"must be a datetime, got {type(timestamp).__name__}")
    ts = check_aware(timestamp) or utcnow()
    meta = _metadata(metadata)
    return Envelope(
        user_id=uid,
        message_id=mid,
        messages=_messages(messages, settings),
        timestamp=ts,
        metadata=meta,
        owner_name=_speaker(owner_name, "owner_name"),
        earlier=_earlier(earlier, settings),
        utc_offset_minutes=_utc_offset(utc_offset_minutes),
    )


class MemoryGuard:
    """Refuses producers while Redis is past ``headroom`` of its ``maxmemory``, so the workers, whose leases and
    status writes need memory too, can still drain the queue (under ``noeviction`` a full Redis refuses every
    write: the pipeline would stop while producers kept filling it). Reads ``INFO memory`` at most once per
    ``interval_s`` per producer: one round trip a second, not one per message."""

    def __init__(self, redis_client: redis.Redis, headroom: float, interval_s: float = 1.0) -> None:
        self.redis = redis_client
        self.headroom = headroom
        self.interval_s = interval_s
        self._checked_at = -math.inf
        self._full: str | None = None
        self._lock = threading.Lock()

    def check(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at >= self.interval_s:
                self._checked_at = now
                self._full = self._read()
            full = self._full
        if full is not None:
            raise BackPressureError(f"{full}; nothing enqueued", retry_after_s=5.0)

    def _read(self) -> str | None:
        try:
            info = self.redis.info("memory")
        except redis.RedisError:
            return None  # the enqueue itself reports an unreachable Redis, with its own error
        limit, used = int(info.get("maxmemory") or 0), int(info.get("used_memory") or 0)
        if limit and used >= self.headroom * limit:
            return f"Redis holds {used:,} bytes of its maxmemory {limit:,} (producers stop at {self.headroom:.0%})"
        return None


class Producer:
    """Publishes messages for the workers; thread-safe."""

    def __init__(self, *, settings: Settings, redis_client: redis.Redis) -> None:
        self.settings = settings
        self.redis = redis_client
        self.ledger = MessageLedger(redis_client, status_ttl_s=settings.status_ttl_s, secrets=settings.secrets)
        self.memory = MemoryGuard(redis_client, settings.redis_memory_headroom)

    @tracing.traced("engram.enqueue", lambda _, envelope: tracing.message_ids(envelope.user_id, envelope.message_id))
    def submit(self, envelope: Envelope) -> Receipt:
        """Register and publish an already-validated envelope (idempotent by message id)."""
        self.memory.check()
        task_id = os.urandom(16).hex()  # 128 random bits, as uuid4().hex less its cost
        uid, mid = envelope.user_id, envelope.message_id
        try:
            found = self.ledger.enqueue(envelope, task_id=task_id, limit=self.settings.max_pending_per_user)
        except redis.ResponseError as exc:
            # A full Redis refuses the script's first write, so nothing was written.
            if not isinstance(exc, redis.exceptions.OutOfMemoryError) and "OOM" not in str(exc):
                raise
            raise BackPressureError("Redis is full (maxmemory), nothing enqueued", retry_after_s=5.0) from None
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"Redis unavailable, nothing enqueued: {exc}") from exc
        if found.backlog is not None:
            raise _backlog_full(uid, found.backlog, self.settings.max_pending_per_user)
        if found.existing:
            return Receipt(user_id=uid, message_id=mid, task_id=found.existing, duplicate=True)
        return Receipt(user_id=uid, message_id=mid, task_id=task_id)

    def enqueue(self, user_id: object, messages: object, **kwargs: object) -> Receipt:
        return self.submit(build_envelope(self.settings, user_id, messages, **kwargs))  # type: ignore[arg-type]

    def enqueue_many(self, items: Iterable[Mapping[str, Any]]) -> list[Receipt]:
        """Validate every item first (all or nothing), then publish them in order."""
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidInputError("items", "must be a list of {user_id, messages, ...} mappings")
        items = list(items)
        if len(items) > self.settings.max_batch:
            raise InvalidInputError("items", f"at most {self.settings.max_batch} per batch")
        envelopes = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or "user_id" not in item or "messages" not in item:
                raise InvalidInputError(f"items[{i}]", "needs user_id and messages")
            unknown = set(item) - _ITEM_KEYS
            if unknown:
                raise InvalidInputError(f"items[{i}]", f"unknown keys {sorted(map(str, unknown))[:3]}")
            extra = {k: item.get(k) for k in ("message_id", "timestamp", "metadata", *_CONTEXT_KEYS)}
            try:
                envelopes.append(build_envelope(self.settings, item["user_id"], item["messages"], **extra))
            except InvalidInputError as exc:
                raise InvalidInputError(f"items[{i}].{exc.field}", exc.problem) from None
        self.memory.check()
        self._check_backlog(Counter(env.user_id for env in envelopes))
        return [self.submit(env) for env in envelopes]

    def _check_backlog(self, adding: Counter[str]) -> None:
        """All or nothing for a batch: refuse it before publishing any item if a user's backlog would
        overflow (``submit`` still checks each message atomically; this spares a half-published batch)."""
        limit = self.settings.max_pending_per_user
        for (user_id, count), pending in zip(adding.items(), self.ledger.backlogs(list(adding)), strict=True):
            if pending + count > limit:
                raise _backlog_full(user_id, pending, limit)

    def replay(self, user_id: str, message_id: str) -> Receipt:
        """Put a dead-lettered message back on the queue."""
        letter = self.ledger.dead_letters.get(check_user_id(user_id), check_message_id(message_id))
        if letter is None:
            raise NotFoundError(f"no dead letter {message_id!r} for {user_id!r}")
        if letter.envelope is None:
            # Dead-lettered after its payload was gone (e.g. a hook failed after the message was applied).
            raise InvalidInputError("message_id", f"dead letter {message_id!r} keeps no message to replay")
        self.ledger.replaying(user_id, message_id)
        receipt = self.submit(letter.envelope)
        self.ledger.dead_letters.remove(user_id, message_id)
        return receipt

    def states(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        return self.ledger.states(pairs)

    def verdict(self, pairs: Sequence[tuple[str, str]]) -> WaitResult:
        """Where each (user_id, message_id) stands now: applied, dead-lettered or pending."""
        return _result(pairs, self.states(pairs))

    def wait(
        self,
        receipts: Sequence[Receipt | tuple[str, str]],
        timeout: float = 60.0,
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> WaitResult:
        """Block until every message is applied or dead-lettered; raises ``WaitTimeoutError`` otherwise.
        ``on_progress(finished, total)`` is called after each poll.

        Each poll reads only the messages still pending: a wait on N messages costs Redis N reads in all
        plus one per poll per message not yet finished, not N per poll (a 2,000-message burst polled
        every 0.25 s read ~100 statuses a message). A message seen finished stays finished for this wait,
        even if its status expires before the others finish."""
        pairs = [(r.user_id, r.message_id) if isinstance(r, Receipt) else (r[0], r[1]) for r in receipts]
        states: list[str | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))
        started = time.monotonic()
        delay = 0.02
        while True:
            for i, state in zip(pending, self.states([pairs[i] for i in pending]), strict=True):
                states[i] = state
            pending = [i for i in pending if states[i] not in _FINISHED]
            if on_progress is not None:
                on_progress(len(pairs) - len(pending), len(pairs))
            if not pending:
                return _result(pairs, states)
            waited = time.monotonic() - started
            if waited >= timeout:
                raise still_pending(_result(pairs, states), len(pairs), waited)
            time.sleep(min(delay, max(0.0, timeout - waited)))
            delay = min(delay * 1.5, 0.25)


_FINISHED = (MessageState.APPLIED, MessageState.DEAD)


def _result(pairs: Sequence[tuple[str, str]], states: Sequence[str | None]) -> WaitResult:
    result = WaitResult()
    for (_, mid), state in zip(pairs, states, strict=True):
        if state == MessageState.APPLIED:
            result.applied.append(mid)
        elif state == MessageState.DEAD:
            result.dead_lettered.append(mid)
        else:
            result.pending.append(mid)
    return result


def still_pending(result: WaitResult, total: int, waited: float) -> WaitTimeoutError:
    """The error for messages not finished after ``waited`` seconds (the real time spent waiting)."""
    return WaitTimeoutError(
        f"{len(result.pending)} of {total} messages still pending after {waited:.1f}s (first: {result.pending[:3]})"
    )
