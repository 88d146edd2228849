"""Strength decay and archival.

The store applies the closed form ``strength *= per_day ** days_since_last_decay`` and stamps
``last_decay_at = now``, so the job has no memory of its own: a run that Beat doubles changes nothing
the second time and a missed day is caught up by the next run.

Episodes never decay unless ``decay_episodes`` is on. Then the rule is age, not strength (a chunk has
none): the chunks of every episode whose event time is more than ``episode_max_age_days`` before ``now``
leave recall (their vectors and keyword entries are deleted); the episode stays as provenance of its
facts, and reconcile's backfill skips it for as long as the setting is on.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from engram_api.errors import InvalidInputError
from engram_api.models import check_aware, utcnow
from engram_api.settings import Settings
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.maintenance._common import Guard, UserFailure, guarded, isolate, target_users

__all__ = ["DecayReport", "DecayUser", "episode_cutoff", "run_decay"]


class DecayUser(BaseModel):
    user_id: str
    decayed: int
    archived: int
    episode_chunks_removed: int = 0
    version: int = Field(description="the user's graph version after the run")


class DecayReport(BaseModel):
    now: datetime
    per_day: float
    threshold: float
    users: int = 0
    decayed: int = 0
    archived: int = 0
    episode_chunks_removed: int = 0
    per_user: list[DecayUser] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


# Hosts' clocks differ a little; a few minutes ahead is skew, not a request to age everything.
_CLOCK_SKEW = timedelta(minutes=5)


def episode_cutoff(settings: Settings, now: datetime) -> datetime | None:
    """Episodes with an event time before this are out of recall; None while episodes do not decay."""
    return now - timedelta(days=settings.episode_max_age_days) if settings.decay_episodes else None


def run_decay(
    *,
    graph: GraphStore,
    settings: Settings,
    guard: Guard,
    now: datetime,
    user_ids: list[str] | None = None,
) -> DecayReport:
    """Decay every fact of each user to ``now`` and archive those below ``settings.archive_threshold``."""
    when = check_aware(now, "now")
    if when is None:
        raise InvalidInputError("now", "is required: decay is measured up to this instant")
    if when > utcnow() + _CLOCK_SKEW:
        # A future instant would decay (and archive) every fact by years at once: never a real run.
        raise InvalidInputError("now", f"must not be in the future (got {when.isoformat()})")
    report = DecayReport(now=when, per_day=settings.decay_per_day, threshold=settings.archive_threshold)
    for user_id in target_users(graph, user_ids):

        def decay(write: UserWrite) -> tuple[int, int, int, int]:
            decayed, archived = graph.decay(
                write.user_id,
                now=when,
                per_day=settings.decay_per_day,
                threshold=settings.archive_threshold,
                batch=settings.maintenance_batch,
            )
            removed = _expire_episodes(graph, write.user_id, episode_cutoff(settings, when))
            # Strengths change no embedding: the index moves by the removed chunks only (often an empty delta).
            # Only an archival or a removed chunk changes what the other jobs look at (``fanout``).
            after = write.finish(removals=removed, changed=bool(archived or removed))
            return decayed, archived, len(removed), after.version

        with isolate("decay", user_id, report.failed):
            decayed, archived, removed, after = guarded(guard, user_id, decay)
            report.users += 1
            report.decayed += decayed
            report.archived += archived
            report.episode_chunks_removed += removed
            report.per_user.append(
                DecayUser(
                    user_id=user_id, decayed=decayed, archived=archived, episode_chunks_removed=removed, version=after
                )
            )
    return report


def _expire_episodes(graph: GraphStore, user_id: str, cutoff: datetime | None) -> list[str]:
    """Remove the chunks of the user's episodes older than ``cutoff`` (nothing when it is None)."""
    if cutoff is None:
        return []
    old = [e.id for e in graph.episodes(user_id) if e.event_time < cutoff]
    chunks = graph.get_chunks(user_id, episode_ids=old) if old else []
    return graph.remove_chunks(user_id, [c.id for c in chunks]) if chunks else []
