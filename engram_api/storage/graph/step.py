"""Recall's graph step as data: the query (``GraphStepQuery``) and its answer (``GraphStep``).

Its own module because two sides answer it: ``RecallStore.graph_step`` (``recall``) and a held snapshot
(``engram_api.storage.snapshot.graph``), which the recall role builds; both import these from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from engram_api.models import ChunkRecord, FactRecord, utcnow
from engram_api.storage.graph.validity import instant

__all__ = ["GraphStep", "GraphStepQuery"]


class GraphStepQuery(BaseModel):
    """Recall's graph step: hydrate ``fact_ids`` and ``chunk_ids`` and expand from seeds, in one round trip
    (see ``RecallStore.graph_step``). ``known`` are facts the caller already holds at the user's current
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
    def at(self) -> datetime:
        """The instant facts must be valid at (``validity``): ``as_of``, else ``now`` (the current state)."""
        return instant(self.as_of, self.now)

    @property
    def expanding(self) -> bool:
        return self.limit > 0 and bool(self.seeds or self.seed_facts or (self.seed_chunks and self.seed_chunk_count))

    def chunk_facts_of(self, facts_of: Callable[[str], Sequence[str] | None]) -> tuple[list[str], list[str]]:
        """(sourced, chunk seeds): the facts extracted from the episodes of the user's ``chunk_facts``
        chunks (hydrated), and, when expanding, those of the first ``seed_chunk_count`` of ``seed_chunks``
        that are the user's, in list order (seed facts, hydrated too). ``facts_of(chunk id)`` is a chunk's
        ``fact_ids``, None when the user has no such chunk. The backends that seed in Python share this
        (SQLite, the snapshot); Neo4j does the same inside its one round trip (``Q_GRAPH_STEP``)."""
        sourced = [f for cid in self.chunk_facts for f in facts_of(cid) or ()]
        if not self.expanding:
            return sourced, []
        seeding = [facts for facts in map(facts_of, self.seed_chunks) if facts is not None][: self.seed_chunk_count]
        return sourced, [f for facts in seeding for f in facts]


class GraphStep(BaseModel):
    """``facts``: every asked or reached fact of the user that is not in ``known`` (any order);
    ``hops``: the reached facts as (fact id, hops), nearest first; ``chunks``: the user's chunks among
    ``chunk_ids`` (any order)."""

    facts: list[FactRecord] = Field(default_factory=list)
    hops: list[tuple[str, int]] = Field(default_factory=list)
    chunks: list[ChunkRecord] = Field(default_factory=list)
