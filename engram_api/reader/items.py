"""Recall candidates and what a recall returns of them: the candidate record and the item a scored
candidate becomes. Fusion (``reader.fusion``) gathers, scores and orders candidates (best first by score,
nothing reordered after); this module shapes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import TypeAdapter

from engram_api.models import Channel as ChannelName
from engram_api.models import RecallItem
from engram_api.reader.scoring import ComponentValues
from engram_api.storage.graph.validity import valid_at
from engram_api.storage.snapshot.rows import AnyChunk, AnyFact

__all__ = ["Candidate", "Row", "result_items"]


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


# The k items of a recall validated in one call: one ``RecallItem`` (and its breakdown) built by pydantic's
# core per item, without a Python ``__init__`` for each item and each breakdown (~1 us an item less).
_ITEMS: TypeAdapter[list[RecallItem]] = TypeAdapter(list[RecallItem])


def result_items(rows: Sequence[Row], hops: dict[str, int], now: datetime) -> list[RecallItem]:
    """The result items of scored candidates' rows, in their order (``item_fields`` each)."""
    return _ITEMS.validate_python([item_fields(row, hops, now) for row in rows])


def item_fields(row: Row, hops: dict[str, int], now: datetime) -> dict[str, Any]:
    """The fields of a scored candidate's result item: what it says, when, which channels found it, its
    sources, its score's breakdown. ``now``: the recall's reading of the clock, which ``current`` is judged
    at (a fact's ``current_at(None)``, read once a recall instead of once an item)."""
    total, node_id, cand, comp = row
    found = cand.channels
    vector = "fact_vector" in found or "episode_vector" in found
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
    similarity, graph, strength, recency, importance = comp  # ``SCORE_COMPONENTS`` order
    common = {
        "id": node_id,
        "kind": cand.kind,
        "channels": cand.channels,
        "path": path,
        "hops": hops.get(node_id, -1),
        "score": round(total, 6),
        "breakdown": {
            "similarity": similarity, "graph": graph, "strength": strength, "recency": recency,
            "importance": importance, "rrf": cand.fusion, "total": total,
        },
    }  # fmt: skip
    fact = cand.fact
    if fact is not None:
        return {
            **common,
            "statement": fact.statement,
            "memory_type": fact.memory_type,
            "subject": fact.subject_name,
            "predicate": fact.predicate,
            "object": fact.object_name,
            "entities": [n for n in (fact.subject_name, fact.object_name) if n],
            "valid_from": fact.valid_from,
            "valid_until": fact.valid_until,
            "event_time": fact.valid_from,
            "current": valid_at(fact.valid_from, fact.valid_until, fact.archived, now),
            "source_ids": fact.source_ids,
        }
    chunk = cand.chunk
    assert chunk is not None
    return {
        **common,
        "statement": chunk.text,
        "memory_type": "episodic",
        "subject": chunk.speaker,
        "predicate": "SAID",
        "object": None,
        "entities": [],
        "valid_from": chunk.event_time,
        "valid_until": None,
        "event_time": chunk.event_time,
        "current": False,
        "speaker": chunk.speaker,
        "source_ids": [chunk.episode_id],
    }
