"""``MessageLedger``: a message's life in Redis, one method per transition.

    enqueue ──> queued ──set_state(EXTRACTED, extraction)──> extracted ──set_state(APPLIED)──> applied
                  ^                                             │
                  └───────────set_state(QUEUED) (sent back)─────┘
    any state ──dead_letter──> dead (``replaying`` + ``enqueue`` puts it back)
    any state ──forget / forget_user──> forgotten (a tombstone; no later write lands)

Each stage run is bracketed by ``enter`` (counts the start, reads the state and tombstone) and ``leave``;
the apply lease holder takes ready messages with ``claim_ready``. The keys are ``engram_api.keys``'; the
scripts ``engram_api.ledger.scripts``'; the task message on the queue is ``engram_api.ledger.wire``'s.

Invariants:
- Every transition that writes is one round trip, atomic (a script or a MULTI), and none writes for a
  forgotten message except ``enqueue``, whose message id is then a new message.
- A finished message (applied, dead, forgotten) is out of its user's backlog and ready set, and passes its
  user's extraction turn on (``turns.Turns.pass_on``, right after the finishing write: a crash in between
  is repaired by the next ``take`` that meets the finished message).
- Reads (``read``, ``states``, ``payloads``, ``backlogs``) never write; ``keep_alive`` only moves TTLs.
- A dead letter is never written for a forgotten message (``scripts.DEAD_LETTER`` checks the tombstone
  and writes in one script); its reason and raw answer are redacted first.
- The ledger holds no state of its own besides its client: any number may share one Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import redis

from engram_api import keys, tracing
from engram_api.ledger import erasure
from engram_api.ledger.deadletters import DeadLetterStore
from engram_api.ledger.inflight import SINCE_FIELD, InFlight
from engram_api.ledger.scripts import (
    CLAIM_READY,
    DECR_IF_EXISTS,
    ENQUEUE,
    ENTER,
    STAGE_WRITE,
    ClaimArgs,
    ClaimKeys,
    CounterKeys,
    EnqueueArgs,
    EnqueueKeys,
    EnterArgs,
    EnterKeys,
    NoArgs,
    StageWriteArgs,
    StageWriteKeys,
)
from engram_api.ledger.turns import Turns
from engram_api.ledger.wire import task_message
from engram_api.models import DeadLetter, Envelope, MessageState

__all__ = ["DeadLetterStore", "Enqueued", "Entered", "MessageLedger", "Record"]

_FINISHED = (MessageState.APPLIED, MessageState.DEAD)


class Enqueued(NamedTuple):
    """What ``enqueue`` found: the original task id of a message id already known (nothing written), or
    the user's backlog when it is full (nothing written); both None when the message was enqueued."""

    existing: str | None = None
    backlog: int | None = None


class Entered(NamedTuple):
    """A stage's start as ``enter`` saw it: this start's count (0: not counted, the message is settled),
    the state, the tombstone, and whether any start of this stage came before (within the status TTL)."""

    started: int
    state: str | None
    forgotten: bool
    earlier: bool


class Record(NamedTuple):
    """What Redis holds for a message, read in one round trip; ``stamp`` is the user's published stamp
    as stored ("epoch:version"), when asked for and published."""

    forgotten: bool
    state: str | None
    payload: str | None
    extraction: str | None
    stamp: str | None = None


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class MessageLedger:
    """The transitions of every message on one Redis (``client``); statuses, payloads and extractions live
    ``status_ttl_s``, dead letters are redacted of ``secrets``."""

    def __init__(self, client: redis.Redis, *, status_ttl_s: int, secrets: Iterable[str | None] = ()) -> None:
        self.redis = client
        self.status_ttl_s = status_ttl_s
        self.dead_letters = DeadLetterStore(redis_client=client, status_ttl_s=status_ttl_s, secrets=secrets)
        self.in_flight = InFlight(client)
        self.turns = Turns(client, status_ttl_s=status_ttl_s)

    # ------------------------------------------------------------------------------ queued
    def enqueue(self, envelope: Envelope, *, task_id: str, limit: int) -> Enqueued:
        """Store the payload and the status, file the message in its user's backlog (refused past ``limit``)
        and push its extract task onto the queue, atomically. Raises what Redis raises (``OOM`` when full:
        then nothing was written: the status's task id is the script's first write)."""
        uid, mid = envelope.user_id, envelope.message_id
        queue = keys.queue_for(keys.EXTRACT_TASK)
        now = time.time()
        found = ENQUEUE(
            self.redis,
            EnqueueKeys(
                payload=keys.message_payload(uid, mid), status=keys.status(uid, mid), queue=keys.queue_key(queue),
                pending=keys.pending(uid), tombstone=keys.forgotten(uid, mid), in_flight=keys.in_flight(),
                order=keys.extract_order(uid),
            ),
            EnqueueArgs(
                envelope=envelope.model_dump_json(exclude_none=True), task_id=task_id, ttl=self.status_ttl_s,
                now=now, message=task_message(keys.EXTRACT_TASK, task_id, (uid, mid), queue, now, tracing.carrier()), message_id=mid,
                limit=limit, ref=keys.message_ref(uid, mid), event_time=envelope.timestamp.timestamp(),
            ),
        )  # fmt: skip
        if isinstance(found, list):
            return Enqueued(backlog=int(found[0]))
        return Enqueued(existing=_text(found) or None)

    def backlogs(self, user_ids: Sequence[str]) -> list[int]:
        """How many unfinished messages each user has (one round trip; entries older than the TTL, of
        messages lost to a crash, are not counted: ``ENQUEUE`` drops them when they would refuse one)."""
        since = time.time() - self.status_ttl_s
        pipe = self.redis.pipeline(transaction=False)
        for user_id in user_ids:
            pipe.zcount(keys.pending(user_id), since, "+inf")
        return [int(n) for n in pipe.execute()]

    def replaying(self, user_id: str, message_id: str) -> None:
        """Before a dead letter goes back on the queue: its delivery counts and status go, so the next
        ``enqueue`` of its id is a new message (the letter itself is removed once that enqueue is done)."""
        self.redis.delete(
            *(keys.deliveries(user_id, message_id, stage) for stage in keys.STAGES), keys.status(user_id, message_id)
        )

    # ------------------------------------------------------------------------------ stages
    def enter(self, user_id: str, message_id: str, stage: str) -> Entered:
        """Count a start of ``stage`` unless the message is settled (applied, dead or forgotten)."""
        count, state, forgotten, earlier = ENTER(
            self.redis,
            EnterKeys(
                deliveries=keys.deliveries(user_id, message_id, stage),
                status=keys.status(user_id, message_id),
                tombstone=keys.forgotten(user_id, message_id),
                messages=keys.user_messages(user_id),
            ),
            EnterArgs(ttl=self.status_ttl_s, now=time.time(), message_id=message_id),
        )
        return Entered(int(count), _text(state) or None, bool(forgotten), bool(earlier))

    def leave(self, user_id: str, message_id: str, stage: str) -> None:
        """A counted start finished (whatever its outcome): its count goes back down, if it still exists."""
        DECR_IF_EXISTS(self.redis, CounterKeys(counter=keys.deliveries(user_id, message_id, stage)), NoArgs())

    def set_state(
        self,
        user_id: str,
        message_id: str,
        state: MessageState,
        *,
        extraction: str = "",
        event_time: float = 0.0,
        fields: dict[str, str] | None = None,
    ) -> bool:
        """Record ``state`` (with ``<state>_at`` now and ``fields``) unless the message was forgotten (False,
        nothing written). ``extraction`` (JSON) is stored and files the message as ready to apply at
        ``event_time`` (epoch seconds); APPLIED deletes the payload, the extraction and the delivery counters
        (a settled message's task does nothing, counted or not); APPLIED and DEAD take the message out of its
        user's backlog and ready set and pass its extraction turn on; an unfinished state files it in the
        in-flight index since its ``SINCE_FIELD``."""
        mapping = {"state": state.value, f"{state.value}_at": str(time.time()), **(fields or {})}
        written = STAGE_WRITE(
            self.redis,
            StageWriteKeys(
                tombstone=keys.forgotten(user_id, message_id),
                status=keys.status(user_id, message_id),
                extraction=keys.extraction(user_id, message_id),
                pending=keys.pending(user_id),
                ready=keys.ready(user_id),
                payload=keys.message_payload(user_id, message_id),
                in_flight=keys.in_flight(),
                in_flight_extracted=keys.in_flight_extracted(),
                messages=keys.user_messages(user_id),
                extract_deliveries=keys.deliveries(user_id, message_id, "extract"),
                apply_deliveries=keys.deliveries(user_id, message_id, "apply"),
            ),
            StageWriteArgs(
                ttl=self.status_ttl_s, now=time.time(), extraction=extraction, event_time=repr(event_time),
                finished="1" if state in _FINISHED else "0", message_id=message_id,
                applied="1" if state is MessageState.APPLIED else "0", ref=keys.message_ref(user_id, message_id),
                since_field=SINCE_FIELD.get(state, ""), extracted="1" if state is MessageState.EXTRACTED else "0",
            ),
            *(x for pair in mapping.items() for x in pair),
        )  # fmt: skip
        if written and state in _FINISHED:
            self.turns.pass_on(user_id, message_id)
        return bool(written)

    def count(self, user_id: str, message_id: str, field: str) -> int:
        """One more on a counter of the message's status hash (an attempt of some kind); the new count."""
        return int(self.redis.hincrby(keys.status(user_id, message_id), field, 1))

    def add(self, user_id: str, message_id: str, field: str, amount: float) -> None:
        """Add ``amount`` to a sum on the message's status hash (spend on failed answers)."""
        self.redis.hincrbyfloat(keys.status(user_id, message_id), field, amount)

    def claim_ready(self, user_id: str, trigger: str, others: int) -> list[str]:
        """Take ``trigger`` and up to ``others`` more of the user's ready messages (earliest event first) out
        of the ready set; returns the others' ids. A claimed message keeps its own apply task."""
        claimed = CLAIM_READY(
            self.redis, ClaimKeys(ready=keys.ready(user_id)), ClaimArgs(trigger=trigger, others=others)
        )
        return [str(_text(i)) for i in claimed]

    def keep_alive(self, user_id: str, message_id: str) -> None:
        """A message about to be retried keeps its payload, extraction and status another ``status_ttl_s``."""
        pipe = self.redis.pipeline(transaction=False)
        for key in (
            keys.message_payload(user_id, message_id),
            keys.extraction(user_id, message_id),
            keys.status(user_id, message_id),
        ):
            pipe.expire(key, self.status_ttl_s)
        pipe.zadd(keys.user_messages(user_id), {message_id: time.time()})  # the TTLs just set (see scripts)
        pipe.expire(keys.user_messages(user_id), self.status_ttl_s)
        pipe.execute()

    def dead_letter(self, letter: DeadLetter) -> bool:
        """Store the letter (redacted) and mark the message DEAD, passing its user's extraction turn on;
        False when it was forgotten meanwhile."""
        if not self.dead_letters.put(letter):
            return False
        self.turns.pass_on(letter.user_id, letter.message_id)
        return True

    # ------------------------------------------------------------------------------ reads
    def is_forgotten(self, user_id: str, message_id: str) -> bool:
        return bool(self.redis.exists(keys.forgotten(user_id, message_id)))

    def read(self, user_id: str, message_id: str, *, stamp: bool = False) -> Record:
        """Tombstone, state, payload and extraction (and, with ``stamp``, the user's published stamp)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(keys.forgotten(user_id, message_id))
        pipe.hget(keys.status(user_id, message_id), "state")
        pipe.get(keys.message_payload(user_id, message_id))
        pipe.get(keys.extraction(user_id, message_id))
        if stamp:
            pipe.get(keys.user_version(user_id))
        forgotten, state, payload, extraction, *published = pipe.execute()
        return Record(bool(forgotten), state, payload, extraction, published[0] if published else None)

    def knows(self, user_id: str, message_id: str) -> bool:
        """Redis still knows the message: queued, in a stage, finished recently, or dead-lettered."""
        traces = (keys.message_payload, keys.extraction, keys.status)
        return bool(
            self.redis.exists(*(key(user_id, message_id) for key in traces), keys.dead_letter(user_id, message_id))
        )

    def status(self, user_id: str, message_id: str) -> dict[str, str]:
        """The message's whole status hash (empty once Redis no longer knows it)."""
        raw = self.redis.hgetall(keys.status(user_id, message_id))
        return {str(_text(field)): str(_text(value)) for field, value in raw.items()}

    def payload(self, user_id: str, message_id: str) -> str | None:
        """The message's envelope JSON while it is not applied (nor forgotten, nor dead-lettered)."""
        return _text(self.redis.get(keys.message_payload(user_id, message_id)))

    def payloads(self, user_id: str, message_ids: Sequence[str]) -> list[tuple[str | None, str | None]]:
        """(payload, extraction) of each message, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for mid in message_ids:
            pipe.get(keys.message_payload(user_id, mid))
            pipe.get(keys.extraction(user_id, mid))
        raw = pipe.execute()
        return list(zip(raw[::2], raw[1::2], strict=True))

    def states(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """The state of each (user_id, message_id); None when Redis no longer knows it."""
        pipe = self.redis.pipeline(transaction=False)
        for uid, mid in pairs:
            pipe.hget(keys.status(uid, mid), "state")
        return pipe.execute()

    # ------------------------------------------------------------------------------ forgotten
    def forget(self, user_id: str, message_id: str) -> None:
        """Tombstone the message, then delete every trace of it (``erasure.erase_message``); its user's
        extraction turn passes on."""
        erasure.erase_message(self.redis, user_id, message_id, tombstone_ttl_s=self.status_ttl_s)
        self.turns.pass_on(user_id, message_id)

    def forget_user(self, user_id: str) -> int:
        """Tombstone every message of the user Redis knows, then delete all the user's keys; how many."""
        return erasure.erase_user(self.redis, user_id, tombstone_ttl_s=self.status_ttl_s)
