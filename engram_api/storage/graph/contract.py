"""The graph-store contract. Neo4j and the embedded SQLite store both implement it and both pass
``tests/contract/``. Storage logic lives behind this interface only: models stay plain data, the
pipeline and the reader never write a query.

Policy lives here once: the public methods are concrete; they check sizes and ownership (a negative
limit, window, k or hop count, a page below 1, a batch below 1 or another user's record raise
``InvalidInputError`` naming the field), drop duplicate ids, answer empty requests without a query,
hold the decay formula, plan forgetting (``forgetting``) and shape results (records from raw rows,
links grouped and sorted, counts into ``UserStats`` and ``ForgetResult``). Backends implement the
``_``-prefixed hooks: queries and transactions only.

Rules every backend keeps:
- every read and write is scoped by ``user_id``; nothing ever crosses users;
- ``apply`` runs one transaction and is idempotent by (user_id, episode id);
- the per-user ``version`` grows by one with every applied plan, forget and maintenance write that
  changes what recall can return, so readers and FAISS indexes can tell they are stale;
- every applied message's chunks (``WritePlan.chunks``) are stored with it, carry their embedding into
  ``vectors`` (kind "episode") and are in the user's keyword index together with fact statements;
  ``forget`` / ``forget_user`` remove both, and keyword search is scoped to the user inside the query;
- nothing is deleted by supersession or archival: only ``forget`` and ``forget_user`` delete, and they
  leave no orphan (an entity no fact mentions and no episode provenance keeps is removed too);
- the user record carries an ``epoch`` (``engram_api.versions``) chosen when the write that creates the
  user runs, so a user's (epoch, version) stamp is never reused across lifetimes;
- inside ``fenced(user_id, stamp, epoch)`` every write transaction of that thread first checks (under the
  user's row/node lock) that the user's stamp is still the fence's, else raises ``StaleWriteError`` and
  writes nothing; after commit the fence follows the new stamp. ``engram_api.storage.writer.userwrite`` is the
  one caller;
- inside ``batched()`` a backend may run the thread's calls in ONE transaction (it yields True): reads
  see the block's own writes, and everything commits when the block ends or nothing does (an error in
  the block, or at commit, rolls it all back and puts the fence back where the block found it).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from engram_api.errors import InvalidInputError, StaleWriteError, UserBusyError
from engram_api.models import (
    HISTORY_LIMIT,
    ApplyOutcome,
    ChunkRecord,
    ClusterRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    FeedbackRow,
    ForgetResult,
    GraphPage,
    KeywordHit,
    LearnedWeights,
    Record,
    StoredEpisode,
    Usage,
    UserStats,
    VectorItem,
    WritePlan,
    utcnow,
)
from engram_api.naming import normalize_name
from engram_api.storage.faiss.sync import UserChanges, VectorChanges
from engram_api.storage.graph.forgetting import ForgetPlan, ForgetScope, Removed, plan_forget
from engram_api.versions import ABSENT, Stamp, new_epoch

if TYPE_CHECKING:
    from engram_api.storage.snapshot.graph import UserSnapshot

__all__ = [
    "ExtractionContext",
    "Fence",
    "GraphStep",
    "GraphStepQuery",
    "GraphStore",
    "Link",
    "SnapshotBuild",
    "SnapshotChanges",
]

_active = threading.local()
_DAY = timedelta(days=1)
# Full reads of a user's vectors before ``stamped_vectors`` settles for a stamp read first (see there).
_STAMP_ATTEMPTS = 3
_H = TypeVar("_H", bound=Hashable)
# A provenance or membership link as a backend reads it: (owner id, "fact" | "entity", node id).
Link = tuple[str, str, str]
# How ``GraphStore._snapshot`` makes its read a ``UserSnapshot``: (stamp, facts, chunks).
SnapshotBuild = Callable[[Stamp, Iterable[FactRecord], Iterable[ChunkRecord]], "UserSnapshot"]


@dataclass(slots=True)
class Fence:
    """What the next write of ``user_id`` in this thread must find: ``expected``; a write that creates
    the user (``expected`` is ``ABSENT``) creates it with ``epoch``."""

    user_id: str
    expected: Stamp
    epoch: int

    def check_before(self, found: Stamp) -> None:
        if found != self.expected:
            raise StaleWriteError(self.user_id, self.expected, found)

    def check_after(self, found: Stamp) -> None:
        # A store cannot lock a user that does not exist yet: two writers may both see ABSENT. Each
        # creates with its own epoch, so the one that finds another epoch after its write lost the race.
        if self.expected == ABSENT and found != ABSENT and found.epoch != self.epoch:
            raise StaleWriteError(self.user_id, self.expected, found)


class GraphStepQuery(BaseModel):
    """Recall's graph step: hydrate ``fact_ids`` and ``chunk_ids`` and expand from seeds, in one round trip
    (see ``GraphStore.graph_step``). ``known`` are facts the caller already holds at the user's current
    stamp. The ``chunk_*`` fields name episode chunks whose records or extracted facts the caller lacks."""

    model_config = ConfigDict(frozen=True)

    fact_ids: list[str] = Field(default_factory=list)
    seeds: list[str] = Field(default_factory=list)
    seed_facts: list[str] = Field(default_factory=list)
    as_of: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None
    now: datetime = Field(default_factory=utcnow)
    max_hops: int = Field(0, ge=0)
    limit: int = Field(0, ge=0)
    per_seed: int = Field(1, ge=1)
    avoid: list[str] = Field(default_factory=list)
    known: list[str] = Field(default_factory=list)
    chunk_ids: list[str] = Field(default_factory=list)
    chunk_facts: list[str] = Field(default_factory=list)
    seed_chunks: list[str] = Field(default_factory=list)
    seed_chunk_count: int = Field(0, ge=0)

    @property
    def expanding(self) -> bool:
        return self.limit > 0 and bool(self.seeds or self.seed_facts or (self.seed_chunks and self.seed_chunk_count))


class GraphStep(BaseModel):
    """``facts``: every asked or reached fact of the user that is not in ``known`` (any order);
    ``hops``: the reached facts as (fact id, hops), nearest first; ``chunks``: the user's chunks among
    ``chunk_ids`` (any order)."""

    facts: list[FactRecord] = Field(default_factory=list)
    hops: list[tuple[str, int]] = Field(default_factory=list)
    chunks: list[ChunkRecord] = Field(default_factory=list)


class ExtractionContext(BaseModel):
    """What the extract stage reads for one message's prompt (``GraphStore.extraction_context``):
    ``entities`` (without embeddings, as ``lookup_entities``) and ``facts`` by id, every fact of ``slots``
    (as ``facts_for_slots``), and the user's last ``turns`` episodes before the message, oldest first (as
    ``recent_episodes``)."""

    entities: list[EntityRecord] = Field(default_factory=list)
    facts: list[FactRecord] = Field(default_factory=list)
    slot_facts: list[FactRecord] = Field(default_factory=list)
    episodes: list[EpisodeRecord] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SnapshotChanges:
    """What ``refresh_snapshot`` reads: the user's stamp (read first), the version of the user's last
    removal of a fact or chunk (0: none in this lifetime), how many facts and chunks the user has, and the
    facts and chunks marked with a version after ``since``."""

    stamp: Stamp
    removed: int
    size: int
    facts: list[FactRecord]
    chunks: list[ChunkRecord]


class GraphStore(ABC):
    """Small, domain-shaped interface over one graph backend."""

    # ------------------------------------------------------------------------------------ fencing
    @contextmanager
    def fenced(self, user_id: str, expected: Stamp, epoch: int) -> Iterator[Fence]:
        """Fence this thread's writes of ``user_id`` (see the module docstring)."""
        fence, previous = Fence(user_id, expected, epoch), getattr(_active, "fence", None)
        _active.fence = fence
        try:
            yield fence
        finally:
            _active.fence = previous

    @staticmethod
    def _fence() -> Fence | None:
        """The fence the backends' write transactions enforce, if this thread is inside one."""
        return getattr(_active, "fence", None)

    @contextmanager
    def batched(self) -> Iterator[bool]:
        """Run this thread's reads and writes inside the block in one transaction where that is cheaper
        and holds no store-wide lock (yields True; see the module docstring). By default every write
        commits on its own (yields False): SQLite's write lock is the whole database's, and holding it
        while a batch is planned would stall every other writer."""
        yield False

    def _creation_epoch(self) -> int:
        fence = self._fence()
        return fence.epoch if fence is not None else new_epoch()

    def user_version(self, user_id: str) -> int:
        """0 for a user the store has never seen."""
        return self.user_stamp(user_id).version

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

    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        """What changed in the user's vectors after version ``since``, in one read transaction (the removal
        records and the embedded records marked after it, between two stamp reads): see ``vectorsync``."""
        return self._vector_changes(user_id, _count("since", since))

    @abstractmethod
    def _vector_changes(self, user_id: str, since: int) -> VectorChanges: ...

    def user_changes(self, user_id: str, since: int) -> UserChanges:
        """``vector_changes`` and the facts and chunks marked after ``since`` with the version of the user's
        last removal, in ONE round trip (a reader catching up its FAISS copy and its snapshot at once):
        see ``UserChanges``."""
        return self._user_changes(user_id, _count("since", since))

    @abstractmethod
    def _user_changes(self, user_id: str, since: int) -> UserChanges: ...

    # ----------------------------------------------------------------------------------- lifecycle
    @abstractmethod
    def ensure_schema(self) -> None:
        """Create constraints / tables / indexes if missing (idempotent)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise ``StoreUnavailableError`` when the backend cannot answer."""

    @abstractmethod
    def close(self) -> None: ...

    # -------------------------------------------------------------------------------------- ingest
    @abstractmethod
    def is_applied(self, user_id: str, message_id: str) -> bool:
        """True when the episode ``message_id`` is already stored for ``user_id``."""

    def find_entities(self, user_id: str, norm_names: Sequence[str]) -> list[EntityRecord]:
        """Entities whose ``norm_name`` or any normalized alias is in ``norm_names`` (with embeddings)."""
        names = _distinct(norm_names)
        return self._find_entities(user_id, names) if names else []

    def get_entities(self, user_id: str, entity_ids: Sequence[str]) -> list[EntityRecord]:
        ids = _distinct(entity_ids)
        return self._get_entities(user_id, ids) if ids else []

    def lookup_entities(
        self, user_id: str, *, entity_ids: Sequence[str], norm_names: Sequence[str]
    ) -> list[EntityRecord]:
        """``get_entities`` and ``find_entities`` in ONE query: each entity whose id is in ``entity_ids``
        or whose ``norm_name`` or any normalized alias is in ``norm_names``, once, WITHOUT embeddings
        (``embedding`` is None: consolidation resolves names through the index, never a stored vector,
        and reading 384 floats an entity back was a third of the lookup's client CPU on Neo4j).
        Consolidation fetches everything a message may resolve to with it."""
        ids, names = _distinct(entity_ids), _distinct(norm_names)
        return self._lookup_entities(user_id, ids, names) if ids or names else []

    def recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        """The user's last ``limit`` episodes with ``event_time < before``, oldest first (the extractor's
        earlier turns)."""
        return self._recent_episodes(user_id, before=before, limit=limit) if _count("limit", limit) else []

    def facts_for_slots(self, user_id: str, slots: Sequence[tuple[str, str]]) -> list[FactRecord]:
        """All facts (current, superseded and archived) for the (subject_id, predicate) pairs."""
        pairs = _distinct([(subject_id, predicate) for subject_id, predicate in slots])
        return self._facts_for_slots(user_id, pairs) if pairs else []

    def facts_and_slots(
        self, user_id: str, *, fact_ids: Sequence[str], slots: Sequence[tuple[str, str]]
    ) -> tuple[list[FactRecord], list[FactRecord]]:
        """``get_facts(fact_ids)`` and ``facts_for_slots(slots)`` in one call (consolidation's read of the
        facts a message names and of its one-value slots): one round trip where the backend has them, as
        ``extraction_context`` without entities or turns."""
        ids, pairs = _distinct(fact_ids), _distinct([(s, p) for s, p in slots])
        if not (ids or pairs):
            return [], []
        read = self._extraction_context(user_id, [], ids, pairs, datetime(1970, 1, 1, tzinfo=UTC), 0)  # no turns
        return read.facts, read.slot_facts

    def apply(self, plan: WritePlan) -> ApplyOutcome:
        """Write one message's plan in one transaction; a stored episode makes it a no-op.

        Creates the episode, new entities and facts (with ``FROM`` provenance to the episode), applies
        entity and fact changes, reinforces restated facts (strength back to 1.0, provenance added),
        links mentioned entities and ``linked_fact_ids`` to the episode (no reinforcement), stores the
        episode's chunks (and their keyword entries), adds the plan's usage to the user's totals and bumps
        the user's version. Returns the version after the write (or the current one when skipped).
        """
        _owned("plan", plan.user_id, [plan.episode, *plan.new_entities, *plan.new_facts])
        return self._apply(plan)

    def extraction_context(
        self,
        user_id: str,
        *,
        entity_ids: Sequence[str],
        fact_ids: Sequence[str],
        slots: Sequence[tuple[str, str]],
        before: datetime,
        turns: int,
    ) -> ExtractionContext:
        """``lookup_entities`` by id (no embeddings), ``get_facts``, ``facts_for_slots`` and
        ``recent_episodes(limit=turns)`` in one call: the extract stage's reads of a message, one round trip
        where the backend has round trips."""
        ids, facts, pairs = _distinct(entity_ids), _distinct(fact_ids), _distinct([(s, p) for s, p in slots])
        if not (ids or facts or pairs or _count("turns", turns)):
            return ExtractionContext()
        return self._extraction_context(user_id, ids, facts, pairs, before, turns)

    def _extraction_context(
        self,
        user_id: str,
        entity_ids: list[str],
        fact_ids: list[str],
        slots: list[tuple[str, str]],
        before: datetime,
        turns: int,
    ) -> ExtractionContext:
        """``extraction_context`` for distinct inputs, not all empty. By default the four reads one by one:
        an in-process store (SQLite) pays nothing per call; a server backend answers it in one query."""
        return ExtractionContext(
            entities=self._lookup_entities(user_id, entity_ids, []) if entity_ids else [],
            facts=self._get_facts(user_id, fact_ids) if fact_ids else [],
            slot_facts=self._facts_for_slots(user_id, slots) if slots else [],
            episodes=self._recent_episodes(user_id, before=before, limit=turns) if turns else [],
        )

    @abstractmethod
    def _find_entities(self, user_id: str, norm_names: list[str]) -> list[EntityRecord]:
        """``find_entities`` for distinct, non-empty ``norm_names``."""

    @abstractmethod
    def _get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]: ...

    @abstractmethod
    def _lookup_entities(self, user_id: str, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        """``lookup_entities`` for distinct ids and names, not both empty."""

    @abstractmethod
    def _recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        """``recent_episodes`` for ``limit`` >= 1."""

    @abstractmethod
    def _facts_for_slots(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]: ...

    @abstractmethod
    def _apply(self, plan: WritePlan) -> ApplyOutcome:
        """``apply`` for a plan whose records all belong to ``plan.user_id``."""

    # ---------------------------------------------------------------------------------------- read
    @abstractmethod
    def user_stamp(self, user_id: str) -> Stamp:
        """(epoch, version); ``ABSENT`` for a user the store does not hold."""

    def get_facts(self, user_id: str, fact_ids: Sequence[str]) -> list[FactRecord]:
        """Facts by id with subject/object names and ``source_ids`` filled, embeddings omitted."""
        ids = _distinct(fact_ids)
        return self._get_facts(user_id, ids) if ids else []

    @abstractmethod
    def _get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]: ...

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

        return self._snapshot(user_id, _count("max_records", max_records), partial(UserSnapshot.of, user_id))

    @abstractmethod
    def _snapshot(self, user_id: str, max_records: int, build: SnapshotBuild) -> UserSnapshot | None:
        """``build(stamp, facts, chunks)`` called in the read transaction, the records read lazily (facts
        first): it makes each a row before the next is read, so a whole load never holds the user's records
        as models all at once (a 100K-fact user's would be ~360 MB more a reader keeps as RSS)."""

    def refresh_snapshot(self, snapshot: UserSnapshot, *, max_records: int) -> UserSnapshot | None:
        """``snapshot`` brought to the user's stamp by reading only the facts and chunks written since its
        stamp, in one read transaction that reads the stamp first (every write marks the records it
        creates or changes with the version it commits, ``SnapshotChanges``). None when only a whole load
        can do it: another lifetime, a record removed since (a forget), more than ``max_records``, or a
        count that disagrees with the merge (a writer that marked nothing: an older release's)."""
        changes = self._snapshot_changes(snapshot.user_id, snapshot.stamp.version)
        return snapshot.refreshed(
            changes.stamp, changes.removed, changes.facts, changes.chunks,
            max_records=_count("max_records", max_records), size=changes.size,
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
        if not norm or not _count("limit", limit):
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
        """The user's record counts, version and usage totals; zeros for a user the store does not hold."""
        counts, user = self._stats(user_id)
        totals = {k: v for k, v in (user or {}).items() if v is not None}
        return UserStats(user_id=user_id, **counts, version=totals.pop("version", 0), usage=Usage(**totals))

    @abstractmethod
    def _stats(self, user_id: str) -> tuple[dict[str, int], dict[str, Any] | None]:
        """One snapshot: the ``UserStats`` counts by field name, and the user's ``version`` with its
        ``Usage`` totals (None for a user the store does not hold)."""

    def vectors(self, user_id: str) -> tuple[list[VectorItem], int]:
        """Every fact, entity and episode-chunk embedding of the user, by (kind, id), and the version they
        reflect."""
        rows, version = self._vectors(user_id)
        items = [VectorItem.model_validate({"node_id": n, "kind": k, "embedding": v}) for n, k, v in rows]
        return sorted(items, key=lambda item: (item.kind, item.node_id)), version

    @abstractmethod
    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float]]], int]:
        """One snapshot: (node id, kind, embedding) of each embedded fact, entity and chunk, and the
        version (0 for a user the store does not hold)."""

    def get_chunks(
        self, user_id: str, chunk_ids: Sequence[str] = (), *, episode_ids: Sequence[str] = ()
    ) -> list[ChunkRecord]:
        """Chunks by id or by episode (embeddings omitted, ``fact_ids`` filled), in conversation order."""
        ids, episodes = _distinct(chunk_ids), _distinct(episode_ids)
        return self._get_chunks(user_id, ids, episodes) if ids or episodes else []

    def add_chunks(self, user_id: str, chunks: Sequence[ChunkRecord]) -> int:
        """Store chunks (with their keyword entries) for stored episodes that have none yet; chunks of an
        unknown episode, of one that already has chunks, or of another user are skipped. Bumps the
        version when any is stored; returns how many were."""
        own = [c for c in chunks if c.user_id == user_id]
        return self._add_chunks(user_id, own) if own else 0

    def remove_chunks(self, user_id: str, chunk_ids: Sequence[str]) -> list[str]:
        """Delete the user's chunks (and their keyword entries) by id, episodes stay; returns the ids
        removed, sorted. Bumps the version when any is removed."""
        ids = _distinct(chunk_ids)
        return self._remove_chunks(user_id, ids) if ids else []

    def neighbour_chunks(self, user_id: str, chunk_ids: Sequence[str], window: int) -> list[ChunkRecord]:
        """Up to ``window`` chunks before and after each given one, in the user's conversation order
        (event time, message id, position)."""
        ids = _distinct(chunk_ids)
        return self._neighbour_chunks(user_id, ids, window) if ids and _count("window", window) else []

    @abstractmethod
    def _get_chunks(self, user_id: str, chunk_ids: list[str], episode_ids: list[str]) -> list[ChunkRecord]: ...

    @abstractmethod
    def _add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int: ...

    @abstractmethod
    def _remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]: ...

    @abstractmethod
    def _neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]: ...

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
        best first: at most ``k`` chunks (event time <= as_of, >= since, < until) and ``k`` facts (valid
        at ``as_of``, current when None, not archived). Scoped to the user inside the index query."""
        words = _distinct(terms)
        if not words or not _count("k", k):
            return []
        return self._keyword_search(user_id, words, k, as_of=as_of, since=since, until=until)

    @abstractmethod
    def _keyword_search(
        self,
        user_id: str,
        terms: list[str],
        k: int,
        *,
        as_of: datetime | None,
        since: datetime | None,
        until: datetime | None,
    ) -> list[KeywordHit]:
        """``keyword_search`` for distinct ``terms`` and ``k`` >= 1."""

    @abstractmethod
    def list_users(self) -> list[str]: ...

    def episodes(self, user_id: str) -> list[StoredEpisode]:
        """Every stored episode of the user with its provenance links (sorted fact and entity ids),
        ordered by (event_time, id)."""
        rows, links = self._episodes(user_id)
        episodes = [StoredEpisode.model_validate(row) for row in _linked(rows, links, "fact_ids", "entity_ids")]
        return sorted(episodes, key=lambda e: (e.event_time, e.id))

    @abstractmethod
    def _episodes(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        """One snapshot: the user's episodes as ``EpisodeRecord`` fields, and the FROM links of its facts
        and entities to them."""

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
    def decay(self, user_id: str, *, now: datetime, per_day: float, threshold: float, batch: int) -> tuple[int, int]:
        """strength *= per_day ** (days since the fact's ``last_decay_at`` or ``created_at``), set
        ``last_decay_at = now``; facts below ``threshold`` become archived. Facts whose last decay is
        at or after ``now`` are untouched, so a repeated run changes nothing. Works in transactions of
        at most ``batch`` facts. Returns (decayed, archived)."""
        if batch < 1:
            raise InvalidInputError("batch", f"must be >= 1 (got {batch})")

        def fade(strength: float, since: datetime) -> tuple[float, bool]:
            faded = strength * per_day ** ((now - since) / _DAY)
            return faded, faded < threshold

        decayed = archived = 0
        while True:
            flags = self._decay_batch(user_id, now=now, batch=batch, fade=fade)
            decayed, archived = decayed + len(flags), archived + sum(flags)
            if len(flags) < batch:
                return decayed, archived

    @abstractmethod
    def _decay_batch(
        self, user_id: str, *, now: datetime, batch: int, fade: Callable[[float, datetime], tuple[float, bool]]
    ) -> list[bool]:
        """One transaction: the first ``batch`` (by id) unarchived facts last decayed (or created) before
        ``now`` get ``fade(strength, since)`` (new strength, archived) and ``last_decay_at = now``; bumps
        the version when any changed. Returns their archived flags."""

    def reinforce(self, user_id: str, fact_ids: Sequence[str], *, amount: float, now: datetime) -> int:
        """strength = min(1, strength + amount); un-archives. Returns how many facts changed."""
        ids = _distinct(fact_ids)
        return self._reinforce(user_id, ids, amount=amount, now=now) if ids else 0

    @abstractmethod
    def _reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int: ...

    def replace_clusters(self, user_id: str, clusters: Sequence[ClusterRecord]) -> None:
        """Replace the user's cluster nodes and their member links in one transaction."""
        _owned("clusters", user_id, clusters)
        self._replace_clusters(user_id, list(clusters))

    @abstractmethod
    def _replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None: ...

    def clusters(self, user_id: str) -> list[ClusterRecord]:
        """The user's clusters by id, with sorted member fact and entity ids."""
        rows, links = self._clusters(user_id)
        clusters = [
            ClusterRecord.model_validate(row) for row in _linked(rows, links, "member_fact_ids", "member_entity_ids")
        ]
        return sorted(clusters, key=lambda c: c.id)

    @abstractmethod
    def _clusters(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        """One snapshot: the user's clusters as ``ClusterRecord`` fields (no members), and their member
        links."""

    def add_feedback(self, rows: Sequence[FeedbackRow]) -> None:
        if rows:
            self._add_feedback(list(rows))

    @abstractmethod
    def _add_feedback(self, rows: list[FeedbackRow]) -> None: ...

    def feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        """Newest first; ``user_id=None`` means every user."""
        return self._feedback(user_id, limit) if _count("limit", limit) else []

    @abstractmethod
    def _feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]: ...

    @abstractmethod
    def save_weights(self, weights: LearnedWeights) -> None: ...

    @abstractmethod
    def load_weights(self, scope: str) -> LearnedWeights | None: ...


def _distinct(values: Iterable[_H]) -> list[_H]:
    """Each value once, in first-seen order: backends get no duplicate ids, names or terms."""
    return list(dict.fromkeys(values))


def _linked(rows: list[dict[str, Any]], links: list[Link], facts: str, entities: str) -> list[dict[str, Any]]:
    """Each row with the node ids its links name, each once and sorted, under ``facts`` and ``entities``."""
    by_owner: dict[tuple[str, str], set[str]] = {}
    for owner, kind, node_id in links:
        by_owner.setdefault((owner, kind), set()).add(node_id)
    return [
        {
            **row,
            facts: sorted(by_owner.get((row["id"], "fact"), ())),
            entities: sorted(by_owner.get((row["id"], "entity"), ())),
        }
        for row in rows
    ]


def _count(field: str, value: int) -> int:
    """A size asked for (a limit, a window, hops): 0 asks for nothing; a negative one is refused."""
    if value < 0:
        raise InvalidInputError(field, f"must be >= 0 (got {value})")
    return value


def _owned(field: str, user_id: str, records: Iterable[Record]) -> None:
    """Every record must be ``user_id``'s: a store never writes one user's record under another."""
    strangers = sorted({r.id for r in records if r.user_id != user_id})
    if strangers:
        raise InvalidInputError(field, f"records of another user than {user_id!r}: {strangers}")
