"""Every Lua script of the message lifecycle, each with named KEYS and ARGV (run by ``lua.LuaScript``).

Each script declares its keys and its arguments as two ``NamedTuple`` classes; a caller builds those (by
name, checked by the type checker) and never writes ``KEYS[n]``; the script's text reads them as ``K.<key
name>`` and ``A.<argument name>`` (``engram_api.ledger.lua``). The scripts that are not part of a message's
life (the published stamp, the LLM controls) are in ``controls``.

Invariants shared by the lifecycle scripts (``MessageLedger`` calls them):
- Every write for a message checks its tombstone (``forgotten``) in the same script: a stage that was
  running when the message was forgotten writes nothing back (``engram_api.ledger.erasure``).
- A finished message (applied, dead-lettered, forgotten) leaves its user's backlog (``pending``) and the
  ready set in the script that finishes it; an applied message's payload and extraction go with it.
- Status hashes, payloads and extractions carry the status TTL, refreshed by every write.
- Every script that sets a TTL on a key of a message files the message in its user's index
  (``keys.user_messages``) at that time and gives the index the same TTL, so an index member older than
  the TTL names only expired keys (the scripts that finish a message, ``STAGE_WRITE`` and ``DEAD_LETTER``,
  drop those), except ``ENQUEUE``: from its enqueue until it finishes, a message is in its user's backlog
  (``keys.pending``, scored by the enqueue that set its keys' TTLs), and the scripts that finish it file
  it in the index as they take it out of the backlog. Erasure reads both, so it finds every message.
- An applied message keeps only its status hash (its ``task_id`` answers a duplicate ``enqueue`` with the
  original receipt; its timestamps are what the benchmarks and operators read) and its index entry: its
  payload, extraction and delivery counters (one key per stage started) go in the script that applies it.
"""

from __future__ import annotations

from typing import NamedTuple

from engram_api.ledger.lua import LuaScript
from engram_api.models import MessageState

__all__ = [
    "CLAIM_READY",
    "DEAD_LETTER",
    "DECR_IF_EXISTS",
    "DROP_SETTLED",
    "ENQUEUE",
    "ENTER",
    "NOW_MS",
    "STAGE_WRITE",
    "LuaScript",
    "NoArgs",
]

# Lua that sets ``now`` to Redis' own clock in ms: one clock for every host, whatever their skew.
NOW_MS = """local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


class NoArgs(NamedTuple):
    """ARGV of a script that takes none."""


class EnqueueKeys(NamedTuple):
    payload: str
    status: str
    queue: str
    pending: str
    tombstone: str
    in_flight: str
    order: str


class EnqueueArgs(NamedTuple):
    envelope: str
    task_id: str
    ttl: int
    now: float
    message: str
    message_id: str
    limit: int
    ref: str
    event_time: float


# The producer's enqueue: payload, status, backlog entry, its place in the user's extraction order (by event
# time, ``engram_api.ledger.turns``) and the task message on the queue, all or nothing.
# Returns the existing task id for a known message id, {pending} when the user's backlog is full (nothing
# written), else "". Enqueueing a message id again after it was forgotten is a new message: its tombstone goes.
# The status's HSETNX of the task id is both the idempotency check and the script's first write, on purpose:
# Redis checks maxmemory only at a script's first write (a ZREMRANGEBYSCORE first, which never refuses, once
# let every enqueue past the limit), and a full backlog takes back only that field. Backlog entries older
# than the TTL (messages lost to a crash) are dropped only when they would refuse the message: the common
# enqueue sends no trim (issue 45: enqueue's cost), and ``backlogs`` does not count them. The backlog entry
# is also what erasure finds a queued message by: the user's message index (``keys.user_messages``) gets it
# from the scripts that write the message later (``ENTER``, ``STAGE_WRITE``, ``DEAD_LETTER``).
ENQUEUE = LuaScript(
    EnqueueKeys,
    EnqueueArgs,
    f"""
if redis.call('HSETNX', K.status, 'task_id', A.task_id) == 0 then return redis.call('HGET', K.status, 'task_id') end
local pending = redis.call('ZCARD', K.pending)
if pending >= tonumber(A.limit) then
  redis.call('ZREMRANGEBYSCORE', K.pending, '-inf', tonumber(A.now) - tonumber(A.ttl))
  pending = redis.call('ZCARD', K.pending)
  if pending >= tonumber(A.limit) then
    redis.call('HDEL', K.status, 'task_id')
    return {{pending}}
  end
end
redis.call('SET', K.payload, A.envelope, 'EX', A.ttl)
redis.call('ZADD', K.pending, A.now, A.message_id)
redis.call('ZADD', K.in_flight, A.now, A.ref)
redis.call('ZADD', K.order, A.event_time, A.message_id)
redis.call('EXPIRE', K.order, A.ttl)
redis.call('DEL', K.tombstone)
redis.call('EXPIRE', K.pending, A.ttl)
redis.call('HSET', K.status, 'state', '{MessageState.QUEUED.value}', 'enqueued_at', A.now)
redis.call('EXPIRE', K.status, A.ttl)
redis.call('LPUSH', K.queue, A.message)
return ''
""",
)


class EnterKeys(NamedTuple):
    deliveries: str
    status: str
    tombstone: str
    messages: str


class EnterArgs(NamedTuple):
    ttl: int
    now: float
    message_id: str


# A start of a stage, in one round trip: a message already finished (applied, dead) or forgotten is not
# counted, since its task has nothing to do; otherwise the start is counted. The counter outlives a
# finished start (back at 0), so its absence says no start of this stage came before. Returns {count or 0,
# state, forgotten, earlier start}.
ENTER = LuaScript(
    EnterKeys,
    EnterArgs,
    f"""
local state = redis.call('HGET', K.status, 'state') or ''
local forgotten = redis.call('EXISTS', K.tombstone)
local earlier = redis.call('EXISTS', K.deliveries)
if forgotten == 1 or state == '{MessageState.APPLIED.value}' or state == '{MessageState.DEAD.value}' then
  return {{0, state, forgotten, earlier}}
end
local n = redis.call('INCR', K.deliveries)
redis.call('EXPIRE', K.deliveries, A.ttl)
redis.call('ZADD', K.messages, A.now, A.message_id)
redis.call('EXPIRE', K.messages, A.ttl)
return {{n, state, forgotten, earlier}}
""",
)


class CounterKeys(NamedTuple):
    counter: str


# The end of a counted start. Only an existing counter: one erased meanwhile (forgotten) stays gone.
DECR_IF_EXISTS = LuaScript(
    CounterKeys,
    NoArgs,
    """
if redis.call('EXISTS', K.counter) == 1 then return redis.call('DECR', K.counter) end
return 0
""",
)


class StageWriteKeys(NamedTuple):
    tombstone: str
    status: str
    extraction: str
    pending: str
    ready: str
    payload: str
    in_flight: str
    in_flight_extracted: str
    messages: str
    extract_deliveries: str
    apply_deliveries: str


class StageWriteArgs(NamedTuple):
    ttl: int
    now: float
    extraction: str  # '' = none
    event_time: str
    finished: str  # '1' / '0'
    message_id: str
    applied: str  # '1' / '0'
    ref: str
    since_field: str  # the status field the message waits since ('' = none: finished)
    extracted: str  # '1': the message waits for apply (filed in ``in_flight_extracted`` too) / '0'


# A stage's status write (REST: field, value, ...). A stored extraction makes the message ready to apply
# (scored by event time); a finished message leaves its user's backlog, the ready set and the in-flight
# index; an unfinished one is filed in the index since its status's ``since_field`` (an extracted one in
# the extracted share as well, any other taken out of it); an applied
# message's payload, extraction and delivery counters go with its status write. Returns 0 (nothing
# written) when forgotten.
STAGE_WRITE = LuaScript(
    StageWriteKeys,
    StageWriteArgs,
    """
if redis.call('EXISTS', K.tombstone) == 1 then return 0 end
if A.extraction ~= '' then
  redis.call('SET', K.extraction, A.extraction, 'EX', A.ttl)
  redis.call('ZADD', K.ready, A.event_time, A.message_id)
  redis.call('EXPIRE', K.ready, A.ttl)
end
if A.finished == '1' then
  redis.call('ZREM', K.pending, A.message_id)
  redis.call('ZREM', K.ready, A.message_id)
  redis.call('ZREMRANGEBYSCORE', K.messages, '-inf', tonumber(A.now) - tonumber(A.ttl))
end
if A.applied == '1' then
  redis.call('DEL', K.payload, K.extraction, K.extract_deliveries, K.apply_deliveries)
end
redis.call('HSET', K.status, unpack(ARGV, REST))
redis.call('EXPIRE', K.status, A.ttl)
redis.call('ZADD', K.messages, A.now, A.message_id)
redis.call('EXPIRE', K.messages, A.ttl)
if A.finished == '1' then
  redis.call('ZREM', K.in_flight, A.ref)
  redis.call('ZREM', K.in_flight_extracted, A.ref)
elseif A.since_field ~= '' then
  local since = redis.call('HGET', K.status, A.since_field)
  if since then redis.call('ZADD', K.in_flight, since, A.ref) end
  if since and A.extracted == '1' then
    redis.call('ZADD', K.in_flight_extracted, since, A.ref)
  else
    redis.call('ZREM', K.in_flight_extracted, A.ref)
  end
end
return 1
""",
    rest="status fields and values",
)


class ClaimKeys(NamedTuple):
    ready: str


class ClaimArgs(NamedTuple):
    trigger: str
    others: int


# An apply batch's claim: the trigger leaves the ready set (it is being applied), and up to ``others`` more
# leave it too, earliest event first; returns their ids.
CLAIM_READY = LuaScript(
    ClaimKeys,
    ClaimArgs,
    """
redis.call('ZREM', K.ready, A.trigger)
local n = tonumber(A.others)
if n <= 0 then return {} end
local ids = redis.call('ZRANGE', K.ready, 0, n - 1)
if #ids > 0 then redis.call('ZREM', K.ready, unpack(ids)) end
return ids
""",
)


class DeadLetterKeys(NamedTuple):
    tombstone: str
    letter: str
    user_letters: str
    letters: str
    status: str
    payload: str
    extraction: str
    pending: str
    ready: str
    in_flight: str
    in_flight_extracted: str
    messages: str


class DeadLetterArgs(NamedTuple):
    letter: str
    failed_at: float
    reason: str
    ttl: int
    now: float
    message_id: str
    ref: str


# A dead letter: never for a forgotten message (returns 0, nothing written). The letter is its own key,
# filed by failure time in its user's index and the fleet-wide one. It keeps the envelope, so the payload
# and extraction go; the message leaves the backlog, the ready set and the in-flight index.
DEAD_LETTER = LuaScript(
    DeadLetterKeys,
    DeadLetterArgs,
    f"""
if redis.call('EXISTS', K.tombstone) == 1 then return 0 end
redis.call('ZREM', K.pending, A.message_id)
redis.call('ZREM', K.ready, A.message_id)
redis.call('ZREM', K.in_flight, A.ref)
redis.call('ZREM', K.in_flight_extracted, A.ref)
redis.call('ZREMRANGEBYSCORE', K.messages, '-inf', tonumber(A.now) - tonumber(A.ttl))
redis.call('SET', K.letter, A.letter)
redis.call('ZADD', K.user_letters, A.failed_at, A.message_id)
redis.call('ZADD', K.letters, A.failed_at, A.ref)
redis.call('HSET', K.status, 'state', '{MessageState.DEAD.value}', 'reason', A.reason)
redis.call('EXPIRE', K.status, A.ttl)
redis.call('ZADD', K.messages, A.now, A.message_id)
redis.call('EXPIRE', K.messages, A.ttl)
redis.call('DEL', K.payload, K.extraction)
return 1
""",
)


class SettledKeys(NamedTuple):
    in_flight: str
    in_flight_extracted: str
    status: str


class SettledArgs(NamedTuple):
    ref: str


# An in-flight member whose status no longer says queued or extracted (expired, or written by hand) leaves
# the index; checked in the script, so a message enqueued again meanwhile keeps its fresh entry. Returns 1
# when it was dropped.
DROP_SETTLED = LuaScript(
    SettledKeys,
    SettledArgs,
    f"""
local state = redis.call('HGET', K.status, 'state')
if state == '{MessageState.QUEUED.value}' or state == '{MessageState.EXTRACTED.value}' then return 0 end
redis.call('ZREM', K.in_flight_extracted, A.ref)
return redis.call('ZREM', K.in_flight, A.ref)
""",
)
