"""The "changed users" record the maintenance fan-out reads (``engram_workers.maintenance.fanout``).

Every ``UserWrite.finish`` that changed what a maintenance job looks at adds the user to one Redis sorted
set, scored by a fleet-wide write sequence (``INCR``, in the same script): a job that remembers the
highest sequence it has taken in finds exactly the users written since, however many users exist.

Invariants:
- A member's score is the sequence of the user's *last* marked write, so a re-written user moves to the
  end and is taken in again by every job that has already seen its earlier write.
- The set holds only users written since the slowest job last took changes in (the fan-out trims the
  rest), and an erased user leaves it and every job's to-do set at once: ``forget_changes`` runs in the
  erasure's ``finish``, so an erased user id is not kept here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.ledger.maintenance import MARK_CHANGED, MarkArgs, MarkKeys

if TYPE_CHECKING:
    import redis

__all__ = ["FANNED_OUT", "forget_changes", "mark_changed"]

# The maintenance jobs that keep a per-user to-do set (their Beat entry fans out over it).
FANNED_OUT = ("decay", "hierarchy", "reconcile", "reembed")


def mark_changed(client: redis.Redis, user_id: str) -> None:
    """Record that ``user_id`` was written (one round trip)."""
    MARK_CHANGED(client, MarkKeys(keys.MAINTENANCE_CHANGED, keys.MAINTENANCE_SEQUENCE), MarkArgs(user_id))


def forget_changes(client: redis.Redis, user_id: str) -> None:
    """Drop an erased user from the changed set and every job's to-do set."""
    with client.pipeline(transaction=False) as pipe:
        for key in (keys.MAINTENANCE_CHANGED, *(keys.maintenance_todo(job) for job in FANNED_OUT)):
            pipe.zrem(key, user_id)
        pipe.execute()
