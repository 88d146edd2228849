"""The upkeep role of the graph store: maintenance (decay, clusters, learned weights, episode chunks),
erasure (forget) and the whole-user reads of backup and reconcile.

Invariants:
- nothing is deleted by supersession or archival: only ``forget_*`` delete, and they leave no orphan (an
  entity no fact mentions and no episode provenance keeps is removed too); ``forget_*`` remove a message's
  chunks and keyword entries with it;
- the user record carries an ``epoch`` (``engram_api.versions``) chosen when the write that creates the
  user runs, so a user's (epoch, version) stamp is never reused across lifetimes; ``forget_user`` leaves
  the stamp ``ABSENT``;
- every write here that changes what recall can return bumps the user's version (as ``recall`` says).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, get_args

from engram_api.errors import InvalidInputError, StaleWriteError
from engram_api.models import (
    ChunkRecord,
    ClusterRecord,
    EntityRecord,
    FeedbackRow,
    ForgetResult,
    LearnedWeights,
    StoredEpisode,
)
from engram_api.storage.graph.base import Link, Rule, StoreBase, count, distinct, guarded, linked, owned
from engram_api.storage.graph.episodes import EmbedContext
from engram_api.storage.graph.fading import Fading
from engram_api.storage.graph.forgetting import ForgetPlan, ForgetScope, Removed, plan_forget

__all__ = ["UpkeepStore"]


def _known(name: str) -> Rule:
    """A chunk-vector policy (``episodes.EmbedContext``): another value is refused."""

    def rule(args: dict[str, Any]) -> bool:
        if args[name] not in get_args(EmbedContext):
            raise InvalidInputError(name, f"must be one of {', '.join(get_args(EmbedContext))} (got {args[name]!r})")
        return True

    return rule


def _listed(name: str) -> Rule:
    """A sequence of (id, vector) pairs, as a list; asks for something when non-empty."""

    def rule(args: dict[str, Any]) -> bool:
        args[name] = list(args[name])
        return bool(args[name])

    return rule


class UpkeepStore(StoreBase):
    """Maintenance, erasure and whole-user reads (``engram_workers.maintenance``, ``engram_api.backup``,
    the reader's forget calls)."""

    @abstractmethod
    def list_users(self) -> list[str]: ...

    def episodes(self, user_id: str) -> list[StoredEpisode]:
        """Every stored episode of the user with its provenance links (sorted fact and entity ids),
        ordered by (event_time, id)."""
        rows, links = self._episodes(user_id)
        episodes = [StoredEpisode.model_validate(row) for row in linked(rows, links, "fact_ids", "entity_ids")]
        return sorted(episodes, key=lambda e: (e.event_time, e.id))

    @abstractmethod
    def _episodes(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        """One snapshot: the user's episodes as ``EpisodeRecord`` fields, and the FROM links of its facts
        and entities to them."""

    @abstractmethod
    @guarded(distinct("entity_ids"))
    def get_entities(self, user_id: str, entity_ids: Sequence[str]) -> list[EntityRecord]:
        """Entities by id, with embeddings."""

    @abstractmethod
    @guarded(owned("chunks", drop=True), nothing=int)
    def add_chunks(self, user_id: str, chunks: Sequence[ChunkRecord]) -> int:
        """Store chunks (with their keyword entries) for stored episodes that have none yet; chunks of an
        unknown episode, of one that already has chunks, or of another user are skipped. Bumps the
        version when any is stored; returns how many were."""

    @abstractmethod
    @guarded(distinct("chunk_ids"))
    def remove_chunks(self, user_id: str, chunk_ids: Sequence[str]) -> list[str]:
        """Delete the user's chunks (and their keyword entries) by id, episodes stay; returns the ids
        removed, sorted. Bumps the version when any is removed."""

    # -------------------------------------------------------------------------------------- delete
    def forget_message(self, user_id: str, message_id: str) -> ForgetResult:
        """Delete the episode; facts and entities whose only source it was go too (no orphans);
        facts that other messages also stated only lose that provenance link."""
        return self._forget(user_id, episode_id=message_id)

    def forget_fact(self, user_id: str, fact_id: str) -> ForgetResult:
        """Delete one fact (older facts it superseded are repaired as in ``forget_message``) and the
        entities it leaves orphaned; episodes stay. Unknown ids change nothing and return zeros."""
        return self._forget(user_id, fact_id=fact_id)

    def _forget(self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None) -> ForgetResult:
        """Plan from reads (``_forget_scope``), apply under a fence on the stamp read before them; a write
        that moved the stamp meanwhile refuses the apply and the forget is planned again. Inside a caller's
        fence on this user (``UserWrites``) that fence already guards the plan, and the caller re-plans."""
        outer = self._fence()
        while True:
            stamp = None if outer is not None and outer.user_id == user_id else self.user_stamp(user_id)
            scope = self._forget_scope(user_id, episode_id=episode_id, fact_id=fact_id)
            if scope is None:
                return ForgetResult(user_id=user_id)
            plan = plan_forget(user_id, scope, episode_id=episode_id)
            if stamp is None:
                return plan.result(self._apply_forget(plan))
            try:
                with self.fenced(user_id, stamp, stamp.epoch):
                    return plan.result(self._apply_forget(plan))
            except StaleWriteError:
                continue

    @abstractmethod
    def _forget_scope(
        self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None
    ) -> ForgetScope | None:
        """The reads of one forget (one snapshot): of the episode ``episode_id`` or the fact ``fact_id``;
        None when the user has no such episode or fact."""

    @abstractmethod
    def _apply_forget(self, plan: ForgetPlan) -> list[str]:
        """Apply ``plan`` in one transaction (repairs, fact deletes, the episode and its chunks, orphaned
        candidates) and bump the version; returns the ids of the orphaned entities it removed."""

    def forget_user(self, user_id: str) -> ForgetResult:
        """Delete everything of the user (records, feedback, its learned weights, the user itself) in one
        transaction; its stamp reads ``ABSENT`` after."""
        return self._forget_user(user_id).result()

    @abstractmethod
    def _forget_user(self, user_id: str) -> Removed:
        """``forget_user``'s one transaction; the ids it deleted, and which of them had an embedding."""

    @abstractmethod
    def purge_erased(self) -> None:
        """Take what ``forget*`` deleted off the store's own files as far as the store can; the last step
        of every erasure, run after the deletes committed (docs/operations.md "Data retention and erasure"
        says what each store keeps beyond it)."""

    # --------------------------------------------------------------------------------- maintenance
    def decay(self, user_id: str, *, now: datetime, batch: int) -> tuple[int, int]:
        """Archive the user's facts faded at ``now`` (``storage.graph.fading``: the effective strength below
        the threshold, the old daily job's test). Reads only the facts whose ``archive_due_at`` is at or
        before ``now`` (an index), never the others, and writes only those: a faded one is archived with
        its strength at ``now`` (the version bumped); one not faded yet (a changed policy) gets its due
        again, after ``now``, with no bump, since recall reads nothing new. So a repeated run changes
        nothing, and a user with nothing due is neither read nor written. Works in transactions of at most
        ``batch`` facts. Returns (facts due, archived)."""
        if batch < 1:
            raise InvalidInputError("batch", f"must be >= 1 (got {batch})")
        due = archived = 0
        while True:
            flags = self._archive_batch(user_id, now=now, batch=batch)
            due, archived = due + len(flags), archived + sum(flags)
            if len(flags) < batch:
                return due, archived

    @abstractmethod
    def _archive_batch(self, user_id: str, *, now: datetime, batch: int) -> list[bool]:
        """One transaction: the first ``batch`` (by due, id) unarchived facts due at ``now`` get
        ``fading.archival``'s decision; bumps the version when any was archived. Returns their archived
        flags."""

    @abstractmethod
    def users_due(self, now: datetime) -> list[str]:
        """The users with a fact due for archival at ``now`` (``archive_due_at`` at or before it), sorted:
        the decay job's to-do list, read from the due index alone."""

    def refresh_dues(self, *, batch: int) -> int:
        """Make every stored ``archive_due_at`` this store's policy's (``fading``): when the policy the
        dues were computed with (recorded in the store) is another one, or none is recorded (a store from
        before the record, or a new one), recompute the due of every unarchived fact from its stored
        strength and reference instant, in transactions of at most ``batch`` facts (by id), then record
        the policy. Nothing when the recorded policy is this one (one read). Returns the facts recomputed.

        Resumable: the policy is recorded only after the last batch, and a batch's result depends on the
        fact alone, so a run that died midway leaves the old record and the next run redoes it all (a
        fact already recomputed gets the same due again). It holds no user's lock: a batch sets the due of
        a fact only as it read it, so a strength write in between keeps the due it computed itself (with
        the writer's policy: the same one when every process has the same settings)."""
        if batch < 1:
            raise InvalidInputError("batch", f"must be >= 1 (got {batch})")
        if self._recorded_fading() == self.fading:
            return 0
        done, after = 0, ""
        while ids := self._redue_batch(after, batch):
            done, after = done + len(ids), ids[-1]
        self._record_fading(self.fading)
        return done

    @abstractmethod
    def _recorded_fading(self) -> Fading | None:
        """The policy the stored dues were computed with (``refresh_dues`` records it); None: none recorded."""

    @abstractmethod
    def _record_fading(self, fading: Fading) -> None:
        """Record ``fading`` as the policy of the stored dues (one small write)."""

    @abstractmethod
    def _redue_batch(self, after: str, batch: int) -> list[str]:
        """One transaction: the first ``batch`` unarchived facts (every user's) with an id above ``after``,
        by id, get ``fading.due`` of their stored strength and reference instant, each only if unchanged
        since read. Returns their ids."""

    # ------------------------------------------------------------------------------ chunk vectors
    @abstractmethod
    def recorded_chunk_context(self) -> str | None:
        """The ``ENGRAM_CHUNK_EMBED_CONTEXT`` every stored chunk's vector was made with, as the
        re-embedding pass recorded it once no chunk was left under another (``record_chunk_context``);
        None: none recorded (a store from before the record, or one the pass has not finished)."""

    @abstractmethod
    @guarded(_known("context"), nothing=lambda: None)
    def record_chunk_context(self, context: str) -> None:
        """Record ``context`` as the policy of every stored chunk vector (one small write)."""

    @abstractmethod
    @guarded(_known("context"))
    def users_to_reembed(self, context: str) -> list[str]:
        """The users with a chunk whose vector was made under another context than ``context`` or under
        one not recorded (written before the record, or restored), sorted: the pass's to-do list. Reads
        every chunk: the driver asks only while the recorded context is another one."""

    @abstractmethod
    @guarded(_known("context"), count("batch"))
    def chunks_to_reembed(self, user_id: str, context: str, *, after: str, batch: int) -> list[ChunkRecord]:
        """The first ``batch`` of the user's chunks with an id above ``after``, by id, whose vector was made
        under another context than ``context`` (or an unrecorded one)."""

    @abstractmethod
    @guarded(_known("context"), _listed("vectors"))
    def reembed_chunks(
        self,
        user_id: str,
        context: str,
        vectors: Sequence[tuple[str, list[float]]],
        states: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        """One transaction: each of the user's chunks ``vectors`` names (id, vector) whose vector is still
        another context's gets that vector, its token states (``states`` by id; none when absent) and
        ``context``; a chunk written meanwhile under ``context`` (by
        apply) keeps its own. Bumps the version marking the chunks written (so every copy catches up by
        version) when any was; returns their ids, sorted."""

    @abstractmethod
    @guarded(owned("clusters"), nothing=lambda: None)
    def replace_clusters(self, user_id: str, clusters: Sequence[ClusterRecord]) -> None:
        """Replace the user's cluster nodes and their member links in one transaction."""

    @abstractmethod
    @guarded(count("limit"))
    def feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        """Newest first; ``user_id=None`` means every user."""

    @abstractmethod
    def save_weights(self, weights: LearnedWeights) -> None: ...
