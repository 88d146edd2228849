"""Fanning a maintenance job out over per-user tasks, visiting only the users it has work for.

Beat fires a small *driver* per job (``drive``); the driver fills the job's to-do set (``keys.maintenance_todo``),
claims it page by page and sends one task per page of at most ``USERS_PER_TASK`` users. Each task runs
the job's plain function on its users and then ``release``s the ones it finished. The to-do set is the
cursor: whatever a task did not release (it died, was dropped as expired, or a user failed) is claimed
again by a later driver run once the claim lapses, so every user is visited at least once.

Where the to-do set comes from:
- ``hierarchy`` and ``reconcile``: the users written since the job last took changes in (the changed set
  ``UserWrite.finish`` keeps; ``engram_api.storage.writer.changes``), so a run costs the users that changed,
  not the users that exist. The first run ever (no ``seen`` mark yet) takes every stored user once: users
  written before the changed set existed must not be skipped forever.
- ``reembed``: the users with a chunk whose vector was made under another chunk-vector policy
  (``maintenance.reembed.reembed_users``); none, after one read, once the store records the settings' one.
- ``decay``: the users with a fact due for archival (``GraphStore.users_due``, read from the stores' due
  index; ``maintenance.decay.decay_users``). Recall computes a fact's strength when it reads it
  (``storage.graph.fading``), so a user with nothing due is not visited at all; only while
  ``decay_episodes`` is on does it take every stored user, whose old episodes it reads by age.

Invariants:
- A claim is atomic (one script): two drivers never send the same user in the same claim window.
- ``release`` removes a user only while the claim it was sent with still stands; a user written again
  after the claim was taken is reset to unclaimed by the next take-in and visited again.
- Each task's users are one job's, each visited under its own guard: a task never mixes users' data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import redis
from pydantic import BaseModel, Field

from engram_api import keys
from engram_api.ledger.maintenance import (
    CLAIM_USERS,
    RELEASE_USERS,
    TAKE_IN,
    ClaimArgs,
    PageArgs,
    ReleaseArgs,
    TakeInKeys,
    TodoKeys,
)
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.changes import FANNED_OUT
from engram_workers.maintenance._common import UserFailure

__all__ = ["USERS_PER_TASK", "Chunk", "FanOutReport", "Job", "Send", "drive", "release"]

Job = Literal["decay", "hierarchy", "reconcile", "reembed"]
# The jobs whose driver is handed the users it has work for (``due``) instead of the changed set.
_GIVEN_USERS = ("decay", "reembed")
USERS_PER_TASK = 100
# Changed users taken into a to-do set per script call: bounds how long one call holds Redis.
_PAGE = 1000


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


def drive(
    *,
    job: Job,
    client: redis.Redis,
    graph: GraphStore,
    send: Send,
    claim_s: float,
    due: Sequence[str] | None = None,
) -> FanOutReport:
    """Fill ``job``'s to-do set and send its users in tasks, each claimed for ``claim_s`` seconds. ``due``:
    the users decay or reembed has work for (``decay.decay_users``, ``reembed.reembed_users``), required
    for them and for them only."""
    if job not in FANNED_OUT:
        raise ValueError(f"{job!r} is not a fanned-out maintenance job ({', '.join(FANNED_OUT)})")
    if (due is None) != (job not in _GIVEN_USERS):
        raise ValueError("decay's and reembed's drivers take the users they have work for (due); the others none")
    report = FanOutReport(job=job)
    if due is not None:
        report.taken_in = _take_in_all(client, job, list(due))
    else:
        if client.get(keys.maintenance_seen(job)) is None:
            # First run: every stored user, then only the writes after this sequence number.
            mark = client.get(keys.MAINTENANCE_SEQUENCE) or "0"
            report.taken_in = _take_in_all(client, job, graph.list_users())
            client.set(keys.maintenance_seen(job), mark, nx=True)
        report.taken_in += _take_in_changed(client, job)
    while True:
        claimed = CLAIM_USERS(
            client, TodoKeys(keys.maintenance_todo(job)), ClaimArgs(int(claim_s * 1000), USERS_PER_TASK)
        )
        deadline, *users = claimed
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
    if not done:
        return 0
    return int(RELEASE_USERS(client, TodoKeys(keys.maintenance_todo(chunk.job)), ReleaseArgs(chunk.claim), *done))


def _take_in_all(client: redis.Redis, job: str, user_ids: list[str]) -> int:
    """Every given user into the to-do set, unclaimed unless a live claim already covers it."""
    for start in range(0, len(user_ids), _PAGE):
        client.zadd(keys.maintenance_todo(job), dict.fromkeys(user_ids[start : start + _PAGE], 0), nx=True)
    return len(user_ids)


def _take_in_changed(client: redis.Redis, job: str) -> int:
    # The changed set is trimmed below the lowest mark of the jobs it feeds (hierarchy and reconcile).
    take_keys = TakeInKeys(
        changed=keys.MAINTENANCE_CHANGED,
        todo=keys.maintenance_todo(job),
        seen=keys.maintenance_seen(job),
        hierarchy_seen=keys.maintenance_seen("hierarchy"),
        reconcile_seen=keys.maintenance_seen("reconcile"),
    )
    taken = 0
    while True:
        page = int(TAKE_IN(client, take_keys, PageArgs(_PAGE)))
        taken += page
        if page < _PAGE:
            return taken
