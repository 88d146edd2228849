"""Archival of faded facts (decay itself is read, not written).

Recall computes a fact's effective strength when it reads it, ``strength * per_day ** days`` since the
strength was set (``engram_api.storage.graph.fading``), and every write that sets a strength stores the
instant it will fall below ``archive_threshold`` (``archive_due_at``). So this job no longer rewrites every
fact daily: it visits only the users with a fact due (``decay_users``: the stores' due index) and reads and
writes only those facts, archiving the ones below the threshold (the old job's test, so the same facts on
the same run). A user with nothing due keeps its version, so its readers reload nothing. When the policy
(``decay_per_day``, ``archive_threshold``) changed since the dues were computed, the driver (``decay_users``)
first recomputes every unarchived fact's due (``GraphStore.refresh_dues``). The job does it, not a store's
opening (every process opens the store, readers included, and a recompute writes every fact) nor
`engram migrate` (the Helm chart runs that in every pod's init container: each would start a full pass):
one driver a day, and the job is what reads the dues. The job has no memory of its own: a run that Beat
doubles changes nothing the second time, and a missed run is caught up by the next (everything due by
then).

Episodes never decay unless ``decay_episodes`` is on. Then the rule is age, not strength (a chunk has
none): the chunks of every episode whose event time is more than ``episode_max_age_days`` before ``now``
leave recall (their vectors and keyword entries are deleted); the episode stays as provenance of its
facts, and reconcile's backfill skips it for as long as the setting is on. While it is on, every user is
visited (episodes have no due index).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from engram_api.errors import ConfigError, InvalidInputError
from engram_api.models import check_aware, utcnow
from engram_api.settings import Settings
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.maintenance._common import Guard, UserFailure, guarded, isolate, target_users

__all__ = ["DecayReport", "DecayUser", "decay_users", "episode_cutoff", "run_decay"]


class DecayUser(BaseModel):
    user_id: str
    due: int = Field(description="facts due for archival that were read (archived or not faded yet)")
    archived: int
    episode_chunks_removed: int = 0
    version: int = Field(description="the user's graph version after the run")


class DecayReport(BaseModel):
    now: datetime
    per_day: float
    threshold: float
    recomputed: int = Field(0, description="facts whose due was recomputed for a changed policy (refresh_dues)")
    users: int = 0
    due: int = 0
    archived: int = 0
    episode_chunks_removed: int = 0
    per_user: list[DecayUser] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


# Hosts' clocks differ a little; a few minutes ahead is skew, not a request to age everything.
_CLOCK_SKEW = timedelta(minutes=5)


def episode_cutoff(settings: Settings, now: datetime) -> datetime | None:
    """Episodes with an event time before this are out of recall; None while episodes do not decay."""
    return now - timedelta(days=settings.episode_max_age_days) if settings.decay_episodes else None


def decay_users(graph: GraphStore, settings: Settings, now: datetime) -> list[str]:
    """The users decay has work for at ``now``: those with a fact due for archival (the due index), or
    every stored user while episodes decay too. First makes the stored dues the settings' policy's
    (``GraphStore.refresh_dues``: one read, unless ``ENGRAM_DECAY_PER_DAY`` or ``ENGRAM_ARCHIVE_THRESHOLD``
    changed since the dues were computed, when it recomputes them all), so the due index this reads is
    the policy's: a fact that now fades sooner is due at its new instant, not its old one."""
    graph.refresh_dues(batch=settings.maintenance_batch)
    return graph.list_users() if settings.decay_episodes else graph.users_due(now)


def run_decay(
    *,
    graph: GraphStore,
    settings: Settings,
    guard: Guard,
    now: datetime,
    user_ids: list[str] | None = None,
) -> DecayReport:
    """Archive each user's facts faded at ``now`` (below ``settings.archive_threshold``); ``user_ids``
    None: the users with work (``decay_users``)."""
    when = check_aware(now, "now")
    if when is None:
        raise InvalidInputError("now", "is required: decay is measured up to this instant")
    if when > utcnow() + _CLOCK_SKEW:
        # A future instant would archive every fact due by then at once: never a real run.
        raise InvalidInputError("now", f"must not be in the future (got {when.isoformat()})")
    fading = graph.fading
    if (fading.per_day, fading.threshold) != (settings.decay_per_day, settings.archive_threshold):
        # The store computes (and recomputes, ``decay_users``) every archive_due_at with its own policy:
        # archiving by another would miss facts. A store opened with other settings is a wiring error.
        raise ConfigError(
            "ENGRAM_DECAY_PER_DAY",
            f"the graph store fades by {fading} but the settings say per_day={settings.decay_per_day}, "
            f"threshold={settings.archive_threshold}: open the store with the same settings",
        )
    # The driver recomputed the dues already (``decay_users``: here one read); a run on named users
    # (`engram maintenance decay --user`) must not archive by stale ones either.
    recomputed = graph.refresh_dues(batch=settings.maintenance_batch)
    report = DecayReport(now=when, per_day=fading.per_day, threshold=fading.threshold, recomputed=recomputed)
    users = decay_users(graph, settings, when) if user_ids is None else target_users(graph, user_ids)
    for user_id in users:

        def decay(write: UserWrite) -> tuple[int, int, int, int]:
            due, archived = graph.decay(write.user_id, now=when, batch=settings.maintenance_batch)
            removed = _expire_episodes(graph, write.user_id, episode_cutoff(settings, when))
            # Archival changes no embedding: the index moves by the removed chunks only (often an empty delta).
            # Only an archival or a removed chunk changes what the other jobs look at (``fanout``).
            after = write.finish(removals=removed, changed=bool(archived or removed))
            return due, archived, len(removed), after.version

        with isolate("decay", user_id, report.failed):
            due, archived, removed, after = guarded(guard, user_id, decay)
            report.users += 1
            report.due += due
            report.archived += archived
            report.episode_chunks_removed += removed
            report.per_user.append(
                DecayUser(user_id=user_id, due=due, archived=archived, episode_chunks_removed=removed, version=after)
            )
    return report


def _expire_episodes(graph: GraphStore, user_id: str, cutoff: datetime | None) -> list[str]:
    """Remove the chunks of the user's episodes older than ``cutoff`` (nothing when it is None)."""
    if cutoff is None:
        return []
    old = [e.id for e in graph.episodes(user_id) if e.event_time < cutoff]
    chunks = graph.get_chunks(user_id, episode_ids=old) if old else []
    return graph.remove_chunks(user_id, [c.id for c in chunks]) if chunks else []
