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

if TYPE_CHECKING:
    import redis

__all__ = ["CHANGED", "FANNED_OUT", "SEQUENCE", "forget_changes", "mark_changed", "seen", "todo"]

CHANGED = f"{keys.PREFIX}:maint:changed"
SEQUENCE = f"{keys.PREFIX}:maint:seq"
# The maintenance jobs that keep a per-user to-do set (their Beat entry fans out over it).
FANNED_OUT = ("decay", "hierarchy", "reconcile")


def todo(job: str) -> str:
    """Sorted set user id -> claim deadline (ms, Redis clock; 0 = not claimed) of the users ``job`` must visit."""
    return f"{keys.PREFIX}:maint:{job}:todo"


def seen(job: str) -> str:
    """The highest write sequence ``job`` has taken into its to-do set (absent: the job never ran)."""
    return f"{keys.PREFIX}:maint:{job}:seen"


# KEYS: changed set, sequence. ARGV: user id.
_MARK = "redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[1])"


def mark_changed(client: redis.Redis, user_id: str) -> None:
    """Record that ``user_id`` was written (one round trip)."""
    client.eval(_MARK, 2, CHANGED, SEQUENCE, user_id)


def forget_changes(client: redis.Redis, user_id: str) -> None:
    """Drop an erased user from the changed set and every job's to-do set."""
    with client.pipeline(transaction=False) as pipe:
        for key in (CHANGED, *(todo(job) for job in FANNED_OUT)):
            pipe.zrem(key, user_id)
        pipe.execute()
