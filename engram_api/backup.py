"""Export and import of one user's memory as JSON lines (``engram export`` / ``engram import``).

Format (version 3): a header line, then every episode (with the ids of the facts and entities it is a
source of), every episode chunk (the recallable pieces of a message, as stored: cut, speaker and ids are
kept, not recomputed), every entity and every fact, superseded and archived ones included. Embeddings are
not written: import recomputes them from the same text the pipeline embeds (entity name, fact statement,
a chunk's speaker and words), and the index keeper rebuilds the user's vector indexes from them; the
stores rebuild a chunk's keyword entry as they write it.

Import replays the export through the normal write path: one ``WritePlan`` per episode, in episode order,
each idempotent by message id. A fact is created (with its exported validity, strength and archival) by
its first source episode; later sources only gain a provenance link (``linked_fact_ids``), so nothing is
reinforced. An interrupted import is resumed by running it again. Invariants: every line is validated
before anything is written (bad input raises ``InvalidInputError`` naming the line and changes nothing),
and a user that holds messages the file does not have is refused, never merged into. Topic clusters are
not exported: the hierarchy job rebuilds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator

from engram_api.errors import InvalidInputError
from engram_api.models import (
    ChunkRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    ImportResult,
    LearnedWeights,
    StoredEpisode,
    Usage,
    UserId,
    WritePlan,
    utcnow,
)
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.states import pack
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import own_end
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_api.versions import Stamp

__all__ = ["FORMAT", "VERSION", "ExportHeader", "export_lines", "read_export", "restore"]

FORMAT = "engram-export"
VERSION = 3
_PAGE = 1000  # the store's largest graph page
_EMBED_BATCH = 256


class ExportHeader(BaseModel):
    """The first line. The file is untrusted: its user id passes the rules of every user id, and the
    learned weights it carries can only be that user's own (never another user's, never the global ones)."""

    type: Literal["header"] = "header"
    format: Literal["engram-export"] = FORMAT
    version: int = VERSION
    user_id: UserId
    exported_at: str
    episodes: int
    chunks: int
    entities: int
    facts: int
    usage: Usage = Field(default_factory=Usage)
    weights: LearnedWeights | None = None

    @field_validator("weights")
    @classmethod
    def _own_weights(cls, value: LearnedWeights | None, info: ValidationInfo) -> LearnedWeights | None:
        if value is not None and value.scope != info.data.get("user_id"):
            raise ValueError(f"are scoped to {value.scope[:40]!r}, not to the file's user")
        return value


class Snapshot(BaseModel):
    header: ExportHeader
    episodes: list[StoredEpisode]
    chunks: list[ChunkRecord]
    entities: list[EntityRecord]
    facts: list[FactRecord]


def _line(kind: str, record: BaseModel) -> str:
    # A chunk's fact_ids are read from the episode's provenance, which the episode line already carries.
    exclude = {"embedding", "token_states", "hops", *(("fact_ids",) if kind == "chunk" else ())}
    return json.dumps({"type": kind, **record.model_dump(mode="json", exclude=exclude)})


def export_lines(graph: GraphStore, user_id: str) -> Iterator[str]:
    """The user's memory as JSON lines (no trailing newlines), header first."""
    episodes = graph.episodes(user_id)
    chunks = graph.get_chunks(user_id, episode_ids=[ep.id for ep in episodes])
    facts: list[FactRecord] = []
    entities: dict[str, EntityRecord] = {}
    page = graph.page(user_id, 1, _PAGE)
    while page.facts:
        facts.extend(page.facts)
        entities.update({e.id: e for e in page.entities})
        page = graph.page(user_id, page.page + 1, _PAGE)
    # Entities no fact mentions any more, kept by an episode's provenance.
    kept = sorted({eid for ep in episodes for eid in ep.entity_ids} - entities.keys())
    entities.update({e.id: e for e in graph.get_entities(user_id, kept)})
    header = ExportHeader(
        user_id=user_id,
        exported_at=utcnow().isoformat(),
        episodes=len(episodes),
        chunks=len(chunks),
        entities=len(entities),
        facts=len(facts),
        usage=graph.stats(user_id).usage,
        weights=graph.load_weights(user_id),
    )
    yield json.dumps(header.model_dump(mode="json"))
    yield from (_line("episode", ep) for ep in episodes)
    yield from (_line("chunk", chunk) for chunk in chunks)
    yield from (_line("entity", entities[eid]) for eid in sorted(entities))
    yield from (_line("fact", fact) for fact in facts)


_KINDS: dict[str, type[BaseModel]] = {
    "episode": StoredEpisode,
    "chunk": ChunkRecord,
    "entity": EntityRecord,
    "fact": FactRecord,
}


def read_export(lines: Iterable[str]) -> Snapshot:
    """Parse and check a whole export; raises ``InvalidInputError`` naming the first bad line."""
    header: ExportHeader | None = None
    records: dict[str, list[Any]] = {kind: [] for kind in _KINDS}
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        field = f"line {number}"
        try:
            data = json.loads(raw)
        except ValueError:
            raise InvalidInputError(field, "is not JSON") from None
        kind = data.get("type") if isinstance(data, dict) else None
        try:
            if header is None:
                if kind != "header" or data.get("format") != FORMAT:
                    raise InvalidInputError(field, f"expected the {FORMAT} header line first")
                if data.get("version") != VERSION:
                    raise InvalidInputError(
                        field, f"export version {data.get('version')!r} is not {VERSION} (re-export with this Engram)"
                    )
                header = ExportHeader.model_validate(data)
            elif kind in _KINDS:
                records[kind].append(_KINDS[kind].model_validate(data))
            else:
                raise InvalidInputError(field, f"unknown line type {str(kind)[:20]!r}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidInputError(f"{field}.{where}", first["msg"]) from None
    if header is None:
        raise InvalidInputError("file", "is empty")
    snapshot = Snapshot(
        header=header,
        episodes=records["episode"],
        chunks=records["chunk"],
        entities=records["entity"],
        facts=records["fact"],
    )
    _check(snapshot)
    return snapshot


def _check(snapshot: Snapshot) -> None:
    user = snapshot.header.user_id
    for record in (*snapshot.episodes, *snapshot.chunks, *snapshot.entities, *snapshot.facts):
        if record.user_id != user:
            raise InvalidInputError(f"record {record.id}", f"belongs to {record.user_id!r}, not {user!r}")
    entity_ids = {e.id for e in snapshot.entities}
    fact_ids = {f.id for f in snapshot.facts}
    for fact in snapshot.facts:
        missing = {fact.subject_id, fact.object_id or fact.subject_id} - entity_ids
        if missing:
            raise InvalidInputError(f"fact {fact.id}", f"mentions entities not in the file: {sorted(missing)}")
    for ep in snapshot.episodes:
        if set(ep.fact_ids) - fact_ids or set(ep.entity_ids) - entity_ids:
            raise InvalidInputError(f"episode {ep.id}", "is the source of facts or entities not in the file")
    episode_ids = {ep.id for ep in snapshot.episodes}
    for chunk in snapshot.chunks:
        if chunk.episode_id not in episode_ids:
            raise InvalidInputError(f"chunk {chunk.id}", f"belongs to message {chunk.episode_id!r}, not in the file")
    sourced = {fid for ep in snapshot.episodes for fid in ep.fact_ids}
    if fact_ids - sourced:
        raise InvalidInputError("facts", f"{len(fact_ids - sourced)} facts have no episode in the file")


def _plans(snapshot: Snapshot) -> list[WritePlan]:
    """One plan per episode (with its chunks); each fact and entity is created by the first episode that
    needs it."""
    facts = {f.id: f for f in snapshot.facts}
    chunks: dict[str, list[ChunkRecord]] = {}
    for chunk in snapshot.chunks:
        chunks.setdefault(chunk.episode_id, []).append(chunk)
    entities = {e.id: e for e in snapshot.entities}
    created: set[str] = set()
    plans = []
    for n, ep in enumerate(snapshot.episodes):
        new_facts = [facts[fid] for fid in ep.fact_ids if fid not in created]
        needed = [*ep.entity_ids, *(eid for f in new_facts for eid in (f.subject_id, f.object_id) if eid)]
        new_entities = [entities[eid] for eid in dict.fromkeys(needed) if eid not in created]
        linked = [fid for fid in ep.fact_ids if fid in created]
        mentioned = [eid for eid in ep.entity_ids if eid in created]
        created.update(f.id for f in new_facts)
        created.update(e.id for e in new_entities)
        plans.append(
            WritePlan(
                user_id=ep.user_id,
                episode=EpisodeRecord.model_validate(ep.model_dump(exclude={"fact_ids", "entity_ids"})),
                new_entities=new_entities,
                new_facts=new_facts,
                linked_fact_ids=linked,
                mentioned_entity_ids=mentioned,
                chunks=chunks.get(ep.id, []),
                # The user's LLM spend rides on the first episode, so a resumed import counts it once.
                usage=snapshot.header.usage if n == 0 else Usage(),
            )
        )
    return plans


def _embed(embedder: Embedder, plans: list[WritePlan]) -> None:
    """Each record's vector, and each fact's and chunk's token states from the same pass (as apply keeps
    them: a statement's every word, a chunk's own words), so a restored memory recalls as it did."""
    records = [r for p in plans for r in (*p.new_entities, *p.new_facts, *p.chunks)]
    texts = [
        r.name if isinstance(r, EntityRecord) else r.statement if isinstance(r, FactRecord) else r.indexed_text
        for r in records
    ]
    for start in range(0, len(records), _EMBED_BATCH):
        batch, batch_texts = records[start : start + _EMBED_BATCH], texts[start : start + _EMBED_BATCH]
        vectors, kept = embedder.encode_states(batch_texts, [own_end(t) for t in batch_texts])
        for record, vector, held in zip(batch, vectors, kept, strict=True):
            record.embedding = vector.tolist()
            if not isinstance(record, EntityRecord):
                record.token_states = pack(held)


def restore(snapshot: Snapshot, *, graph: GraphStore, embedder: Embedder, writes: UserWrites) -> ImportResult:
    """Write a snapshot back as one user write (the lease and fence the apply stage takes)."""
    user = snapshot.header.user_id
    plans = _plans(snapshot)
    pending = [p for p in plans if not graph.is_applied(user, p.episode.id)]
    stored = graph.stats(user).episodes
    if stored > len(plans) - len(pending):
        raise InvalidInputError(
            "user_id", f"{user!r} already has {stored} messages, not all from this file: run forget-user first"
        )
    _embed(embedder, pending)

    def write_all(write: UserWrite) -> Stamp:
        for plan in pending:
            graph.apply(plan)
        upserts = [
            (record.id, kind, record.embedding)
            for plan in pending
            for kind, records in (("entity", plan.new_entities), ("fact", plan.new_facts), ("episode", plan.chunks))
            for record in records
            if record.embedding is not None
        ]
        states = {
            record.id: record.token_states
            for plan in pending
            for record in (*plan.new_facts, *plan.chunks)
            if record.embedding is not None and record.token_states is not None
        }
        return write.finish(upserts=upserts, states=states)

    stamp = writes.run(user, write_all, wait=30.0)
    if snapshot.header.weights is not None:
        graph.save_weights(snapshot.header.weights)
    version = stamp.version
    return ImportResult(
        user_id=user,
        episodes=len(pending),
        skipped=len(plans) - len(pending),
        entities=len(snapshot.entities),
        facts=len(snapshot.facts),
        version=version,
    )
