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
- A woken message's trace runs on (``engram_api.tracing``): with tracing on, a message parks together with
  the trace context of the extract span that parked it (``keys.parked_traces``, same script), and the script
  that wakes it hands that context back (and removes it), which the woken task carries in its headers, as
  the enqueue's task does. With tracing off the scripts neither write nor read it: not one command more.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from engram_api import keys, tracing
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
    traces: str


class TakeArgs(NamedTuple):
    message_id: str
    event_time: str
    ttl: int
    trace: str  # the parking span's context, kept if the message parks ('' = tracing off: none kept or read)


# A message asks for its user's turn. It joins the order if it is not in it (enqueued before orders existed).
# Granted when it holds the turn already (a redelivery, a message sent back by apply) or when the turn is free
# and it is the earliest of the order. Otherwise it parks; if the turn is free and the earliest message parked
# without being woken (a lost wake-up), that one is un-parked and returned to be woken. Returns {granted,
# blocker (the holder, else the earliest), message to wake or '', the trace context it parked with or ''}.
TAKE_TURN = LuaScript(
    TurnKeys,
    TakeArgs,
    """
redis.call('ZADD', K.order, 'NX', A.event_time, A.message_id)
redis.call('EXPIRE', K.order, A.ttl)
local holder = redis.call('GET', K.turn)
if holder == A.message_id then
  redis.call('EXPIRE', K.turn, A.ttl)
  return {1, '', '', ''}
end
local first = redis.call('ZRANGE', K.order, 0, 0)[1]
if not holder and first == A.message_id then
  redis.call('SET', K.turn, A.message_id, 'EX', A.ttl)
  redis.call('SREM', K.parked, A.message_id)
  return {1, '', '', ''}
end
redis.call('SADD', K.parked, A.message_id)
redis.call('EXPIRE', K.parked, A.ttl)
if A.trace ~= '' then
  redis.call('HSET', K.traces, A.message_id, A.trace)
  redis.call('EXPIRE', K.traces, A.ttl)
end
local wake, trace = '', ''
if not holder and redis.call('SREM', K.parked, first) == 1 then
  wake = first
  if A.trace ~= '' then
    trace = redis.call('HGET', K.traces, first) or ''
    redis.call('HDEL', K.traces, first)
  end
end
return {0, holder or first, wake, trace}
""",
)


class PassKeys(NamedTuple):
    turn: str
    order: str
    parked: str
    traces: str
    status: str


class PassArgs(NamedTuple):
    message_id: str
    keep: str  # a message not to wake ('' = none): a ``take`` that drops a blocker tries again itself
    traced: str  # '1': tracing is on, the parked messages' trace contexts are read and removed; '' = off


# A finished message leaves the order (and the turn, if it held it): checked against its status in the
# script, so a message still queued or extracted is left alone (returns false). When the turn is then free
# and the earliest message of the order parked (and is not ``keep``), it is un-parked and returned, to be
# woken, with the trace context it parked with: {message to wake or '', its trace context or ''}.
PASS_TURN = LuaScript(
    PassKeys,
    PassArgs,
    f"""
local state = redis.call('HGET', K.status, 'state')
if state == '{MessageState.QUEUED.value}' or state == '{MessageState.EXTRACTED.value}' then return false end
redis.call('ZREM', K.order, A.message_id)
redis.call('SREM', K.parked, A.message_id)
if A.traced ~= '' then redis.call('HDEL', K.traces, A.message_id) end
if redis.call('GET', K.turn) == A.message_id then redis.call('DEL', K.turn) end
if redis.call('EXISTS', K.turn) == 1 then return {{'', ''}} end
local first = redis.call('ZRANGE', K.order, 0, 0)[1]
if first and first ~= A.keep and redis.call('SREM', K.parked, first) == 1 then
  local trace = ''
  if A.traced ~= '' then
    trace = redis.call('HGET', K.traces, first) or ''
    redis.call('HDEL', K.traces, first)
  end
  return {{first, trace}}
end
return {{'', ''}}
""",
)


class Taken(NamedTuple):
    """What ``take`` found: whether the message holds the turn now, and else what it waits for."""

    granted: bool
    blocker: str | None = None


def _text(value: str | bytes | None) -> str:
    return (value.decode() if isinstance(value, bytes) else value) or ""


def _turn_keys(user_id: str) -> TurnKeys:
    return TurnKeys(
        keys.extract_turn(user_id), keys.extract_order(user_id), keys.parked(user_id), keys.parked_traces(user_id)
    )


def _headers(trace: str | bytes | None) -> dict[str, str] | None:
    """The task headers of a trace context kept by a parking (``TakeArgs.trace``); None when there is none
    or it is not a JSON object of strings (a woken task without its context is still woken)."""
    try:
        found = json.loads(_text(trace) or "null")
    except ValueError:
        return None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        return None
    return found or None


class Turns:
    """The extraction turns on one Redis (``client``); the order, turn and parked keys live ``status_ttl_s``."""

    def __init__(self, client: redis.Redis, *, status_ttl_s: int) -> None:
        self.redis = client
        self.status_ttl_s = status_ttl_s

    def take(self, user_id: str, message_id: str, event_time: float) -> Taken:
        """Take the user's turn for ``message_id`` (event time ``event_time``, epoch seconds), or park it
        behind the message that blocks it; a blocker that is finished or gone is dropped first."""
        context = tracing.carrier()  # the extract span's: a woken task continues the message's trace from it
        args = TakeArgs(
            message_id=message_id, event_time=repr(event_time), ttl=self.status_ttl_s,
            trace=json.dumps(context) if context else "",
        )  # fmt: skip
        for _ in range(_DROPS + 1):
            granted, blocker, wake, trace = TAKE_TURN(self.redis, _turn_keys(user_id), args)
            if wake:
                self._wake(user_id, _text(wake), trace)
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
            PassKeys(*_turn_keys(user_id), keys.status(user_id, message_id)),
            PassArgs(message_id=message_id, keep=keep, traced="1" if tracing.enabled() else ""),
        )
        # On a pipeline (a bulk load) the script is only queued: no answer yet, so nothing is known to wake.
        woken, trace = (_text(found[0]), found[1]) if isinstance(found, list) else ("", None)
        if woken:
            self._wake(user_id, woken, trace)
        return woken or None

    def _drop(self, user_id: str, blocker: str, taker: str) -> bool:
        """Drop a blocker that is finished or gone (True), waking whoever is earliest and parked unless that
        is ``taker``, which asks again at once."""
        state = _text(self.redis.hget(keys.status(user_id, blocker), "state"))
        if state in (MessageState.QUEUED.value, MessageState.EXTRACTED.value):
            return False
        self._pass(user_id, blocker, keep=taker)
        return True

    def _wake(self, user_id: str, message_id: str, trace: str | bytes | None) -> None:
        """Put the extract task of a parked message on its queue (the producer's wire format) at the end
        workers take from next: it has waited its turn already, and a user's whole burst waits on it, so it
        does not queue again behind messages enqueued since (kombu LPUSHes and BRPOPs: RPUSH is the front).
        ``trace``, the context it parked with, goes in the task's headers: its trace goes on where it parked."""
        queue = keys.queue_for(keys.EXTRACT_TASK)
        message = task_message(
            keys.EXTRACT_TASK, str(uuid.uuid4()), (user_id, message_id), queue, time.time(), _headers(trace)
        )
        self.redis.rpush(keys.queue_key(queue), message)

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
