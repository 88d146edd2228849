"""Concise builders for the contract suite: records, write plans and small deterministic embeddings.

Every timestamp is a whole second after ``T0`` so that round trips can be compared exactly on any
backend, and every embedding has components in {-0.5, 0, 0.5} (exact in float32 and float64).
"""

from __future__ import annotations

import random
import uuid
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from engram_api.models import (
    ClusterRecord,
    EntityChange,
    EntityRecord,
    EpisodeRecord,
    FactChange,
    FactRecord,
    FeedbackRow,
    LearnedWeights,
    MemoryType,
    Usage,
    WritePlan,
)
from engram_api.naming import normalize_name
from engram_api.settings import Settings
from engram_api.storage import GraphStore, open_graph_store

T0 = datetime(2024, 1, 1, tzinfo=UTC)
DIM = 8


def at(days: float) -> datetime:
    """``T0`` plus ``days`` (fractions allowed; keep them to whole seconds)."""
    return T0 + timedelta(days=days)


def new_user() -> str:
    return f"u-{uuid.uuid4().hex}"


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def vec(key: str) -> list[float]:
    """A unit vector derived from ``key``: four components of +-0.5, the rest 0."""
    rng = random.Random(zlib.crc32(key.encode()))
    out = [0.0] * DIM
    for i in rng.sample(range(DIM), 4):
        out[i] = rng.choice((-0.5, 0.5))
    return out


def make_entity(
    user: str,
    name: str,
    label: str = "Thing",
    *,
    aliases: Sequence[str] = (),
    summary: str = "",
    embedding: bool = True,
    created_at: datetime = T0,
) -> EntityRecord:
    return EntityRecord(
        id=new_id("ent"),
        user_id=user,
        name=name,
        norm_name=normalize_name(name),
        label=label,
        aliases=list(aliases),
        summary=summary,
        embedding=vec(f"entity:{name}") if embedding else None,
        created_at=created_at,
        updated_at=created_at,
    )


def make_fact(
    user: str,
    subject: EntityRecord,
    predicate: str,
    obj: EntityRecord | None = None,
    *,
    statement: str | None = None,
    importance: float = 0.5,
    strength: float = 1.0,
    valid_from: datetime = T0,
    created_at: datetime | None = None,
    single_valued: bool = False,
    memory_type: MemoryType = "semantic",
    embedding: bool = True,
) -> FactRecord:
    """A new fact; ``created_at`` defaults to ``valid_from`` (decay measures age from it)."""
    text = statement or " ".join(p for p in (subject.name, predicate, obj.name if obj else None) if p)
    created = created_at or valid_from
    return FactRecord(
        id=new_id("fact"),
        user_id=user,
        subject_id=subject.id,
        subject_name=subject.name,
        predicate=predicate,
        object_id=obj.id if obj else None,
        object_name=obj.name if obj else None,
        statement=text,
        memory_type=memory_type,
        importance=importance,
        strength=strength,
        single_valued=single_valued,
        valid_from=valid_from,
        embedding=vec(f"fact:{text}") if embedding else None,
        created_at=created,
        updated_at=created,
    )


def supersede(old: FactRecord, new: FactRecord) -> FactChange:
    """The fact change consolidation emits when ``new`` replaces ``old`` from ``new.valid_from`` on."""
    return FactChange(id=old.id, valid_until=new.valid_from, superseded_by=new.id)


def plan(
    user: str,
    message_id: str,
    event_time: datetime = T0,
    *,
    entities: Iterable[EntityRecord] = (),
    facts: Iterable[FactRecord] = (),
    entity_changes: Iterable[EntityChange] = (),
    fact_changes: Iterable[FactChange] = (),
    reinforced: Iterable[str] = (),
    mentioned: Iterable[str] = (),
    linked: Iterable[str] = (),
    usage: Usage | None = None,
    content: str | None = None,
) -> WritePlan:
    return WritePlan(
        user_id=user,
        episode=EpisodeRecord(
            id=message_id,
            user_id=user,
            content=content if content is not None else f"message {message_id}",
            role="user",
            event_time=event_time,
            metadata={"source": "contract-test", "turn": 1},
            created_at=event_time,
            updated_at=event_time,
        ),
        new_entities=list(entities),
        entity_changes=list(entity_changes),
        new_facts=list(facts),
        fact_changes=list(fact_changes),
        reinforced_fact_ids=list(reinforced),
        mentioned_entity_ids=list(mentioned),
        linked_fact_ids=list(linked),
        usage=usage or Usage(),
    )


def make_cluster(
    user: str,
    label: str,
    *,
    facts: Sequence[FactRecord] = (),
    entities: Sequence[EntityRecord] = (),
    created_at: datetime = T0,
) -> ClusterRecord:
    return ClusterRecord(
        id=new_id("cluster"),
        user_id=user,
        label=label,
        summary=f"everything about {label}",
        member_fact_ids=[f.id for f in facts],
        member_entity_ids=[e.id for e in entities],
        centroid=vec(f"cluster:{label}"),
        signature=f"sig-{label}",
        created_at=created_at,
        updated_at=created_at,
    )


def make_feedback(user: str, fact_id: str, created_at: datetime, *, useful: bool = True) -> FeedbackRow:
    return FeedbackRow(
        user_id=user,
        recall_id=new_id("recall"),
        fact_id=fact_id,
        useful=useful,
        similarity=0.75,
        graph=0.5,
        strength=0.25,
        recency=0.125,
        importance=0.625,
        created_at=created_at,
    )


def make_weights(scope: str, alpha: float, *, fitted_at: datetime = T0) -> LearnedWeights:
    return LearnedWeights(
        scope=scope,
        alpha=alpha,
        beta=0.25,
        gamma=0.15,
        recency_weight=0.1,
        importance_weight=0.05,
        samples=40,
        quality=0.71,
        fitted_at=fitted_at,
    )


# ------------------------------------------------------------------------- other processes / threads


def open_store(backend: str, location: str) -> GraphStore:
    """Build a store from a picklable spec, so that spawned worker processes can open their own."""
    if backend == "sqlite":
        from engram_api.storage.graph.sqlite.store import SqliteGraphStore

        return SqliteGraphStore(path=Path(location))
    return open_graph_store(Settings(neo4j_uri=location))


def apply_in_process(backend: str, location: str, plans: Sequence[WritePlan]) -> list[bool]:
    """Run in a separate process: apply ``plans`` through a store of its own; report which applied."""
    store = open_store(backend, location)
    try:
        return [store.apply(p).applied for p in plans]
    finally:
        store.close()
