"""Recall's graph step as data: the query (``GraphStepQuery``) and its answer (``GraphStep``).

Its own module because two sides answer it: ``GraphStore.graph_step`` (``contract``) and a held snapshot
(``engram_api.storage.snapshot.graph``), which the contract builds; both import these from here.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from engram_api.models import ChunkRecord, FactRecord, utcnow

__all__ = ["GraphStep", "GraphStepQuery"]


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
