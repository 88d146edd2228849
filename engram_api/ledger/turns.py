"""Extraction turns: one user's messages are extracted one at a time, in event-time order.

A model can only relate a message to the facts it is shown. Extracted side by side, "my main language is
Java" / "we switched to Kotlin" / "these days I mostly code in Rust" never see each other, and all three stay
current. So a message of the LLM path extracts only while it holds its user's turn (``keys.extract_turn``):
it takes the turn when it is the earliest of the user's unfinished messages (``keys.extract_order``, scored
by event time), and keeps it until it is applied, dead-lettered or forgotten. A message that finds the turn
taken, or an earlier message waiting, parks (``keys.parked``) and its task ends; whoever passes the turn on
sends the extract task of the earliest waiting message if it parked. Different users never wait for each
other; messages that read no context (trivial ones, the offline rules) take no turn, but they are in the
order, so a later message waits for their episode too.

Invariants:
- At most one message of a user holds the turn; a message takes it only as the earliest of the order (a
  message enqueued later with an older event time goes first if the turn is free when it arrives; one that
  arrives while a newer message holds the turn waits for it, and is then a late message, shown the newer
  facts: docs/extraction.md, "Bursts and late messages").
- No lost wake-up: a message is in the order from its enqueue (``scripts.ENQUEUE``), so ``pass_on`` sees
  it whether or not its task has run; a parked message is woken by ``pass_on`` or, if that never came (a
  crash between a finish and its ``pass_on``), by the next ``take`` that meets it, and in the end by the
  redelivery sweep, which re-sends every message queued past the visibility timeout whose task is gone
  (a parked message only when nobody will pass the turn on, and then the user's earliest: ``left_waiting``).
- A message whose status says it is finished, or is gone (expired, forgotten), never blocks: ``take``
  drops such a blocker (checked in the script, against the blocker's status) and tries again. A message
  that dead-letters therefore passes the turn on like one that is applied.
- ``pass_on`` of a message still queued or extracted changes nothing (checked in the script).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from engram_api import keys
from engram_api.ledger.scripts import LuaScript
from engram_api.ledger.wire import task_message
from engram_api.models import MessageState

if TYPE_CHECKING:
    import redis

__all__ = ["PASS_TURN", "TAKE_TURN", "Taken", "Turns"]

# Blockers one ``take`` drops before it parks anyway (each is a finished or expired message): bounded, so a
# user with many lost entries is cleaned over several takes, never in one long call.
_DROPS = 8


class TurnKeys(NamedTuple):
    turn: str
    order: str
    parked: str


class TakeArgs(NamedTuple):
    message_id: str
    event_time: str
    ttl: int


# A message asks for its user's turn. It joins the order if it is not in it (enqueued before orders existed).
# Granted when it holds the turn already (a redelivery, a message sent back by apply) or when the turn is free
# and it is the earliest of the order. Otherwise it parks; if the turn is free and the earliest message parked
# without being woken (a lost wake-up), that one is un-parked and returned to be woken. Returns {granted,
# blocker (the holder, else the earliest), message to wake or ''}.
TAKE_TURN = LuaScript(
    TurnKeys,
    TakeArgs,
    """
redis.call('ZADD', K.order, 'NX', A.event_time, A.message_id)
redis.call('EXPIRE', K.order, A.ttl)
local holder = redis.call('GET', K.turn)
if holder == A.message_id then
  redis.call('EXPIRE', K.turn, A.ttl)
  return {1, '', ''}
end
local first = redis.call('ZRANGE', K.order, 0, 0)[1]
if not holder and first == A.message_id then
  redis.call('SET', K.turn, A.message_id, 'EX', A.ttl)
  redis.call('SREM', K.parked, A.message_id)
  return {1, '', ''}
end
redis.call('SADD', K.parked, A.message_id)
redis.call('EXPIRE', K.parked, A.ttl)
local wake = ''
if not holder and redis.call('SREM', K.parked, first) == 1 then wake = first end
return {0, holder or first, wake}
""",
)


class PassKeys(NamedTuple):
    turn: str
    order: str
    parked: str
    status: str


class PassArgs(NamedTuple):
    message_id: str
    keep: str  # a message not to wake ('' = none): a ``take`` that drops a blocker tries again itself


# A finished message leaves the order (and the turn, if it held it): checked against its status in the
# script, so a message still queued or extracted is left alone (returns false). When the turn is then free
# and the earliest message of the order parked (and is not ``keep``), it is un-parked and returned, to be
# woken; else ''.
PASS_TURN = LuaScript(
    PassKeys,
    PassArgs,
    f"""
local state = redis.call('HGET', K.status, 'state')
if state == '{MessageState.QUEUED.value}' or state == '{MessageState.EXTRACTED.value}' then return false end
redis.call('ZREM', K.order, A.message_id)
redis.call('SREM', K.parked, A.message_id)
if redis.call('GET', K.turn) == A.message_id then redis.call('DEL', K.turn) end
if redis.call('EXISTS', K.turn) == 1 then return '' end
local first = redis.call('ZRANGE', K.order, 0, 0)[1]
if first and first ~= A.keep and redis.call('SREM', K.parked, first) == 1 then return first end
return ''
""",
)


class Taken(NamedTuple):
    """What ``take`` found: whether the message holds the turn now, and else what it waits for."""

    granted: bool
    blocker: str | None = None


def _text(value: str | bytes | None) -> str:
    return (value.decode() if isinstance(value, bytes) else value) or ""


class Turns:
    """The extraction turns on one Redis (``client``); the order, turn and parked keys live ``status_ttl_s``."""

    def __init__(self, client: redis.Redis, *, status_ttl_s: int) -> None:
        self.redis = client
        self.status_ttl_s = status_ttl_s

    def take(self, user_id: str, message_id: str, event_time: float) -> Taken:
        """Take the user's turn for ``message_id`` (event time ``event_time``, epoch seconds), or park it
        behind the message that blocks it; a blocker that is finished or gone is dropped first."""
        keys_ = TurnKeys(keys.extract_turn(user_id), keys.extract_order(user_id), keys.parked(user_id))
        args = TakeArgs(message_id=message_id, event_time=repr(event_time), ttl=self.status_ttl_s)
        for _ in range(_DROPS + 1):
            granted, blocker, wake = TAKE_TURN(self.redis, keys_, args)
            if wake:
                self._wake(user_id, _text(wake))
            if granted:
                return Taken(True)
            blocker = _text(blocker)
            if not self._drop(user_id, blocker, message_id):
                return Taken(False, blocker)
        return Taken(False, blocker)

    def pass_on(self, user_id: str, message_id: str) -> str | None:
        """``message_id`` is finished (applied, dead-lettered, forgotten): it leaves the order and passes the
        turn on; the earliest waiting message, if it parked, gets its extract task again. Returns that
        message's id (None: none woken, or ``message_id`` is not finished)."""
        return self._pass(user_id, message_id, keep="")

    def _pass(self, user_id: str, message_id: str, *, keep: str) -> str | None:
        found = PASS_TURN(
            self.redis,
            PassKeys(
                keys.extract_turn(user_id), keys.extract_order(user_id), keys.parked(user_id),
                keys.status(user_id, message_id),
            ),
            PassArgs(message_id=message_id, keep=keep),
        )  # fmt: skip
        # On a pipeline (a bulk load) the script is only queued: no answer yet, so nothing is known to wake.
        woken = _text(found) if isinstance(found, (str, bytes)) else None
        if woken:
            self._wake(user_id, woken)
        return woken or None

    def _drop(self, user_id: str, blocker: str, taker: str) -> bool:
        """Drop a blocker that is finished or gone (True), waking whoever is earliest and parked unless that
        is ``taker``, which asks again at once."""
        state = _text(self.redis.hget(keys.status(user_id, blocker), "state"))
        if state in (MessageState.QUEUED.value, MessageState.EXTRACTED.value):
            return False
        self._pass(user_id, blocker, keep=taker)
        return True

    def _wake(self, user_id: str, message_id: str) -> None:
        """Put the extract task of a parked message on its queue (the producer's wire format) at the end
        workers take from next: it has waited its turn already, and a user's whole burst waits on it, so it
        does not queue again behind messages enqueued since (kombu LPUSHes and BRPOPs: RPUSH is the front)."""
        queue = keys.queue_for(keys.EXTRACT_TASK)
        task_id = str(uuid.uuid4())
        self.redis.rpush(queue, task_message(keys.EXTRACT_TASK, task_id, (user_id, message_id), queue, time.time()))

    def left_waiting(self, messages: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (user id, message id) pairs of ``messages`` the redelivery sweep must leave alone although their
        task is gone: parked messages wait for a ``pass_on``, not for a lost task. One parked while another
        message of its user holds the turn and is unfinished waits for that holder; when nobody will pass
        the turn on (the holder finished without it: a worker killed between its finish and its pass), only
        the user's earliest parked message needs its task again (its ``take`` drops the finished holder and
        the rest follow turn by turn), so the others are left too. Three pipelined reads, whatever the count."""
        messages = list(messages)
        pipe = self.redis.pipeline(transaction=False)
        for user_id, message_id in messages:
            pipe.sismember(keys.parked(user_id), message_id)
            pipe.get(keys.extract_turn(user_id))
            pipe.zscore(keys.extract_order(user_id), message_id)
        found = pipe.execute()
        parked = {
            (user_id, message_id): (_text(holder), score)
            for (user_id, message_id), is_parked, holder, score in zip(
                messages, found[::3], found[1::3], found[2::3], strict=True
            )
            if is_parked and _text(holder) != message_id
        }
        holders = sorted({(user_id, holder) for (user_id, _), (holder, _) in parked.items() if holder})
        pipe = self.redis.pipeline(transaction=False)
        for user_id, holder in holders:
            pipe.hget(keys.status(user_id, holder), "state")
        unfinished = (MessageState.QUEUED.value, MessageState.EXTRACTED.value)
        live = {pair for pair, state in zip(holders, pipe.execute(), strict=True) if _text(state) in unfinished}
        left = {pair for pair, (holder, _) in parked.items() if (pair[0], holder) in live}
        earliest: dict[str, tuple[float, str]] = {}
        for (user_id, message_id), (_, score) in parked.items():
            if (user_id, message_id) not in left:
                earliest[user_id] = min(earliest.get(user_id, (float("inf"), "")), (score or 0.0, message_id))
        return left | {pair for pair in parked if pair not in left and earliest[pair[0]][1] != pair[1]}

    def waiting(self, user_id: str) -> list[str]:
        """The user's unfinished messages in the order their extractions take the turn (earliest first)."""
        return [_text(m) for m in self.redis.zrange(keys.extract_order(user_id), 0, -1)]
