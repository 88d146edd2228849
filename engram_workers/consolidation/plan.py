"""Consolidation: turn one message's extraction into a ``WritePlan`` against the user's existing graph.

Runs under the user's apply lock, so what it reads cannot change under it. Decisions, in order:
1. entity resolution, always within the user's own graph (``engram_workers.consolidation.resolution``: context id,
   name or alias, embedding similarity; the self node is never rebound; an id never becomes an entity);
2. fact dedup by embedding similarity, except single-valued predicates, whose template sentences
   ("lives in Tampa" / "lives in Austin") embed almost identically;
3. temporal supersession for single-valued predicates, scoped to one subject and predicate: the slot's
   facts are ordered by ``valid_from`` and each one's ``valid_until`` is the next one's start. Ordering by
   event time (not arrival) makes the result independent of delivery order: a late message with an older
   event time lands in the past, already superseded (``engram_workers.consolidation.timeline``, which also
   ends a late message's history where the newer fact that replaced it starts).
Ids are derived from (user, message, position), so re-planning the same message gives the same ids.
Store reads per message are fixed, whatever it names: one entity lookup (``resolution``), and one read
(``GraphStore.facts_and_slots``) of the facts it names or nearly restates (index hits, "updates" hints,
"ends") and of its single-valued slots. The message itself is kept recallable: its chunks
(``storage.graph.episodes.chunk_envelope``) are embedded in the same single batch as the names and
statements and go into the plan and the user's index; a chunk the extract stage already encoded (its
slim-context query, ``engram_workers.stages.handover``) is taken from the hand-over.

Model facts are mapped with these rules (docs/extraction.md):
- a fact whose subject or object resolves to nothing (an unknown id) is skipped;
- ``single_valued`` holds only for ``naming.SINGLE_VALUED`` predicates, after synonyms are folded in
  (RESIDES_IN -> LIVES_IN); the model's flag is ignored, so "LIKES jazz" cannot close every other LIKES;
- a model date later than the message's event time + ``DATE_SKEW`` is not trusted: the fact is dated at the
  event time, and a one-value fact dated ahead is a plan (``PLANS_<PREDICATE>``, episodic), not a change;
- ``ends`` closes the named current facts at the message's event time (kept when the slot is rebuilt);
- the statement is read before the triple is trusted (``_draft_facts``, ``engram_workers.consolidation.stance``): negations,
  past states and ``valid_until`` end facts, plans and other people's values change no slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from engram_api.models import (
    SELF_REF,
    ChunkRecord,
    Envelope,
    EpisodeRecord,
    Extraction,
    FactChange,
    FactRecord,
    Usage,
    WritePlan,
    utcnow,
)
from engram_api.naming import (
    SINGLE_VALUED,
    canonical_predicate,
    negated_predicate,
    normalize_name,
    sanitize_predicate,
    split_negation,
)
from engram_api.storage.faiss.files import Kind, UserIndex, VectorHit
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import EmbedContext, chunk_envelope, embedded_texts, episode_text, own_end
from engram_workers.consolidation.resolution import Resolver, Vectors, hashed_id, named_entities
from engram_workers.consolidation.stance import read_stance
from engram_workers.consolidation.timeline import late_ends, supersede_single

__all__ = ["Incoming", "Planned", "plan_message"]

FACT_DUPLICATE = 0.93
# How far past the message's event time a model's date may lie (time zones, "tonight"); beyond, it is a plan.
DATE_SKEW = timedelta(days=1)


@dataclass(frozen=True)
class Incoming:
    """One message as planning takes it, computed once (``of``) however often it is planned (a batch's
    replay, a re-plan after a refused write): the extraction with every unnamed person named
    (``named_entities``), the message's chunks, and every text planning it embeds (names, statements,
    chunks): one encoder batch's worth, encoded with the rest of its batch (``Vectors``)."""

    envelope: Envelope
    extraction: Extraction
    usage: Usage
    chunks: tuple[ChunkRecord, ...]
    embedded: tuple[str, ...]
    texts: tuple[str, ...]
    context: EmbedContext = "other_turn"  # what ``embedded`` adds to each chunk's words

    @classmethod
    def of(
        cls, envelope: Envelope, extraction: Extraction, usage: Usage, embed_context: EmbedContext = "other_turn"
    ) -> Incoming:
        named = named_entities(extraction)
        chunks = tuple(chunk_envelope(envelope))
        embedded = tuple(embedded_texts(envelope, list(chunks), embed_context))
        # A fact may name a thing instead of referring to a listed entity: that name gets an entity too.
        listed = {e.ref for e in named.entities} | {SELF_REF}
        refs = [r.strip()[:200] for f in named.facts for r in (f.subject, f.object or "") if r and r not in listed]
        statements = [" ".join(f.statement.split())[:1000] for f in named.facts]
        names = [e.name for e in named.entities]
        texts = (*names, *refs, *statements, "User", *embedded)
        return cls(envelope, named, usage, chunks, embedded, texts, embed_context)

    @property
    def ends(self) -> dict[str, int]:
        """The texts whose token states apply keeps (late interaction) and where their own words end: each
        chunk's embedded text (the turn it answers follows), each fact statement (all of it)."""
        statements = (" ".join(f.statement.split())[:1000] for f in self.extraction.facts)
        return {**{s: len(s) for s in statements}, **{t: own_end(t) for t in self.embedded}}


@dataclass
class Planned:
    plan: WritePlan
    upserts: list[tuple[str, Kind, Sequence[float]]] = field(default_factory=list)
    states: dict[str, bytes] = field(default_factory=dict)  # the upserted chunks' packed token states


@dataclass
class Drafts:
    """A message's fact drafts and what consolidation must do beside writing them.

    ``closes``: by draft id, the (subject, predicate, object) whose current facts the draft ends and when
    ("not allergic" ends "allergic", "used to live in Tampa" ends "lives in Tampa", "allergic" again ends
    "not allergic"). ``history``: past-state drafts that are only kept when they end nothing (the ended fact
    already is that history)."""

    facts: list[FactRecord] = field(default_factory=list)
    hints: dict[str, str] = field(default_factory=dict)
    closes: dict[str, tuple[str, str, str | None, datetime]] = field(default_factory=dict)
    history: set[str] = field(default_factory=set)


def _draft_facts(envelope: Envelope, extraction: Extraction, resolver: Resolver) -> Drafts:
    """Fact records for the extraction (deduplicated within the message, embedded), read against the model's
    own statement (``engram_workers.consolidation.stance``): a negation is stored as ``NOT_<P>`` and ends ``P``; a past
    state (said so, or with a ``valid_until`` up to the message) is history and ends the current fact; a
    plan or a one-value fact about someone else changes no slot."""
    uid, mid = envelope.user_id, envelope.message_id
    out = Drafts()
    seen: set[str] = set()
    at = envelope.timestamp
    # An end may lie after the message when it is known by now (a late message dated before a known fact that
    # replaced it); an end still ahead of the clock is only announced ("leaving Google next month"): ignored.
    latest_end = max(at + DATE_SKEW, utcnow())
    for pos, fact in enumerate(extraction.facts):
        subject_id = resolver.entity_for(fact.subject)
        object_id = resolver.entity_for(fact.object)
        statement = " ".join(fact.statement.split())[:1000]
        dangling = bool(fact.object and fact.object.strip()) and object_id is None
        if subject_id is None or dangling or normalize_name(statement) in seen:
            continue
        seen.add(normalize_name(statement))
        stance = read_stance(statement, resolver.names_of(object_id))
        predicate, negated = split_negation(canonical_predicate(fact.predicate))
        memory_type = fact.memory_type
        valid_from = fact.valid_from or at
        dated_ahead = valid_from > at + DATE_SKEW
        if dated_ahead:
            valid_from = at
        until = fact.valid_until if fact.valid_until is not None and fact.valid_until <= latest_end else None
        fid = hashed_id("fact_", uid, mid, str(pos))
        valid_until = None
        if negated or stance.negated:
            # "not P" is its own fact, and P is over from then on.
            out.closes[fid] = (subject_id, predicate, object_id, valid_from)
            predicate = negated_predicate(predicate)
        elif stance.past or until is not None:
            valid_until = until or at
            out.closes[fid] = (subject_id, predicate, object_id, valid_until)
            if fact.valid_from is None:
                # Undated history: no place in a slot's timeline, so never a slot member.
                valid_from = min(valid_from, valid_until)
                out.history.add(fid)
        else:
            # A positive fact ends its stored negation ("allergic after all").
            out.closes[fid] = (subject_id, negated_predicate(predicate), object_id, valid_from)
        single = predicate in SINGLE_VALUED and fid not in out.history  # the declared list decides
        if single and (dated_ahead or stance.hypothetical):
            # A plan or a maybe ("moving to Denver next month", "might move to Berlin") changes no state yet.
            predicate, single, memory_type = sanitize_predicate(f"PLANS_{predicate}"), False, "episodic"
            out.closes.pop(fid, None)
        elif single and stance.other_subject and subject_id == resolver.self_id:
            # "User's sister lives in Paris" under subject "user": true words, but not the user's slot.
            predicate, single = sanitize_predicate(f"RELATED_{predicate}"), False
            out.closes.pop(fid, None)
        draft = FactRecord(
            id=fid,
            user_id=uid,
            subject_id=subject_id,
            predicate=predicate,
            object_id=object_id,
            statement=statement,
            memory_type=memory_type,
            importance=fact.importance,
            single_valued=single,
            # created_at is when Engram learned it (decay counts from there): a backfill of old chats is
            # not "forgotten" on its first decay run.
            valid_from=valid_from,
            valid_until=valid_until,
        )
        out.facts.append(draft)
        if fact.updates:
            out.hints[draft.id] = fact.updates
    for draft in out.facts:
        draft.embedding = resolver.vectors(draft.statement).tolist()
        draft.token_states = resolver.vectors.states(draft.statement)
    return out


def _closings(
    drafts: Drafts, slotted: list[FactRecord], at: datetime
) -> tuple[list[tuple[FactRecord, datetime]], set[str]]:
    """The stored current facts the drafts end (fact, end), and the history drafts made redundant by it.
    Only facts that were current when the message was sent are ended (a late older message ends nothing
    that started after it); an end before the fact's start (the model's date contradicts the record) is
    the message time."""
    ended: dict[str, tuple[FactRecord, datetime]] = {}
    redundant: set[str] = set()
    for fid, (subject, predicate, obj, when) in drafts.closes.items():
        for fact in slotted:
            if (fact.subject_id, fact.predicate, fact.object_id) != (subject, predicate, obj) or fact.id == fid:
                continue
            if fact.valid_until is not None or not fact.current_at(at):  # open and valid then
                continue
            ended.setdefault(fact.id, (fact, when if when >= fact.valid_from else at))
            if fid in drafts.history:
                redundant.add(fid)
    return list(ended.values()), redundant


def _duplicate_hits(drafts: list[FactRecord], index: UserIndex) -> dict[str, list[VectorHit]]:
    """Each multi-valued draft's near-identical facts in the user's index (candidates for reinforcement)."""
    return {
        d.id: [
            h
            for h in index.search(np.asarray(d.embedding, dtype=np.float32), 3, kind="fact")
            if h.score >= FACT_DUPLICATE
        ]
        for d in drafts
    }


def _restates(known: FactRecord | None, draft: FactRecord) -> bool:
    """A current fact with the draft's subject, predicate and object: what reinforcement may merge. Wording
    similarity alone is not enough: "not allergic to peanuts" embeds within 0.98 of "allergic to peanuts"."""
    return (
        known is not None
        and known.valid_until is None
        and (known.subject_id, known.predicate, known.object_id) == (draft.subject_id, draft.predicate, draft.object_id)
    )


def _consolidate_multi(
    drafts: list[FactRecord],
    hints: dict[str, str],
    hits: dict[str, list[VectorHit]],
    known: dict[str, FactRecord],
    new_facts: list[FactRecord],
    reinforced: list[str],
    changes: list[FactChange],
) -> None:
    """Multi-valued facts: a near-identical current fact of the same subject, predicate and object is
    reinforced instead of duplicated; a fact the model says replaces a context fact supersedes it."""
    for draft in drafts:
        dup = next(
            (h.node_id for h in hits[draft.id] if draft.valid_until is None and _restates(known.get(h.node_id), draft)),
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


def _ended(ids: Sequence[str], at: datetime, known: dict[str, FactRecord]) -> list[tuple[FactRecord, datetime]]:
    """The facts ``ends`` names that were current when the message was sent (this user's only)."""
    facts = [known[i] for i in sorted(set(ids)) if i in known]
    return [(f, at) for f in facts if f.valid_until is None and f.current_at(at)]


def plan_message(message: Incoming, *, graph: GraphStore, index: UserIndex, vectors: Vectors) -> Planned:
    """The message's ``WritePlan`` against the graph and ``index`` as they are now; ``vectors``: its batch's
    texts, encoded (``Incoming.texts`` of each message)."""
    envelope, extraction = message.envelope, message.extraction
    uid, mid = envelope.user_id, envelope.message_id
    # Copies: the message's chunks are planned again, unchanged, after a replay or a re-plan.
    chunks = [
        c.model_copy(update={"embedding": vectors(t).tolist(), "token_states": vectors.states(t)})
        for c, t in zip(message.chunks, message.embedded, strict=True)
    ]
    resolver = Resolver(
        user_id=uid, message_id=mid, graph=graph, vectors=vectors, index=index, owner_name=envelope.owner_name
    )
    resolver.resolve(extraction)

    drafts = _draft_facts(envelope, extraction, resolver)
    hints = drafts.hints
    new_facts: list[FactRecord] = []
    reinforced: list[str] = []
    changes: list[FactChange] = []
    multi = [d for d in drafts.facts if not d.single_valued]
    single = [d for d in drafts.facts if d.single_valued]
    hits = _duplicate_hits(multi, index)
    # One read for every fact the message names or nearly restates (duplicate candidates, "updates" hints
    # and "ends"; only this user's facts come back), every fact of its one-value slots and of the slots its
    # drafts may end (negations, past states).
    wanted = {h.node_id for hs in hits.values() for h in hs} | set(hints.values())
    wanted |= {i for i in extraction.ends if i.startswith("fact_")}
    slots = {(f.subject_id, f.predicate) for f in single} | {(s, p) for s, p, _, _ in drafts.closes.values()}
    named, slotted = graph.facts_and_slots(uid, fact_ids=sorted(wanted), slots=sorted(slots))
    known = {f.id: f for f in named}
    late_ends(drafts.facts, drafts.closes, slotted, envelope.timestamp)
    closed, redundant = _closings(drafts, slotted, envelope.timestamp)
    multi = [d for d in multi if d.id not in redundant]
    ended = {f.id: (f, when) for f, when in _ended(extraction.ends, envelope.timestamp, known)}
    for fact, when in closed:
        ended.setdefault(fact.id, (fact, when))
    _consolidate_multi(multi, hints, hits, known, new_facts, reinforced, changes)
    supersede_single(single, slotted, {i: when for i, (_, when) in ended.items()}, new_facts, reinforced, changes)
    changed = {c.id for c in changes}
    changes += [
        FactChange(id=f.id, valid_until=when, superseded_by=None) for f, when in ended.values() if f.id not in changed
    ]
    first: dict[str, FactChange] = {}
    for change in changes:  # one change per fact: an explicit end and an "updates" may name the same one
        first.setdefault(change.id, change)

    episode = EpisodeRecord(
        id=mid,
        user_id=uid,
        content=episode_text(envelope),
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
        fact_changes=list(first.values()),
        reinforced_fact_ids=sorted(set(reinforced)),
        mentioned_entity_ids=sorted(mentioned),
        chunks=chunks,
        chunk_context=message.context,
        usage=message.usage,
    )
    upserts: list[tuple[str, Kind, Sequence[float]]] = [
        (f.id, "fact", f.embedding) for f in new_facts if f.embedding is not None
    ]
    for ent in new_entities:
        if ent.embedding is None:
            ent.embedding = vectors(ent.name).tolist()
        upserts.append((ent.id, "entity", ent.embedding))
    upserts.extend((c.id, "episode", c.embedding) for c in chunks if c.embedding is not None)
    states = {
        r.id: r.token_states for r in (*new_facts, *chunks) if r.embedding is not None and r.token_states is not None
    }
    return Planned(plan=plan, upserts=upserts, states=states)
