"""Recall candidates and what a recall returns of them: the candidate record and the item a scored
candidate becomes. Fusion (``reader.fusion``) gathers, scores and orders candidates (best first by score,
nothing reordered after); this module shapes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engram_api.models import Channel as ChannelName
from engram_api.models import RecallItem, ScoreBreakdown
from engram_api.reader.scoring import ComponentValues
from engram_api.storage.snapshot.rows import AnyChunk, AnyFact

__all__ = ["Candidate", "Row", "recall_item"]


@dataclass(slots=True)
class Candidate:
    """A recall candidate: a fact or an episode chunk, its fusion score and the channels that found it."""

    kind: Literal["fact", "episode"]
    fact: AnyFact | None = None  # a model, or a held snapshot's view of one: read by field name alike
    chunk: AnyChunk | None = None
    fusion: float = 0.0
    channels: list[ChannelName] = field(default_factory=list)

    def add(self, channel: ChannelName, amount: float) -> None:
        self.fusion += amount
        if channel not in self.channels:
            self.channels.append(channel)


# (total, node id, candidate, components): the breakdown model is built for the k items returned only.
Row = tuple[float, str, Candidate, ComponentValues]


def recall_item(node_id: str, cand: Candidate, breakdown: ScoreBreakdown, hops: dict[str, int]) -> RecallItem:
    """The result item of a scored candidate: what it says, when, which channels found it, its sources."""
    found = set(cand.channels)
    vector = bool(found & {"fact_vector", "episode_vector"})
    path = (
        "both"
        if vector and "graph" in found
        else "vector"
        if vector
        else "graph"
        if "graph" in found
        else "keyword"
        if "keyword" in found
        else "linked"
    )
    common = {
        "id": node_id,
        "kind": cand.kind,
        "channels": cand.channels,
        "path": path,
        "hops": hops.get(node_id, -1),
        "score": round(breakdown.total, 6),
        "breakdown": breakdown,
    }
    if cand.fact is not None:
        fact = cand.fact
        return RecallItem(
            **common,
            statement=fact.statement,
            memory_type=fact.memory_type,
            subject=fact.subject_name,
            predicate=fact.predicate,
            object=fact.object_name,
            entities=[n for n in (fact.subject_name, fact.object_name) if n],
            valid_from=fact.valid_from,
            valid_until=fact.valid_until,
            event_time=fact.valid_from,
            current=fact.current_at(None),
            source_ids=fact.source_ids,
        )
    chunk = cand.chunk
    assert chunk is not None
    return RecallItem(
        **common,
        statement=chunk.text,
        memory_type="episodic",
        subject=chunk.speaker,
        predicate="SAID",
        object=None,
        entities=[],
        valid_from=chunk.event_time,
        valid_until=None,
        event_time=chunk.event_time,
        current=False,
        speaker=chunk.speaker,
        source_ids=[chunk.episode_id],
    )
