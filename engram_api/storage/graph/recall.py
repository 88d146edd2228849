"""The recall role of the graph store: what the reader (and the FAISS indexes it loads) reads, and the
reader's own small writes (feedback, reinforcement of facts a recall found useful).

Invariants:
- every read is scoped by ``user_id`` inside the query; another user's ids are never answered;
- facts are "valid at" / "current" as ``validity`` defines (``GraphStepQuery.at``, ``keyword_search``);
- the per-user ``version`` grows by one with every write that changes what recall can return, and every
  write marks the records it creates or changes with it (``refresh_snapshot``, ``vector_changes``), so
  readers and FAISS indexes can tell they are stale and catch up by version.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from engram_api.errors import InvalidInputError, UserBusyError
from engram_api.models import (
    HISTORY_LIMIT,
    ChunkRecord,
    ClusterRecord,
    EntityRecord,
    FactRecord,
    FeedbackRow,
    GraphPage,
    KeywordHit,
    LearnedWeights,
    Usage,
    UserStats,
    VectorItem,
    utcnow,
)
from engram_api.naming import normalize_name
from engram_api.storage.faiss.sync import UserChanges, VectorChanges
from engram_api.storage.graph.base import Link, StoreBase, check_count, count, distinct, guarded, linked
from engram_api.storage.graph.step import GraphStep, GraphStepQuery
from engram_api.versions import Stamp

if TYPE_CHECKING:
    from engram_api.storage.snapshot.graph import UserSnapshot

__all__ = ["GraphStep", "GraphStepQuery", "RecallStore", "SnapshotBuild", "SnapshotChanges"]

# Full reads of a user's vectors before ``stamped_vectors`` settles for a stamp read first (see there).
_STAMP_ATTEMPTS = 3
# How ``RecallStore._snapshot`` makes its read a ``UserSnapshot``: (stamp, facts, chunks).
SnapshotBuild = Callable[[Stamp, Iterable[FactRecord], Iterable[ChunkRecord]], "UserSnapshot"]


def _some(name: str) -> Callable[[dict[str, Any]], bool]:
    """``guarded`` rule: the named rows as a list; asks when there are any."""

    def rule(args: dict[str, Any]) -> bool:
        args[name] = list(args[name])
        return bool(args[name])

    return rule


@dataclass(frozen=True, slots=True)
class SnapshotChanges:
    """What ``refresh_snapshot`` reads: the user's stamp (read first), the version of the user's last
    removal of a fact or chunk (0: none in this lifetime), how many facts and chunks the user has, the
    facts and chunks marked with a version after ``since``, and the ids the writes after ``since`` removed
    (``gone``, the removal records ``vector_changes`` reads) with the user's catch-up horizon (None: no
    write of this release): ``gone`` is complete only from a ``since`` at or above the horizon."""

    stamp: Stamp
    removed: int
    size: int
    facts: list[FactRecord]
    chunks: list[ChunkRecord]
    gone: tuple[str, ...] = ()
    horizon: int | None = None


class RecallStore(StoreBase):
    """The reader's reads (``engram_api.reader``, ``faiss.keeper``) and its feedback writes."""

    @abstractmethod
    @guarded(distinct("fact_ids"))
    def get_facts(self, user_id: str, fact_ids: Sequence[str]) -> list[FactRecord]:
        """Facts by id with subject/object names and ``source_ids`` filled, embeddings omitted."""

    @abstractmethod
    def graph_step(self, user_id: str, query: GraphStepQuery) -> GraphStep:
        """Recall's graph step in ONE round trip (one query, or one read transaction): the user's facts
        among ``fact_ids``, and the facts reachable from the seeds, nearest first, at most ``limit``.

        Seeds are ``seeds`` plus the subject and object of each of ``seed_facts`` that passes the recall
        window (holds at ``as_of``, or is current at ``now`` when None; not archived; its validity overlaps
        [since, until)), minus ``avoid``; another user's ids are no seeds.

        Each seed contributes at most its ``per_seed`` nearest facts (ordered by hops, importance
        descending, id descending: the order of the stores' (entity, importance, id) indexes read
        backwards, so a seed with thousands of facts costs ``per_seed`` index entries, not its degree),
        so one hub-like seed cannot crowd out the others; a fact's hops is its minimum over the seeds
        that kept it.

        A fact mentioning a seed entity is at hop 0; a fact mentioning an entity that a hop-0 fact
        connects to is at hop 1, and so on up to ``max_hops`` (the walk stops at that depth). Traversal and
        results use only facts valid at ``as_of`` (current facts when None) and never archived ones. Paths
        never visit an entity in ``avoid`` (a hub such as the user's own node, which every fact touches),
        not even as a seed; facts that mention it are still returned when reached another way.

        Records of facts in ``known`` are not sent back (the caller's cache has them); a fact asked and
        reached comes back once.

        Episode chunks, for a caller whose chunk cache lacks them: the user's chunks among ``chunk_ids``
        come back in ``chunks``; the facts extracted from the episodes of the user's chunks among
        ``chunk_facts`` are hydrated as if in ``fact_ids``; and, when the step expands (``limit`` > 0),
        those of the first ``seed_chunk_count`` of ``seed_chunks`` that are the user's (in list order) are
        seed facts (hydrated too), as if in ``seed_facts``.
        """

    def snapshot(self, user_id: str, *, max_records: int) -> UserSnapshot | None:
        """Every fact (any state) and episode chunk of the user, in one read transaction that reads the
        user's stamp first (a record may be newer than the stamp, never older); None when they number more
        than ``max_records``. ``UserSnapshot.graph_step`` answers ``graph_step`` from it."""
        from engram_api.storage.snapshot.graph import UserSnapshot

        return self._snapshot(user_id, check_count("max_records", max_records), partial(UserSnapshot.of, user_id))

    @abstractmethod
    def _snapshot(self, user_id: str, max_records: int, build: SnapshotBuild) -> UserSnapshot | None:
        """``build(stamp, facts, chunks)`` called in the read transaction, the records read lazily (facts
        first): it makes each a row before the next is read, so a whole load never holds the user's records
        as models all at once (a 100K-fact user's would be ~360 MB more a reader keeps as RSS)."""

    def refresh_snapshot(self, snapshot: UserSnapshot, *, max_records: int) -> UserSnapshot | None:
        """``snapshot`` brought to the user's stamp by reading only the facts and chunks written since its
        stamp, in one read transaction that reads the stamp first (every write marks the records it
        creates or changes with the version it commits, ``SnapshotChanges``); the records a write removed
        since (a forget, decay's expired excerpts) are taken out by the ids of the removal records
        (``storage.snapshot.removal``). None when only a whole load can do it: another lifetime, a record
        removed since a version below the user's catch-up horizon (its removal records pruned), more than
        ``max_records``, or a count that disagrees with the merge (a writer that marked nothing: an older
        release's)."""
        since = snapshot.stamp.version
        changes = self._snapshot_changes(snapshot.user_id, since)
        listed = changes.horizon is not None and since >= changes.horizon
        return snapshot.refreshed(
            changes.stamp, changes.removed, changes.facts, changes.chunks,
            max_records=check_count("max_records", max_records), size=changes.size,
            gone=changes.gone if listed else None,
        )  # fmt: skip

    @abstractmethod
    def _snapshot_changes(self, user_id: str, since: int) -> SnapshotChanges: ...

    def history(
        self, user_id: str, subject: str, predicate: str | None, limit: int = HISTORY_LIMIT
    ) -> list[FactRecord]:
        """The latest ``limit`` facts (current and superseded) whose subject's name or alias matches
        ``subject`` (normalized), optionally one predicate, in chronological order (valid_from,
        created_at, id)."""
        norm = normalize_name(subject)
        if not norm or not check_count("limit", limit):
            return []
        return list(reversed(self._history(user_id, norm, predicate, limit)))

    @abstractmethod
    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        """The latest ``limit`` (>= 1) facts of subjects named or aliased ``norm``, latest first."""

    def page(self, user_id: str, page: int, page_size: int) -> GraphPage:
        """The user's facts in creation order, ``page_size`` a page (pages start at 1), with the
        entities they mention."""
        if page < 1:
            raise InvalidInputError("page", f"must be >= 1 (got {page})")
        if page_size < 1:
            raise InvalidInputError("page_size", f"must be >= 1 (got {page_size})")
        total, facts, entities = self._page(user_id, skip=(page - 1) * page_size, limit=page_size)
        return GraphPage(
            user_id=user_id, page=page, page_size=page_size, total_facts=total, facts=facts, entities=entities
        )

    @abstractmethod
    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        """One snapshot: the user's fact count, ``limit`` facts after ``skip`` in (created_at, id) order,
        and the entities those facts mention, ordered by (norm_name, id), each once."""

    def stats(self, user_id: str) -> UserStats:
        """The user's record counts, version and usage totals; zeros for a user the store does not hold.
        ``current_facts`` are those valid now (``validity``); ``superseded_facts`` those closed (``valid_until``
        set), whenever that falls."""
        counts, user = self._stats(user_id, utcnow())
        totals = {k: v for k, v in (user or {}).items() if v is not None}
        return UserStats(user_id=user_id, **counts, version=totals.pop("version", 0), usage=Usage(**totals))

    @abstractmethod
    def _stats(self, user_id: str, now: datetime) -> tuple[dict[str, int], dict[str, Any] | None]:
        """One snapshot: the ``UserStats`` counts by field name (``current_facts`` at ``now``), and the
        user's ``version`` with its ``Usage`` totals (None for a user the store does not hold)."""

    def vectors(self, user_id: str) -> tuple[list[VectorItem], int]:
        """Every fact, entity and episode-chunk embedding of the user (with its token states where the record
        has them), by (kind, id), and the version they reflect."""
        rows, version = self._vectors(user_id)
        items = [
            VectorItem.model_validate({"node_id": n, "kind": k, "embedding": v, "states": s}) for n, k, v, s in rows
        ]
        return sorted(items, key=lambda item: (item.kind, item.node_id)), version

    @abstractmethod
    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float], bytes | None]], int]:
        """One snapshot: (node id, kind, embedding, token states or None) of each embedded fact, entity and
        chunk, and the version (0 for a user the store does not hold)."""

    @abstractmethod
    @guarded(distinct("chunk_ids", "episode_ids"))
    def get_chunks(
        self, user_id: str, chunk_ids: Sequence[str] = (), *, episode_ids: Sequence[str] = ()
    ) -> list[ChunkRecord]:
        """Chunks by id or by episode (embeddings omitted, ``fact_ids`` filled), in conversation order."""

    @abstractmethod
    @guarded(distinct("chunk_ids"), count("window"))
    def neighbour_chunks(self, user_id: str, chunk_ids: Sequence[str], window: int) -> list[ChunkRecord]:
        """Up to ``window`` chunks before and after each given one, in the user's conversation order
        (event time, message id, position)."""

    @abstractmethod
    @guarded(distinct("terms"), count("k"))
    def keyword_search(
        self,
        user_id: str,
        terms: Sequence[str],
        k: int,
        *,
        as_of: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[KeywordHit]:
        """BM25 over the user's chunks and fact statements, any of ``terms`` (``episodes.keyword_terms``),
        best first: at most ``k`` chunks (event time <= as_of, >= since, < until) and ``k`` facts valid at
        ``validity.instant(as_of)`` (current when None). Scoped to the user inside the index query."""

    def stamped_vectors(self, user_id: str) -> tuple[list[VectorItem], Stamp]:
        """``vectors`` with the stamp they reflect, in at most ``_STAMP_ATTEMPTS`` reads: the first whose
        stamp read before and after agree (exact), else the last one's items with the stamp read before them
        when the lifetime held (every record of that stamp, perhaps newer ones: a catch-up by version from
        that stamp makes the index exact, ``vectorsync``). ``UserBusyError`` when the user's lifetime changed
        under every read (forget_user and re-creation in a loop): never an unbounded retry."""
        for attempt in range(_STAMP_ATTEMPTS):
            before = self.user_stamp(user_id)
            items, version = self.vectors(user_id)
            after = self.user_stamp(user_id)
            if (version == before.version and after == before) or (
                attempt == _STAMP_ATTEMPTS - 1 and after.epoch == before.epoch
            ):
                return items, before
        raise UserBusyError(user_id)

    @abstractmethod
    @guarded(count("since", zero_asks=True), nothing=lambda: None)
    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        """What changed in the user's vectors after version ``since``, in one read transaction (the removal
        records and the embedded records marked after it, between two stamp reads): see ``faiss.sync``."""

    @abstractmethod
    @guarded(count("since", zero_asks=True), nothing=lambda: None)
    def user_changes(self, user_id: str, since: int) -> UserChanges:
        """``vector_changes`` and the facts and chunks marked after ``since`` with the version of the user's
        last removal, in ONE round trip (a reader catching up its FAISS copy and its snapshot at once):
        see ``UserChanges``."""

    def clusters(self, user_id: str) -> list[ClusterRecord]:
        """The user's clusters by id, with sorted member fact and entity ids."""
        rows, links = self._clusters(user_id)
        clusters = [
            ClusterRecord.model_validate(row) for row in linked(rows, links, "member_fact_ids", "member_entity_ids")
        ]
        return sorted(clusters, key=lambda c: c.id)

    @abstractmethod
    def _clusters(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        """One snapshot: the user's clusters as ``ClusterRecord`` fields (no members), and their member
        links."""

    @abstractmethod
    def load_weights(self, scope: str) -> LearnedWeights | None: ...

    @abstractmethod
    @guarded(_some("rows"), nothing=lambda: None)
    def add_feedback(self, rows: Sequence[FeedbackRow]) -> None: ...

    @abstractmethod
    @guarded(distinct("fact_ids"), nothing=int)
    def reinforce(self, user_id: str, fact_ids: Sequence[str], *, amount: float, now: datetime) -> int:
        """strength = min(1, effective strength at ``now`` + amount), measured at ``now`` (``fading``), with
        its new ``archive_due_at``; un-archives. Returns how many facts changed."""
