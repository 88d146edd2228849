"""What every maintenance job shares: the guard type, which users to visit, per-user failure isolation
and re-stamping the FAISS index after a write that bumped the graph version."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from pydantic import BaseModel

from engram_api.errors import InvalidInputError
from engram_api.models import check_user_id
from engram_api.storage.base import GraphStore
from engram_api.storage.indexes import IndexKeeper

__all__ = ["Guard", "UserFailure", "isolate", "restamp", "target_users"]

log = logging.getLogger("engram.maintenance")

MAX_USER_IDS = 10_000  # per job call; a larger fleet is visited by passing None

# The workers pass a fleet-wide per-user Redis lock so maintenance never races the apply stage.
Guard = Callable[[str], AbstractContextManager[None]]


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


def restamp(keeper: IndexKeeper, user_id: str, *, before: int, after: int) -> None:
    """Move the FAISS index to the new graph version without a rebuild: maintenance writes change
    strengths, flags or clusters, never an embedding, so the delta is empty."""
    if after != before:
        keeper.advance(user_id, from_version=before, to_version=after)
