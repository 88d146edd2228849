"""Builders for the maintenance tests: one user's entities and facts written through ``graph.apply``,
with real MiniLM embeddings or deterministic random unit vectors of the same dimension."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from engram_api.models import EntityRecord, EpisodeRecord, FactRecord, WritePlan
from engram_api.naming import normalize_name
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import chunk_episode
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_api.versions import Stamp

T0 = datetime(2024, 1, 1, tzinfo=UTC)
DIM = 384  # MiniLM's dimension, used for synthetic vectors too so every backend sees one index shape

Encode = Callable[[list[str]], np.ndarray]


def at(days: float) -> datetime:
    return T0 + timedelta(days=days)


def new_user() -> str:
    return f"u-{uuid.uuid4().hex}"


def random_encode(texts: list[str]) -> np.ndarray:
    """Deterministic unit vectors keyed by text: for tests where embedding quality does not matter."""
    rows = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(DIM)
        rows.append(v / np.linalg.norm(v))
    return np.array(rows, dtype=np.float32).reshape(len(texts), DIM)


@dataclass
class UserGraph:
    """Writes one user's memory, one message (WritePlan) at a time, reusing entities by name."""

    graph: GraphStore
    user_id: str
    encode: Encode = random_encode
    entities: dict[str, EntityRecord] = field(default_factory=dict)

    def _entity(self, name: str, label: str, new: list[EntityRecord], when: datetime) -> EntityRecord:
        key = normalize_name(name)
        if key not in self.entities:
            self.entities[key] = EntityRecord(
                id=f"ent-{uuid.uuid4().hex}",
                user_id=self.user_id,
                name=name,
                norm_name=key,
                label=label,
                embedding=self.encode([name])[0].tolist(),
                created_at=when,
                updated_at=when,
            )
            new.append(self.entities[key])
        return self.entities[key]

    def say(
        self,
        facts: Sequence[tuple[str, str, str | None, str]],
        *,
        when: datetime = T0,
        strength: float = 1.0,
        chunked: bool = False,
    ) -> list[FactRecord]:
        """Apply one message stating ``facts`` as (subject, PREDICATE, object or None, statement); with
        ``chunked`` it is stored with its chunks, as the apply stage does, else as before hybrid memory."""
        new_entities: list[EntityRecord] = []
        records = []
        vectors = self.encode([statement for *_, statement in facts])
        for (subject, predicate, obj, statement), vector in zip(facts, vectors, strict=True):
            s = self._entity(subject, "Person", new_entities, when)
            o = self._entity(obj, "Thing", new_entities, when) if obj else None
            records.append(
                FactRecord(
                    id=f"fact-{uuid.uuid4().hex}",
                    user_id=self.user_id,
                    subject_id=s.id,
                    subject_name=s.name,
                    predicate=predicate,
                    object_id=o.id if o else None,
                    object_name=o.name if o else None,
                    statement=statement,
                    strength=strength,
                    valid_from=when,
                    embedding=vector.tolist(),
                    created_at=when,
                    updated_at=when,
                )
            )
        message_id = f"m-{uuid.uuid4().hex}"
        episode = EpisodeRecord(
            id=message_id,
            user_id=self.user_id,
            content="; ".join(statement for *_, statement in facts),
            event_time=when,
            created_at=when,
            updated_at=when,
        )
        chunks = chunk_episode(episode) if chunked else []
        for chunk in chunks:
            chunk.embedding = self.encode([chunk.indexed_text])[0].tolist()
        outcome = self.graph.apply(
            WritePlan(
                user_id=self.user_id,
                episode=episode,
                new_entities=new_entities,
                new_facts=records,
                chunks=chunks,
            )
        )
        assert outcome.applied
        return records


class GuardSpy:
    """The jobs' real guard (``UserWrites.open``, without Redis) that also records which user it is held
    for, so tests can check writes happen under it."""

    def __init__(self, writes: UserWrites) -> None:
        self.writes = writes
        self.held: str | None = None
        self.entered: list[str] = []
        # Jobs record a user's exception and carry on, so a violation is also kept here for the fixture.
        self.violations: list[str] = []

    def check(self, owner: str, what: str) -> None:
        if self.held != owner:
            self.violations.append(f"{what} for {owner} outside its guard (held: {self.held})")
            raise AssertionError(self.violations[-1])

    @contextmanager
    def __call__(self, user_id: str) -> Iterator[UserWrite]:
        assert self.held is None, "guards must not nest"
        self.held = user_id
        self.entered.append(user_id)
        try:
            with self.writes.open(user_id, wait=0) as write:
                yield write
        finally:
            self.held = None


class GuardedGraph:
    """Passes everything to the real store but fails a per-user write made outside that user's guard."""

    WRITES = frozenset(
        {
            "decay",
            "reinforce",
            "replace_clusters",
            "apply",
            "forget_message",
            "add_chunks",
            "remove_chunks",
            "reembed_chunks",
        }
    )

    def __init__(self, graph: GraphStore, spy: GuardSpy) -> None:
        self._graph = graph
        self._spy = spy

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._graph, name)
        if name in self.WRITES:

            def checked(user_id: Any, *args: Any, **kwargs: Any) -> Any:
                self._spy.check(user_id.user_id if hasattr(user_id, "user_id") else user_id, name)
                return attr(user_id, *args, **kwargs)

            return checked
        if name == "save_weights":

            def save(weights: Any) -> Any:
                if weights.scope != "global":
                    self._spy.check(weights.scope, name)
                return attr(weights)

            return save
        return attr


def ids(records: Iterable[FactRecord | EntityRecord]) -> set[str]:
    return {r.id for r in records}


def write_step(write: UserWrite, said: UserGraph, step: int, messages: list[str], *, things: int = 1) -> Stamp:
    """Message ``step`` inside ``write``, as a write of the apply stage goes on a host (the plan reads the
    host's index first, one graph write, ``finish`` with that write's vectors): Alex likes (and saw) thing
    ``step`` (``things`` facts); every third step also forgets ``messages``' oldest, as ``forget`` does
    (its removals into the same ``finish``). For the FAISS delta-log and many-hosts tests, which need many
    quick writes on synthetic vectors rather than the stage's MiniLM."""
    write.index()
    before = set(said.entities)
    statements = [("Alex", "LIKES", f"thing {step}", f"Alex likes thing {step}")]
    statements += [("Alex", "SAW", f"place {step}", f"Alex saw place {step}")][: things - 1]
    records = [r for statement in statements for r in said.say([statement], when=at(step))]
    upserts = [(r.id, "fact", r.embedding or []) for r in records]
    upserts += [(e.id, "entity", e.embedding or []) for k, e in said.entities.items() if k not in before]
    removals: list[str] = []
    if step % 3 == 2 and messages:
        gone = said.graph.forget_message(said.user_id, messages.pop(0))
        removals = [*gone.removed_fact_ids, *gone.removed_entity_ids, *gone.removed_chunk_ids]
    return write.finish(upserts=upserts, removals=removals)
