"""Consolidation: turn one message's extraction into a ``WritePlan`` against the user's existing graph.

Runs under the user's apply lock, so what it reads cannot change under it. Decisions, in order:
1. entity resolution, always within the user's own graph: context id given by the model, exact and
   normalized name or alias, then embedding similarity (same label, high threshold);
2. fact dedup by embedding similarity, except single-valued predicates, whose template sentences
   ("lives in Tampa" / "lives in Austin") embed almost identically;
3. temporal supersession for single-valued predicates, scoped to one subject and predicate: the slot's
   facts are ordered by ``valid_from`` and each one's ``valid_until`` is the next one's start. Ordering by
   event time (not arrival) makes the result independent of delivery order: a late message with an older
   event time lands in the past, already superseded.
Ids are derived from (user, message, position), so re-planning the same message gives the same ids.
The message itself is kept recallable: its chunks (``storage.episodes.chunk_envelope``) are embedded in
the same single batch as the names and statements and go into the plan and the user's index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engram_api.models import (
    SELF_REF,
    EntityChange,
    EntityRecord,
    Envelope,
    EpisodeRecord,
    Extraction,
    FactChange,
    FactRecord,
    Usage,
    WritePlan,
)
from engram_api.naming import SINGLE_VALUED, normalize_name, sanitize_label, sanitize_predicate, self_entity_id
from engram_api.storage.base import GraphStore
from engram_api.storage.embedder import Embedder
from engram_api.storage.episodes import chunk_envelope
from engram_api.storage.vectors import Kind, UserIndex

__all__ = ["Planned", "plan_message"]

ENTITY_MATCH = 0.90
FACT_DUPLICATE = 0.93


def _hid(prefix: str, *parts: str) -> str:
    return prefix + hashlib.blake2b("\x1f".join(parts).encode(), digest_size=12).hexdigest()


class _Vectors:
    """Every text a message may need embedded, encoded in ONE batch (a model call has a fixed cost
    that dominated the apply stage when paid per name); anything unforeseen is encoded on demand."""

    def __init__(self, embedder: Embedder, texts: Sequence[str]) -> None:
        self.embedder = embedder
        unique = list(dict.fromkeys(t for t in texts if t))
        self._known = dict(zip(unique, embedder.encode(unique), strict=True)) if unique else {}

    def __call__(self, text: str) -> np.ndarray:
        if text not in self._known:
            self._known[text] = self.embedder.encode_one(text)
        return self._known[text]


def _texts(extraction: Extraction) -> list[str]:
    names = [e.name for e in extraction.entities]
    # A fact may name a thing instead of referring to a listed entity: that name gets an entity too.
    listed = {e.ref for e in extraction.entities} | {SELF_REF}
    refs = [r.strip()[:200] for f in extraction.facts for r in (f.subject, f.object or "") if r and r not in listed]
    statements = [" ".join(f.statement.split())[:1000] for f in extraction.facts]
    return [*names, *refs, *statements, "User"]


@dataclass
class Planned:
    plan: WritePlan
    upserts: list[tuple[str, Kind, Sequence[float]]] = field(default_factory=list)


@dataclass
class _Resolver:
    """Maps the extraction's entity refs (and bare names) to entity ids in the user's graph."""

    user_id: str
    message_id: str
    graph: GraphStore
    vectors: _Vectors
    index: UserIndex
    by_ref: dict[str, str] = field(default_factory=dict)
    by_norm: dict[str, str] = field(default_factory=dict)
    new: dict[str, EntityRecord] = field(default_factory=dict)
    changes: dict[str, EntityChange] = field(default_factory=dict)
    mentioned: set[str] = field(default_factory=set)

    def _existing_self(self) -> None:
        sid = self_entity_id(self.user_id)
        self.by_ref[SELF_REF] = sid
        if not self.graph.get_entities(self.user_id, [sid]):
            self.new[sid] = EntityRecord(
                id=sid,
                user_id=self.user_id,
                name="User",
                norm_name=normalize_name("User"),
                label="Person",
                summary="the person whose memory this is",
            )

    def _add_aliases(self, entity_id: str, names: Sequence[str], known: set[str]) -> None:
        fresh = [n for n in names if normalize_name(n) and normalize_name(n) not in known]
        if not fresh:
            return
        if entity_id in self.new:
            rec = self.new[entity_id]
            rec.aliases = list(dict.fromkeys([*rec.aliases, *fresh]))
            return
        change = self.changes.setdefault(entity_id, EntityChange(id=entity_id))
        change.add_aliases = list(dict.fromkeys([*change.add_aliases, *fresh]))

    def resolve(self, extraction: Extraction) -> None:
        self._existing_self()
        wanted = {normalize_name(n) for e in extraction.entities for n in [e.name, *e.aliases]} - {""}
        existing = self.graph.find_entities(self.user_id, sorted(wanted)) if wanted else []
        context_ids = {e.ref for e in extraction.entities if e.ref.startswith("ent_")}
        by_id = {e.id: e for e in existing}
        if context_ids - by_id.keys():
            by_id.update({e.id: e for e in self.graph.get_entities(self.user_id, sorted(context_ids - by_id.keys()))})
        for rec in by_id.values():
            for n in [rec.name, *rec.aliases]:
                self.by_norm.setdefault(normalize_name(n), rec.id)

        unresolved = []
        for ent in extraction.entities:
            names = [ent.name, *ent.aliases]
            norms = [normalize_name(n) for n in names if normalize_name(n)]
            if not norms:
                continue
            target = ent.ref if ent.ref in by_id else next((self.by_norm[n] for n in norms if n in self.by_norm), None)
            if target is None:
                unresolved.append((ent, norms))
                continue
            self._link(ent.ref, target, names, by_id)

        if not unresolved:
            return
        for ent, norms in unresolved:
            vec = self.vectors(ent.name)
            # A name seen earlier in this same message resolves to that new entity.
            target = next((self.by_norm[n] for n in norms if n in self.by_norm), None)
            if target is None:
                label = sanitize_label(ent.label)
                for hit in self.index.search(vec, 3, kind="entity"):
                    if hit.score < ENTITY_MATCH:
                        break
                    cand = self.graph.get_entities(self.user_id, [hit.node_id])
                    if cand and cand[0].label == label:
                        target = cand[0].id
                        by_id[target] = cand[0]
                        break
            if target is None:
                target = _hid("ent_", self.user_id, self.message_id, ent.ref, norms[0])
                self.new[target] = EntityRecord(
                    id=target,
                    user_id=self.user_id,
                    name=ent.name.strip(),
                    norm_name=norms[0],
                    label=sanitize_label(ent.label),
                    aliases=[a for a in ent.aliases if a.strip()],
                    summary=ent.summary,
                    embedding=vec.tolist(),
                )
            for n in norms:
                self.by_norm.setdefault(n, target)
            self._link(ent.ref, target, [ent.name, *ent.aliases], by_id)

    def _link(self, ref: str, target: str, names: Sequence[str], by_id: dict[str, EntityRecord]) -> None:
        self.by_ref[ref] = target
        if target in by_id:
            rec = by_id[target]
            self.mentioned.add(target)
            self._add_aliases(target, names, {normalize_name(n) for n in [rec.name, *rec.aliases]})
        elif target in self.new:
            rec = self.new[target]
            self._add_aliases(target, names, {normalize_name(n) for n in [rec.name, *rec.aliases]})

    def entity_for(self, ref: str | None) -> str | None:
        """A fact may name a thing the model did not list as an entity: create it on the fly."""
        if ref is None or not ref.strip():
            return None
        if ref in self.by_ref:
            return self.by_ref[ref]
        norm = normalize_name(ref)
        if not norm:
            return None
        if norm in self.by_norm:
            return self.by_norm[norm]
        found = self.graph.find_entities(self.user_id, [norm])
        if found:
            self.by_norm[norm] = found[0].id
            self.mentioned.add(found[0].id)
            return found[0].id
        eid = _hid("ent_", self.user_id, self.message_id, "name", norm)
        self.new[eid] = EntityRecord(
            id=eid,
            user_id=self.user_id,
            name=ref.strip()[:200],
            norm_name=norm,
            label="Thing",
            embedding=self.vectors(ref.strip()[:200]).tolist(),
        )
        self.by_norm[norm] = eid
        return eid


def _chain(slot_facts: list[FactRecord]) -> dict[str, tuple[object, str | None]]:
    """Desired (valid_until, superseded_by) for each fact of one single-valued slot."""
    ordered = sorted(slot_facts, key=lambda f: (f.valid_from, f.created_at, f.id))
    out: dict[str, tuple[object, str | None]] = {}
    for cur, nxt in zip(ordered, [*ordered[1:], None], strict=True):
        out[cur.id] = (nxt.valid_from, nxt.id) if nxt is not None else (None, None)
    return out


def _draft_facts(
    envelope: Envelope, extraction: Extraction, resolver: _Resolver
) -> tuple[list[FactRecord], dict[str, str]]:
    """Fact records for the extraction (deduplicated within the message, embedded), and the model's
    "updates" hints by draft id."""
    uid, mid = envelope.user_id, envelope.message_id
    drafts: list[FactRecord] = []
    hints: dict[str, str] = {}
    seen: set[str] = set()
    for pos, fact in enumerate(extraction.facts):
        subject_id = resolver.entity_for(fact.subject)
        statement = " ".join(fact.statement.split())[:1000]
        if subject_id is None or normalize_name(statement) in seen:
            continue
        seen.add(normalize_name(statement))
        predicate = sanitize_predicate(fact.predicate)
        draft = FactRecord(
            id=_hid("fact_", uid, mid, str(pos)),
            user_id=uid,
            subject_id=subject_id,
            predicate=predicate,
            object_id=resolver.entity_for(fact.object),
            statement=statement,
            memory_type=fact.memory_type,
            importance=fact.importance,
            single_valued=fact.single_valued or predicate in SINGLE_VALUED,
            # created_at is when Engram learned it (decay counts from there): a backfill of old chats is
            # not "forgotten" on its first decay run.
            valid_from=fact.valid_from or envelope.timestamp,
        )
        drafts.append(draft)
        if fact.updates:
            hints[draft.id] = fact.updates
    if drafts:
        for draft in drafts:
            draft.embedding = resolver.vectors(draft.statement).tolist()
    return drafts, hints


def _consolidate_multi(
    uid: str,
    drafts: list[FactRecord],
    hints: dict[str, str],
    graph: GraphStore,
    index: UserIndex,
    new_facts: list[FactRecord],
    reinforced: list[str],
    changes: list[FactChange],
) -> None:
    """Multi-valued facts: a near-identical current fact of the same subject is reinforced instead of
    duplicated; a fact the model says replaces a context fact supersedes it."""
    hits = {
        d.id: [
            h
            for h in index.search(np.asarray(d.embedding, dtype=np.float32), 3, kind="fact")
            if h.score >= FACT_DUPLICATE
        ]
        for d in drafts
    }
    wanted = {h.node_id for hs in hits.values() for h in hs} | set(hints.values())
    known = {f.id: f for f in graph.get_facts(uid, sorted(wanted))} if wanted else {}
    for draft in drafts:
        dup = next(
            (
                h.node_id
                for h in hits[draft.id]
                if h.node_id in known
                and known[h.node_id].valid_until is None
                and known[h.node_id].subject_id == draft.subject_id
            ),
            None,
        )
        target = known.get(hints.get(draft.id, ""))
        if dup is None and target is not None and normalize_name(target.statement) == normalize_name(draft.statement):
            dup = target.id
        if dup is not None:
            reinforced.append(dup)
            continue
        new_facts.append(draft)
        if target is not None and target.valid_until is None and not target.single_valued:
            changes.append(FactChange(id=target.id, valid_until=draft.valid_from, superseded_by=draft.id))


def _supersede_single(
    uid: str,
    drafts: list[FactRecord],
    graph: GraphStore,
    new_facts: list[FactRecord],
    reinforced: list[str],
    changes: list[FactChange],
) -> None:
    """Single-valued facts: rebuild each (subject, predicate) slot's chain in event-time order."""
    slots = sorted({(f.subject_id, f.predicate) for f in drafts})
    existing = [f for f in graph.facts_for_slots(uid, slots) if not f.archived] if slots else []
    for slot in slots:
        slot_existing = [f for f in existing if (f.subject_id, f.predicate) == slot]
        slot_new: list[FactRecord] = []
        for draft in (f for f in drafts if (f.subject_id, f.predicate) == slot):
            timeline = sorted([*slot_existing, *slot_new], key=lambda f: (f.valid_from, f.created_at, f.id))
            before = [f for f in timeline if f.valid_from <= draft.valid_from]
            prev = before[-1] if before else None
            if (
                prev is not None
                and prev.object_id == draft.object_id
                and (draft.object_id is not None or normalize_name(prev.statement) == normalize_name(draft.statement))
            ):
                # Restated value: the same interval goes on; no new fact.
                if prev in slot_existing:
                    reinforced.append(prev.id)
                continue
            slot_new.append(draft)
        wanted = _chain([*slot_existing, *slot_new])
        for fact in slot_existing:
            until, by = wanted[fact.id]
            if (fact.valid_until, fact.superseded_by) != (until, by):
                changes.append(FactChange(id=fact.id, valid_until=until, superseded_by=by))  # type: ignore[arg-type]
        for draft in slot_new:
            draft.valid_until, draft.superseded_by = wanted[draft.id]  # type: ignore[assignment]
            new_facts.append(draft)


def plan_message(
    *,
    envelope: Envelope,
    extraction: Extraction,
    usage: Usage,
    graph: GraphStore,
    embedder: Embedder,
    index: UserIndex,
) -> Planned:
    uid, mid = envelope.user_id, envelope.message_id
    chunks = chunk_envelope(envelope)
    vectors = _Vectors(embedder, [*_texts(extraction), *(c.indexed_text for c in chunks)])
    for chunk in chunks:
        chunk.embedding = vectors(chunk.indexed_text).tolist()
    resolver = _Resolver(user_id=uid, message_id=mid, graph=graph, vectors=vectors, index=index)
    resolver.resolve(extraction)

    drafts, hints = _draft_facts(envelope, extraction, resolver)
    new_facts: list[FactRecord] = []
    reinforced: list[str] = []
    changes: list[FactChange] = []
    multi = [d for d in drafts if not d.single_valued]
    single = [d for d in drafts if d.single_valued]
    _consolidate_multi(uid, multi, hints, graph, index, new_facts, reinforced, changes)
    _supersede_single(uid, single, graph, new_facts, reinforced, changes)

    episode = EpisodeRecord(
        id=mid,
        user_id=uid,
        content=envelope.text,
        role=envelope.messages[-1].role,
        event_time=envelope.timestamp,
        metadata=envelope.metadata,
        created_at=envelope.timestamp,
    )
    used = {f.subject_id for f in new_facts} | {f.object_id for f in new_facts if f.object_id}
    listed = {eid for ref, eid in resolver.by_ref.items() if ref != SELF_REF}
    new_entities = [e for eid, e in resolver.new.items() if eid in used or eid in listed]
    mentioned = (resolver.mentioned | used) - set(resolver.new)
    plan = WritePlan(
        user_id=uid,
        episode=episode,
        new_entities=new_entities,
        entity_changes=list(resolver.changes.values()),
        new_facts=new_facts,
        fact_changes=changes,
        reinforced_fact_ids=sorted(set(reinforced)),
        mentioned_entity_ids=sorted(mentioned),
        chunks=chunks,
        usage=usage,
    )
    upserts: list[tuple[str, Kind, Sequence[float]]] = [
        (f.id, "fact", f.embedding) for f in new_facts if f.embedding is not None
    ]
    for ent in new_entities:
        if ent.embedding is None:
            ent.embedding = vectors(ent.name).tolist()
        upserts.append((ent.id, "entity", ent.embedding))
    upserts.extend((c.id, "episode", c.embedding) for c in chunks if c.embedding is not None)
    return Planned(plan=plan, upserts=upserts)
