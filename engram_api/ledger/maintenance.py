"""The Lua scripts of the maintenance fan-out (``engram_workers.maintenance.fanout``) and of the changed
set every writer keeps for it (``engram_api.storage.writer.changes``), beside the other scripts so that
every script Engram runs has one home and one calling convention (``scripts.LuaScript``).

Invariants:
- Marking a user written takes the next fleet-wide sequence number and sets it as the user's score in
  one script: a re-written user moves to the end of the changed set.
- A take-in moves the job's mark past exactly the users it copied; the changed set is trimmed only below
  the lowest mark of every change-driven job, and not at all while one of them never ran.
- A claim and a release decide on Redis' own clock, atomically: two drivers never claim the same user in
  one claim window, and a release removes a user only while the claim it was sent with still stands.
"""

from __future__ import annotations

from typing import NamedTuple

from engram_api.ledger.scripts import NOW_MS, LuaScript

__all__ = ["CLAIM_USERS", "MARK_CHANGED", "RELEASE_USERS", "TAKE_IN"]


class MarkKeys(NamedTuple):
    changed: str
    sequence: str


class MarkArgs(NamedTuple):
    user_id: str


MARK_CHANGED = LuaScript(MarkKeys, MarkArgs, "redis.call('ZADD', K.changed, redis.call('INCR', K.sequence), A.user_id)")


class TakeInKeys(NamedTuple):
    changed: str
    todo: str
    seen: str
    hierarchy_seen: str
    reconcile_seen: str


class PageArgs(NamedTuple):
    page: int


# Takes the next page of users written after this job's mark into its to-do set as unclaimed (0; this also
# un-claims a user written again while a task has it), moves the mark, and trims the changed set below every
# change-driven job's mark (nothing while one of them never ran). Returns how many users it took in.
TAKE_IN = LuaScript(
    TakeInKeys,
    PageArgs,
    """
local mark = redis.call('GET', K.seen) or '0'
local rows = redis.call('ZRANGEBYSCORE', K.changed, '(' .. mark, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(A.page))
for i = 1, #rows, 2 do redis.call('ZADD', K.todo, 0, rows[i]) end
if #rows > 0 then redis.call('SET', K.seen, rows[#rows]) end
local low = nil
for _, key in ipairs({K.hierarchy_seen, K.reconcile_seen}) do
  local s = redis.call('GET', key)
  if not s then return #rows / 2 end
  if low == nil or tonumber(s) < tonumber(low) then low = s end
end
redis.call('ZREMRANGEBYSCORE', K.changed, '-inf', low)
return #rows / 2
""",
)


class TodoKeys(NamedTuple):
    todo: str


class ClaimArgs(NamedTuple):
    claim_ms: int
    page: int


# Claims up to a page of unclaimed or lapsed users on the Redis clock (one clock for every host). Returns
# the deadline followed by the claimed users.
CLAIM_USERS = LuaScript(
    TodoKeys,
    ClaimArgs,
    NOW_MS
    + """
local deadline = now + tonumber(A.claim_ms)
local users = redis.call('ZRANGEBYSCORE', K.todo, '-inf', now, 'LIMIT', 0, tonumber(A.page))
for _, u in ipairs(users) do redis.call('ZADD', K.todo, deadline, u) end
table.insert(users, 1, tostring(deadline))
return users
""",
)


class ReleaseArgs(NamedTuple):
    claim: int


# Removes the users (the variable tail) still held by that claim; returns how many.
RELEASE_USERS = LuaScript(
    TodoKeys,
    ReleaseArgs,
    """
local n = 0
for i = REST, #ARGV do
  local score = redis.call('ZSCORE', K.todo, ARGV[i])
  if score and tonumber(score) == tonumber(A.claim) then n = n + redis.call('ZREM', K.todo, ARGV[i]) end
end
return n
""",
    rest="user ids",
)
