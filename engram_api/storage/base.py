"""The graph-store contract. Neo4j and the embedded SQLite store both implement it and both pass
``tests/contract/``. Storage logic lives behind this interface only: models stay plain data, the
pipeline and the reader never write a query.

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
  writes nothing; after commit the fence follows the new stamp. ``engram_api.storage.userwrite`` is the
  one caller.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from engram_api.errors import StaleWriteError
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
    StoredEpisode,
    UserStats,
    VectorItem,
    WritePlan,
)
from engram_api.versions import ABSENT, Stamp, new_epoch

__all__ = ["Fence", "GraphStore", "HopFact"]

_active = threading.local()


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


class HopFact(FactRecord):
    """A fact reached by graph expansion, ``hops`` entity steps away from a seed entity (0 = direct)."""

    hops: int = 0


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

    def _creation_epoch(self) -> int:
        fence = self._fence()
        return fence.epoch if fence is not None else new_epoch()

    def user_version(self, user_id: str) -> int:
        """0 for a user the store has never seen."""
        return self.user_stamp(user_id).version

    def stamped_vectors(self, user_id: str) -> tuple[list[VectorItem], Stamp]:
        """``vectors`` with the full stamp they reflect (the stamp read before and after must agree,
        so the items cannot come from another lifetime than the stamp)."""
        while True:
            before = self.user_stamp(user_id)
            items, version = self.vectors(user_id)
            if version == before.version and self.user_stamp(user_id) == before:
                return items, before

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

    @abstractmethod
    def find_entities(self, user_id: str, norm_names: Sequence[str]) -> list[EntityRecord]:
        """Entities whose ``norm_name`` or any normalized alias is in ``norm_names`` (with embeddings)."""

    @abstractmethod
    def get_entities(self, user_id: str, entity_ids: Sequence[str]) -> list[EntityRecord]: ...

    @abstractmethod
    def recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        """The user's last ``limit`` episodes with ``event_time < before``, oldest first (the extractor's
        earlier turns)."""

    @abstractmethod
    def facts_for_slots(self, user_id: str, slots: Sequence[tuple[str, str]]) -> list[FactRecord]:
        """All facts (current, superseded and archived) for the (subject_id, predicate) pairs."""

    @abstractmethod
    def apply(self, plan: WritePlan) -> ApplyOutcome:
        """Write one message's plan in one transaction; a stored episode makes it a no-op.

        Creates the episode, new entities and facts (with ``FROM`` provenance to the episode), applies
        entity and fact changes, reinforces restated facts (strength back to 1.0, provenance added),
        links mentioned entities and ``linked_fact_ids`` to the episode (no reinforcement), stores the
        episode's chunks (and their keyword entries), adds the plan's usage to the user's totals and bumps
        the user's version. Returns the version after the write (or the current one when skipped).
        """

    # ---------------------------------------------------------------------------------------- read
    @abstractmethod
    def user_stamp(self, user_id: str) -> Stamp:
        """(epoch, version); ``ABSENT`` for a user the store does not hold."""

    @abstractmethod
    def get_facts(self, user_id: str, fact_ids: Sequence[str]) -> list[FactRecord]:
        """Facts by id with subject/object names and ``source_ids`` filled, embeddings omitted."""

    @abstractmethod
    def expand(
        self,
        user_id: str,
        entity_ids: Sequence[str],
        *,
        max_hops: int,
        as_of: datetime | None,
        limit: int,
        per_seed: int,
        avoid: Sequence[str] = (),
    ) -> list[HopFact]:
        """Facts reachable from the seed entities in ONE query, nearest first, at most ``limit``.

        Each seed contributes at most its ``per_seed`` nearest facts (ordered by hops, importance
        descending, id), so one hub-like seed cannot crowd out the others; a fact's hops is its
        minimum over the seeds that kept it.

        A fact mentioning a seed entity is at hop 0; a fact mentioning an entity that a hop-0 fact
        connects to is at hop 1, and so on up to ``max_hops``. Traversal and results use only facts
        valid at ``as_of`` (current facts when None) and never archived ones. Paths never visit an entity
        in ``avoid`` (a hub such as the user's own node, which every fact touches), not even as a seed;
        facts that mention it are still returned when reached another way.
        """

    @abstractmethod
    def history(
        self, user_id: str, subject: str, predicate: str | None, limit: int = HISTORY_LIMIT
    ) -> list[FactRecord]:
        """The latest ``limit`` facts (current and superseded) whose subject's name or alias matches
        ``subject`` (normalized), optionally one predicate, in chronological order (valid_from,
        created_at, id)."""

    @abstractmethod
    def page(self, user_id: str, page: int, page_size: int) -> GraphPage: ...

    @abstractmethod
    def stats(self, user_id: str) -> UserStats: ...

    @abstractmethod
    def vectors(self, user_id: str) -> tuple[list[VectorItem], int]:
        """Every fact, entity and episode-chunk embedding of the user, and the version they reflect."""

    @abstractmethod
    def get_chunks(
        self, user_id: str, chunk_ids: Sequence[str] = (), *, episode_ids: Sequence[str] = ()
    ) -> list[ChunkRecord]:
        """Chunks by id or by episode (embeddings omitted, ``fact_ids`` filled), in conversation order."""

    @abstractmethod
    def add_chunks(self, user_id: str, chunks: Sequence[ChunkRecord]) -> int:
        """Store chunks (with their keyword entries) for stored episodes that have none yet; chunks of an
        unknown episode or of one that already has chunks are skipped. Bumps the version when any is
        stored; returns how many were."""

    @abstractmethod
    def remove_chunks(self, user_id: str, chunk_ids: Sequence[str]) -> list[str]:
        """Delete the user's chunks (and their keyword entries) by id, episodes stay; returns the ids
        removed, sorted. Bumps the version when any is removed."""

    @abstractmethod
    def neighbour_chunks(self, user_id: str, chunk_ids: Sequence[str], window: int) -> list[ChunkRecord]:
        """Up to ``window`` chunks before and after each given one, in the user's conversation order
        (event time, message id, position)."""

    @abstractmethod
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

    @abstractmethod
    def list_users(self) -> list[str]: ...

    @abstractmethod
    def episodes(self, user_id: str) -> list[StoredEpisode]:
        """Every stored episode of the user with its provenance links (sorted fact and entity ids),
        ordered by (event_time, id)."""

    # -------------------------------------------------------------------------------------- delete
    @abstractmethod
    def forget_message(self, user_id: str, message_id: str) -> ForgetResult:
        """Delete the episode; facts and entities whose only source it was go too (no orphans);
        facts that other messages also stated only lose that provenance link."""

    @abstractmethod
    def forget_fact(self, user_id: str, fact_id: str) -> ForgetResult:
        """Delete one fact (older facts it superseded are repaired as in ``forget_message``) and the
        entities it leaves orphaned; episodes stay. Unknown ids change nothing and return zeros."""

    @abstractmethod
    def forget_user(self, user_id: str) -> ForgetResult: ...

    # --------------------------------------------------------------------------------- maintenance
    @abstractmethod
    def decay(self, user_id: str, *, now: datetime, per_day: float, threshold: float, batch: int) -> tuple[int, int]:
        """strength *= per_day ** (days since the fact's ``last_decay_at`` or ``created_at``), set
        ``last_decay_at = now``; facts below ``threshold`` become archived. Facts whose last decay is
        at or after ``now`` are untouched, so a repeated run changes nothing. Works in transactions of
        at most ``batch`` facts. Returns (decayed, archived)."""

    @abstractmethod
    def reinforce(self, user_id: str, fact_ids: Sequence[str], *, amount: float, now: datetime) -> int:
        """strength = min(1, strength + amount); un-archives. Returns how many facts changed."""

    @abstractmethod
    def replace_clusters(self, user_id: str, clusters: Sequence[ClusterRecord]) -> None:
        """Replace the user's cluster nodes and their member links in one transaction."""

    @abstractmethod
    def clusters(self, user_id: str) -> list[ClusterRecord]: ...

    @abstractmethod
    def add_feedback(self, rows: Sequence[FeedbackRow]) -> None: ...

    @abstractmethod
    def feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        """Newest first; ``user_id=None`` means every user."""

    @abstractmethod
    def save_weights(self, weights: LearnedWeights) -> None: ...

    @abstractmethod
    def load_weights(self, scope: str) -> LearnedWeights | None: ...
