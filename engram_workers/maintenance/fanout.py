"""Fanning a maintenance job out over per-user tasks, visiting only the users it has work for.

Beat fires a small *driver* per job (``drive``); the driver fills the job's to-do set (``changes.todo``),
claims it page by page and sends one task per page of at most ``USERS_PER_TASK`` users. Each task runs
the job's plain function on its users and then ``release``s the ones it finished. The to-do set is the
cursor: whatever a task did not release (it died, was dropped as expired, or a user failed) is claimed
again by a later driver run once the claim lapses, so every user is visited at least once.

Where the to-do set comes from:
- ``hierarchy`` and ``reconcile``: the users written since the job last took changes in (the changed set
  ``UserWrite.finish`` keeps; ``engram_api.storage.writer.changes``), so a run costs the users that changed,
  not the users that exist. The first run ever (no ``seen`` mark yet) takes every stored user once: users
  written before the changed set existed must not be skipped forever.
- ``decay``: every stored user, each run. Recall reads the stored strength, so every fact still has to be
  faded daily; the fan-out bounds each task, not the total (docs/operations.md "Maintenance").

Invariants:
- A claim is atomic (one script): two drivers never send the same user in the same claim window.
- ``release`` removes a user only while the claim it was sent with still stands; a user written again
  after the claim was taken is reset to unclaimed by the next take-in and visited again.
- Each task's users are one job's, each visited under its own guard: a task never mixes users' data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import redis
from pydantic import BaseModel, Field

from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.changes import CHANGED, FANNED_OUT, SEQUENCE, seen, todo
from engram_workers.maintenance._common import UserFailure

__all__ = ["USERS_PER_TASK", "Chunk", "FanOutReport", "Job", "Send", "drive", "release"]

Job = Literal["decay", "hierarchy", "reconcile"]
USERS_PER_TASK = 100
# Changed users taken into a to-do set per script call: bounds how long one call holds Redis.
_PAGE = 1000
# Jobs whose to-do set is fed by the changed set: the set is trimmed below the lowest of their marks.
_CHANGE_DRIVEN = ("hierarchy", "reconcile")


class Chunk(BaseModel):
    """One task's worth: the users and the claim they were sent with (``release`` checks it)."""

    job: str
    user_ids: list[str]
    claim: int = Field(description="claim deadline, ms on the Redis clock")


class FanOutReport(BaseModel):
    job: str
    taken_in: int = Field(0, description="users added to the to-do set by this run")
    queued: int = Field(0, description="users sent in tasks")
    tasks: int = 0
    failed: list[UserFailure] = Field(default_factory=list)


Send = Callable[[Chunk], object]
"""Publishes one chunk as a task (the worker sends the job's Celery task; tests may run it inline)."""

# KEYS: changed, this job's to-do, this job's seen, the seen of every change-driven job. ARGV: page size.
# Takes the next page of users written after this job's mark into its to-do set as unclaimed (0; this
# also un-claims a user written again while a task has it), moves the mark, and trims the changed set
# below every change-driven job's mark (nothing while one of them never ran).
_TAKE_IN = """
local mark = redis.call('GET', KEYS[3]) or '0'
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. mark, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
for i = 1, #rows, 2 do redis.call('ZADD', KEYS[2], 0, rows[i]) end
if #rows > 0 then redis.call('SET', KEYS[3], rows[#rows]) end
local low = nil
for i = 4, #KEYS do
  local s = redis.call('GET', KEYS[i])
  if not s then return #rows / 2 end
  if low == nil or tonumber(s) < tonumber(low) then low = s end
end
if low then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', low) end
return #rows / 2
"""

# KEYS: to-do. ARGV: claim length (ms), page size. Claims up to a page of unclaimed or lapsed users on
# the Redis clock (one clock for every host). Returns the deadline followed by the claimed users.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local users = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, u in ipairs(users) do redis.call('ZADD', KEYS[1], deadline, u) end
table.insert(users, 1, tostring(deadline))
return users
"""

# KEYS: to-do. ARGV: claim deadline, user ids. Removes the users still held by that claim.
_RELEASE = """
local n = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[1]) then n = n + redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return n
"""


def drive(*, job: Job, client: redis.Redis, graph: GraphStore, send: Send, claim_s: float) -> FanOutReport:
    """Fill ``job``'s to-do set and send its users in tasks, each claimed for ``claim_s`` seconds."""
    if job not in FANNED_OUT:
        raise ValueError(f"{job!r} is not a fanned-out maintenance job ({', '.join(FANNED_OUT)})")
    report = FanOutReport(job=job)
    if job == "decay":
        report.taken_in = _take_in_all(client, job, graph.list_users())
    else:
        if client.get(seen(job)) is None:
            # First run: every stored user, then only the writes after this sequence number.
            mark = client.get(SEQUENCE) or "0"
            report.taken_in = _take_in_all(client, job, graph.list_users())
            client.set(seen(job), mark, nx=True)
        report.taken_in += _take_in_changed(client, job)
    while True:
        deadline, *users = client.eval(_CLAIM, 1, todo(job), int(claim_s * 1000), USERS_PER_TASK)
        if not users:
            return report
        send(Chunk(job=job, user_ids=users, claim=int(deadline)))
        report.queued += len(users)
        report.tasks += 1


def release(client: redis.Redis, chunk: Chunk, failed: Iterable[UserFailure]) -> int:
    """After a task: take its users off the to-do set, except the failed ones (retried once the claim
    lapses) and any written again since the claim. Returns how many were removed."""
    broken = {f.user_id for f in failed}
    done = [u for u in chunk.user_ids if u not in broken]
    return int(client.eval(_RELEASE, 1, todo(chunk.job), chunk.claim, *done)) if done else 0


def _take_in_all(client: redis.Redis, job: str, user_ids: list[str]) -> int:
    """Every given user into the to-do set, unclaimed unless a live claim already covers it."""
    for start in range(0, len(user_ids), _PAGE):
        client.zadd(todo(job), dict.fromkeys(user_ids[start : start + _PAGE], 0), nx=True)
    return len(user_ids)


def _take_in_changed(client: redis.Redis, job: str) -> int:
    marks = [seen(j) for j in _CHANGE_DRIVEN]
    taken = 0
    while True:
        page = int(client.eval(_TAKE_IN, 3 + len(marks), CHANGED, todo(job), seen(job), *marks, _PAGE))
        taken += page
        if page < _PAGE:
            return taken
