"""The ingest role of the graph store: what the extract and apply stages read and write for a message.

Invariants:
- ``apply`` runs one transaction and is idempotent by (user_id, episode id); every record of a plan is
  the plan's user's (else ``InvalidInputError`` before any query);
- every applied message's chunks (``WritePlan.chunks``) are stored with it, carry their embedding into
  ``vectors`` (kind "episode") and are in the user's keyword index together with fact statements;
- the reads answer in one round trip where the backend has round trips (``extraction_context``,
  ``facts_and_slots``), and never return another user's records.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from engram_api.models import ApplyOutcome, EntityRecord, EpisodeRecord, FactRecord, WritePlan
from engram_api.storage.graph.base import StoreBase, check_count, check_owned, dedupe, distinct, guarded

__all__ = ["ContextReads", "ExtractionContext", "IngestStore"]

# ``facts_and_slots`` asks for no turns: any instant does.
_NO_TURNS = datetime(1970, 1, 1, tzinfo=UTC)


class ExtractionContext(BaseModel):
    """What the extract stage reads for one message's prompt (``IngestStore.extraction_context``):
    ``entities`` (without embeddings, as ``lookup_entities``) and ``facts`` by id, every fact (current,
    superseded and archived) of the (subject_id, predicate) ``slots``, and the user's last ``turns``
    episodes with ``event_time < before``, oldest first."""

    entities: list[EntityRecord] = Field(default_factory=list)
    facts: list[FactRecord] = Field(default_factory=list)
    slot_facts: list[FactRecord] = Field(default_factory=list)
    episodes: list[EpisodeRecord] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ContextReads:
    """What a backend's ``_extraction_context`` reads: distinct ids and slots, not all empty with no turns
    (``turns`` 0 reads no episodes)."""

    entity_ids: list[str]
    fact_ids: list[str]
    slots: list[tuple[str, str]]
    before: datetime
    turns: int


def _plan_owned(args: dict[str, Any]) -> bool:
    plan: WritePlan = args["plan"]
    check_owned("plan", plan.user_id, [plan.episode, *plan.new_entities, *plan.new_facts])
    return True


class IngestStore(StoreBase):
    """Reads and the write of the ingest path (``engram_workers.stages``, ``consolidation``)."""

    @abstractmethod
    def is_applied(self, user_id: str, message_id: str) -> bool:
        """True when the episode ``message_id`` is already stored for ``user_id``."""

    @abstractmethod
    @guarded(distinct("entity_ids", "norm_names"))
    def lookup_entities(
        self, user_id: str, *, entity_ids: Sequence[str], norm_names: Sequence[str]
    ) -> list[EntityRecord]:
        """Each entity whose id is in ``entity_ids`` or whose ``norm_name`` or any normalized alias is in
        ``norm_names``, once, in ONE query, WITHOUT embeddings (``embedding`` is None: consolidation
        resolves names through the index, never a stored vector, and reading 384 floats an entity back was
        a third of the lookup's client CPU on Neo4j). Consolidation fetches everything a message may
        resolve to with it."""

    def facts_and_slots(
        self, user_id: str, *, fact_ids: Sequence[str], slots: Sequence[tuple[str, str]]
    ) -> tuple[list[FactRecord], list[FactRecord]]:
        """The facts ``fact_ids`` and every fact of the one-value ``slots`` (superseded too) in one call
        (consolidation's read of a message): ``extraction_context`` without entities or turns."""
        ids, pairs = dedupe(fact_ids), dedupe([(s, p) for s, p in slots])
        if not (ids or pairs):
            return [], []
        read = self._extraction_context(user_id, ContextReads([], ids, pairs, _NO_TURNS, 0))
        return read.facts, read.slot_facts

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
        """The extract stage's reads of a message (see ``ExtractionContext``), one round trip where the
        backend has round trips."""
        ids, facts, pairs = dedupe(entity_ids), dedupe(fact_ids), dedupe([(s, p) for s, p in slots])
        if not (ids or facts or pairs or check_count("turns", turns)):
            return ExtractionContext()
        return self._extraction_context(user_id, ContextReads(ids, facts, pairs, before, turns))

    @abstractmethod
    def _extraction_context(self, user_id: str, reads: ContextReads) -> ExtractionContext:
        """``extraction_context``'s reads in one round trip where the backend has round trips."""

    @abstractmethod
    @guarded(_plan_owned, nothing=lambda: None)
    def apply(self, plan: WritePlan) -> ApplyOutcome:
        """Write one message's plan in one transaction; a stored episode makes it a no-op.

        Creates the episode, new entities and facts (with ``FROM`` provenance to the episode), applies
        entity and fact changes, reinforces restated facts (strength back to 1.0, provenance added),
        links mentioned entities and ``linked_fact_ids`` to the episode (no reinforcement), stores the
        episode's chunks (and their keyword entries), adds the plan's usage to the user's totals and bumps
        the user's version. Returns the version after the write (or the current one when skipped).
        """
