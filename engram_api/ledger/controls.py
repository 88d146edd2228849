"""The Lua scripts outside a message's life, beside the lifecycle's so that every script Engram runs has
one home and one calling convention (``scripts.LuaScript``): the user's published version stamp
(``engram_api.versions``), a recall's log (``engram_api.reader.background``) and the two fleet-wide LLM
controls (``engram_workers.control``).

Invariants:
- The published stamp only moves forward, and only while the writer's lease token holds (when given).
- A recall's log and its entry in the user's index of recall logs are written together (erasure finds the
  logs by that index, never by scanning).
- The rate limit and the breaker decide on Redis' own clock and state, atomically: no worker's clock or
  race can let a call through that the fleet-wide state refuses.
"""

from __future__ import annotations

from typing import NamedTuple

from engram_api.ledger.scripts import NOW_MS, LuaScript

__all__ = ["ADMIT", "GCRA", "LOG_RECALL", "PUBLISH_STAMP", "RECORD_FAILURE"]


class StampKeys(NamedTuple):
    stamp: str
    lease: str
    feed: str  # the user's change feed (``keys.change_feed``)


class StampArgs(NamedTuple):
    epoch: str
    version: str
    lease_token: str  # '' = no lease to check
    channel: str  # where a stamp that moved forward is sent (readers' hint)
    user_id: str
    scrub: str  # '1': delete the change feed first (the write removed records, or nothing says it did not)
    entry: str  # '' = none; else this write's change-feed entry, added when the stamp moves forward
    feed_length: int  # entries kept
    feed_ttl_ms: int  # the feed expires this long after its last entry


# The published stamp only moves forward, and only while the lease token holds (when given); a stamp that
# moved forward is also sent on the stamps channel, with its change-feed entry (when given) added in the
# same step, so a reader never finds an entry ahead of the stamp. A scrub deletes the feed whatever else
# happens (it only ever costs a reader a read of the graph). Numbers are compared as decimal strings
# (length, then text): epochs exceed Lua's exact integer range; a version is a write count, exact as a score.
PUBLISH_STAMP = LuaScript(
    StampKeys,
    StampArgs,
    """
if A.scrub == '1' then redis.call('DEL', K.feed) end
if A.lease_token ~= '' and redis.call('GET', K.lease) ~= A.lease_token then return 0 end
local function less(a, b) return #a < #b or (#a == #b and a < b) end
local cur = redis.call('GET', K.stamp)
if cur then
  local e, v = string.match(cur, '^(%d+):(%d+)$')
  if e and (less(A.epoch, e) or (A.epoch == e and not less(v, A.version))) then return 1 end
end
redis.call('SET', K.stamp, A.epoch .. ':' .. A.version)
if A.entry ~= '' then
  redis.call('ZADD', K.feed, A.version, A.entry)
  redis.call('ZREMRANGEBYRANK', K.feed, 0, -1 - tonumber(A.feed_length))
  redis.call('PEXPIRE', K.feed, A.feed_ttl_ms)
end
redis.call('PUBLISH', A.channel, A.user_id .. ' ' .. A.epoch .. ':' .. A.version)
return 1
""",
)


class RecallLogKeys(NamedTuple):
    log: str  # the recall's log (``keys.recall_log``)
    logs: str  # the user's index of recall logs (``keys.recall_logs``)


class RecallLogArgs(NamedTuple):
    rows: str  # the log: its results' score components by id, as JSON
    recall_id: str
    now: float  # epoch seconds: the index entry's score
    expired: float  # index entries scored up to this are dropped (their logs have expired)
    ttl_s: int  # the log lives this long, and the index as long as its newest log


# A recall's log (what ``feedback`` turns into training rows) and its entry in the user's index, one
# ``EVALSHA``: the MULTI of four commands it replaces cost ~3x its CPU in the reader's process (redis-py's
# Python per command, docs/benchmarks/history.md, issue 42, 2026-12-07, night).
LOG_RECALL = LuaScript(
    RecallLogKeys,
    RecallLogArgs,
    """
redis.call('SET', K.log, A.rows, 'EX', A.ttl_s)
redis.call('ZREMRANGEBYSCORE', K.logs, '-inf', A.expired)
redis.call('ZADD', K.logs, A.now, A.recall_id)
redis.call('EXPIRE', K.logs, A.ttl_s)
""",
)


class BucketKeys(NamedTuple):
    bucket: str


class BucketArgs(NamedTuple):
    interval_ms: int


# The LLM rate limit (GCRA). Returns 0 when granted, else ms to wait. Redis' own clock is used, so workers
# with skewed clocks still share one schedule.
GCRA = LuaScript(
    BucketKeys,
    BucketArgs,
    NOW_MS
    + """
local interval = tonumber(A.interval_ms)
local tat = tonumber(redis.call('GET', K.bucket) or '0')
if tat < now then tat = now end
if tat - now > 0 then return tat - now end
redis.call('SET', K.bucket, tat + interval, 'PX', interval * 2 + 1000)
return 0
""",
)


class AdmitKeys(NamedTuple):
    open: str
    tripped: str
    trial: str
    stats: str


class AdmitArgs(NamedTuple):
    trial_ms: int


# The LLM breaker's admission. Returns {0, 0} to call (closed), {1, 0} to call as the half-open trial,
# {2, ms} to refuse (retry in ms); every decision is counted in stats.
ADMIT = LuaScript(
    AdmitKeys,
    AdmitArgs,
    """
local ttl = redis.call('PTTL', K.open)
if ttl > 0 then
  redis.call('HINCRBY', K.stats, 'rejected', 1)
  return {2, ttl}
end
if redis.call('EXISTS', K.tripped) == 0 then
  redis.call('HINCRBY', K.stats, 'admitted', 1)
  return {0, 0}
end
if redis.call('SET', K.trial, '1', 'NX', 'PX', A.trial_ms) then
  redis.call('HINCRBY', K.stats, 'trials', 1)
  return {1, 0}
end
redis.call('HINCRBY', K.stats, 'rejected', 1)
return {2, math.floor(tonumber(A.trial_ms) / 2)}
""",
)


class FailureKeys(NamedTuple):
    failures: str
    open: str
    tripped: str
    stats: str


class FailureArgs(NamedTuple):
    fail_max: int
    reset_ms: int


# A failed LLM call: the breaker opens at fail_max consecutive failures, or at any failure while tripped
# (a failed trial). Returns 1 when this failure opened it.
RECORD_FAILURE = LuaScript(
    FailureKeys,
    FailureArgs,
    """
local n = redis.call('INCR', K.failures)
redis.call('PEXPIRE', K.failures, A.reset_ms * 10)
if n >= tonumber(A.fail_max) or redis.call('EXISTS', K.tripped) == 1 then
  redis.call('SET', K.open, '1', 'PX', A.reset_ms)
  redis.call('SET', K.tripped, '1')
  redis.call('DEL', K.failures)
  redis.call('HINCRBY', K.stats, 'opened', 1)
  return 1
end
return 0
""",
)
