"""What every maintenance job shares: the guard type, which users to visit, per-user failure isolation
and running one user's write as a fenced, re-planned ``UserWrite``.

Invariants:
- A job's write of a user runs inside its guard (the workers' ``UserWrites.open``: the fleet-wide lease
  and the fence), re-planned by the writer's one loop (``userwrite.replanned``) when the fence refuses it.
- One user's failure is recorded, never raised: the job goes on for everyone else and is safe to re-run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

from pydantic import BaseModel

from engram_api.errors import InvalidInputError
from engram_api.models import check_user_id
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.userwrite import UserWrite, replanned

__all__ = ["Guard", "UserFailure", "guarded", "isolate", "target_users"]

log = logging.getLogger("engram.maintenance")

MAX_USER_IDS = 10_000  # per job call; a larger fleet is visited by passing None

# The workers pass ``UserWrites.open``: the fleet-wide per-user lease plus the fence, so maintenance
# never races the apply stage and publishes only the users it changed.
Guard = Callable[[str], AbstractContextManager[UserWrite]]
_T = TypeVar("_T")
# A refused (fenced) write means another writer got in after our lease lapsed: plan again this often.
_ATTEMPTS = 3


class UserFailure(BaseModel):
    """One user a job could not finish (the lock was busy, the store failed, ...); retried next run."""

    user_id: str
    error: str


def target_users(graph: GraphStore, user_ids: list[str] | None) -> list[str]:
    """The users to visit: the given ones (validated, de-duplicated, in order) or every stored user."""
    if user_ids is None:
        return graph.list_users()
    if not isinstance(user_ids, list | tuple) or len(user_ids) > MAX_USER_IDS:
        raise InvalidInputError("user_ids", f"must be a list of at most {MAX_USER_IDS} user ids (or None: everyone)")
    return list(dict.fromkeys(check_user_id(u, "user_ids") for u in user_ids))


@contextmanager
def isolate(job: str, user_id: str, failures: list[UserFailure]) -> Iterator[None]:
    """Record and log a user's failure instead of raising it: one broken user (or a lock held by a long
    apply) must not stop the job for everyone else, and every job is safe to re-run."""
    try:
        yield
    except Exception as exc:
        log.exception("maintenance %s failed for user %s", job, user_id)
        failures.append(UserFailure(user_id=user_id, error=f"{type(exc).__name__}: {exc}"))


def guarded(guard: Guard, user_id: str, body: Callable[[UserWrite], _T]) -> _T:
    """``body`` inside the user's guard; planned again from fresh reads when a fenced write is refused."""
    return replanned(user_id, lambda _attempt: guard(user_id), body, attempts=_ATTEMPTS)
