"""Entity resolution for one message's extraction: model refs and bare names -> entity ids of the user.

Always within the user's own graph, in this order: a context id the model gives, the exact normalized
name or alias, then embedding similarity (same label, ``ENTITY_MATCH`` or higher). Rules for model output
(docs/extraction.md):
- the self node ("user") is never rebound: an entity the model lists as "user", or named as the envelope's
  ``owner_name``, resolves to the self node and its names become aliases of it;
- an id-shaped ref (``ent_..``, ``fact_..``, a handle ``E3``) that is not a known id of this user never
  creates an entity (``entity_for`` answers None and the fact hanging on it is skipped).
Store round trips: ``resolve`` reads every entity the message may resolve to (the self node, context ids,
id-shaped and bare names in facts, the listed names and aliases, and the candidates the FAISS index gives
for each listed name) in ONE ``lookup_entities`` query; nothing after it reads the store, so the count
does not grow with the number of names or hits.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engram_api.models import SELF_REF, EntityChange, EntityRecord, Extraction
from engram_api.naming import SELF_WORDS, normalize_name, sanitize_label, self_entity_id, unnamed_relation
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.states import pack
from engram_api.storage.faiss.files import UserIndex, VectorHit
from engram_api.storage.graph.contract import GraphStore
from engram_workers.stages.handover import CarriedVectors

__all__ = ["ENTITY_MATCH", "Resolver", "Vectors", "hashed_id", "named_entities"]

ENTITY_MATCH = 0.90
_ID_SHAPED = re.compile(r"^(?:(?:ent|fact)_[0-9a-f]{4,}|[EF][0-9]{1,4})$", re.IGNORECASE)


def hashed_id(prefix: str, *parts: str) -> str:
    return prefix + hashlib.blake2b("\x1f".join(parts).encode(), digest_size=12).hexdigest()


def named_entities(extraction: Extraction) -> Extraction:
    """The extraction with every unnamed person named by the relation alone ("my sister", "User's older
    sister" -> "sister", the phrase kept as an alias), so "my sister" then "sister" is one entity (their
    vectors are only ~0.70 alike, below ``ENTITY_MATCH``). The same input gives the same output, so a
    re-planned message resolves as before; an extraction with nothing to rename is returned as is."""
    renamed = {i: unnamed_relation(e.name) for i, e in enumerate(extraction.entities)}
    if not any(renamed.values()):
        return extraction
    out = extraction.model_copy(deep=True)
    for i, name in renamed.items():
        if name:
            ent = out.entities[i]
            ent.aliases = list(dict.fromkeys([ent.name.strip(), *ent.aliases]))[:20]
            ent.name = name
    return out


class Vectors:
    """Every text a message (or an apply batch of messages) may need embedded, encoded in ONE batch (a model
    call has a fixed cost that dominated the apply stage when paid per name); anything unforeseen is encoded
    on demand. Texts the extract stage already encoded (``carried``, when its model is ours) are not encoded
    again. The chunks' texts (``ends``: each one and where its own words end) that reach the model get their
    token states from their vector's pass in the same batch (``states``, packed for the store); a chunk whose
    vector extract carried (its text the slim-context query's) gets none, so its cosine stands in for it
    in recall's second look (``reader.rerank``)."""

    def __init__(
        self,
        embedder: Embedder,
        user_id: str,
        texts: Sequence[str],
        carried: Sequence[CarriedVectors | None] = (),
        ends: Mapping[str, int] | None = None,
    ) -> None:
        self.embedder = embedder
        self.user_id = user_id  # whose texts these are: the encoder cache drops them when the user is erased
        unique = list(dict.fromkeys(t for t in texts if t))
        ends = ends or {}
        self._known: dict[str, np.ndarray] = {}
        self._states: dict[str, bytes] = {}
        for handed in carried:
            if handed is not None:
                self._known.update(handed.for_texts(embedder, unique))
        missing = [t for t in unique if t not in self._known]
        if missing:
            # Through the cache: "User" and the names a user keeps mentioning cost no model call.
            vectors, states = embedder.encode_cached_states(missing, ends, user_id=user_id)
            self._known.update(zip(missing, vectors, strict=True))
            self._states = {text: pack(held) for text, held in states.items()}

    def states(self, text: str) -> bytes | None:
        """The packed token states of a chunk's embedded text (``ends``), None for any other text."""
        return self._states.get(text)

    def __call__(self, text: str) -> np.ndarray:
        if text not in self._known:
            self._known[text] = self.embedder.encode_one(text, user_id=self.user_id)
        return self._known[text]


@dataclass
class Resolver:
    """Maps the extraction's entity refs (and bare names) to entity ids in the user's graph."""

    user_id: str
    message_id: str
    graph: GraphStore
    vectors: Vectors
    index: UserIndex
    owner_name: str | None = None
    by_ref: dict[str, str] = field(default_factory=dict)
    by_norm: dict[str, str] = field(default_factory=dict)
    new: dict[str, EntityRecord] = field(default_factory=dict)
    changes: dict[str, EntityChange] = field(default_factory=dict)
    mentioned: set[str] = field(default_factory=set)
    # What ``resolve`` read in its one query, and the index's candidates (at or above ENTITY_MATCH) by name.
    _fetched: dict[str, EntityRecord] = field(default_factory=dict, init=False, repr=False)
    _fetched_norms: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _hits: dict[str, list[VectorHit]] = field(default_factory=dict, init=False, repr=False)

    @property
    def self_id(self) -> str:
        return self_entity_id(self.user_id)

    def _existing_self(self) -> EntityRecord:
        sid = self.self_id
        self.by_ref[SELF_REF] = sid
        if sid in self._fetched:
            return self._fetched[sid]
        self.new[sid] = EntityRecord(
            id=sid,
            user_id=self.user_id,
            name="User",
            norm_name=normalize_name("User"),
            label="Person",
            summary="the person whose memory this is",
        )
        return self.new[sid]

    def _is_self(self, ref: str, names: Sequence[str]) -> bool:
        if ref.strip().lower() == SELF_REF or ref == self.self_id:
            return True
        owner = normalize_name(self.owner_name or "")
        return bool(owner) and any(normalize_name(n) == owner for n in names)

    def _alias_self(self, me: EntityRecord, names: Sequence[str]) -> None:
        """The owner's names the model gave become aliases of the self node; the node itself stays."""
        known = {normalize_name(n) for n in [me.name, *me.aliases]} | SELF_WORDS
        self._add_aliases(self.self_id, [n.strip()[:200] for n in names], known)

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

    def _prefetch(self, extraction: Extraction, wanted: set[str], context_ids: set[str]) -> None:
        """The one store read: every entity the message may resolve to, by id or by name."""
        listed = {e.ref for e in extraction.entities} | {SELF_REF}
        refs = {r.strip() for f in extraction.facts for r in (f.subject, f.object or "") if r and r not in listed}
        ids = {self.self_id, *context_ids, *(r for r in refs if _ID_SHAPED.match(r))}
        names = wanted | {normalize_name(r) for r in refs if not _ID_SHAPED.match(r)}
        for ent in extraction.entities:
            if normalize_name(ent.name) and not _ID_SHAPED.match(ent.name.strip()):
                hits = self.index.search(self.vectors(ent.name), 3, kind="entity")
                self._hits[ent.name] = list(itertools.takewhile(lambda h: h.score >= ENTITY_MATCH, hits))
                ids.update(h.node_id for h in self._hits[ent.name])
        found = self.graph.lookup_entities(self.user_id, entity_ids=sorted(ids), norm_names=sorted(names - {""}))
        for rec in found:  # query order (norm_name, id): the first entity of a name wins, as a name lookup
            self._fetched[rec.id] = rec
            for n in [rec.norm_name, *rec.aliases]:
                self._fetched_norms.setdefault(normalize_name(n), rec.id)

    def resolve(self, extraction: Extraction) -> None:
        wanted = {normalize_name(n) for e in extraction.entities for n in [e.name, *e.aliases]} - {""}
        context_ids = {e.ref for e in extraction.entities if e.ref.startswith("ent_")}
        self._prefetch(extraction, wanted, context_ids)
        me = self._existing_self()
        for n in [me.name, *me.aliases, self.owner_name or ""]:
            if normalize_name(n) and normalize_name(n) not in SELF_WORDS:
                self.by_norm[normalize_name(n)] = self.self_id
        if self.owner_name:
            self._alias_self(me, [self.owner_name])
        by_id = {
            rec.id: rec
            for rec in self._fetched.values()
            if rec.id in context_ids or {normalize_name(n) for n in [rec.norm_name, *rec.aliases]} & wanted
        }
        for rec in by_id.values():
            for n in [rec.name, *rec.aliases]:
                self.by_norm.setdefault(normalize_name(n), rec.id)

        unresolved = []
        for ent in extraction.entities:
            names = [ent.name, *ent.aliases]
            if self._is_self(ent.ref, names):
                self._alias_self(me, names)
                if ent.ref.strip().lower() != SELF_REF:
                    self.by_ref[ent.ref] = self.self_id
                continue
            norms = [normalize_name(n) for n in names if normalize_name(n)]
            if not norms or _ID_SHAPED.match(ent.name.strip()):
                continue
            target = ent.ref if ent.ref in by_id else next((self.by_norm[n] for n in norms if n in self.by_norm), None)
            if target is None:
                unresolved.append((ent, norms))
                continue
            self._link(ent.ref, target, names, by_id, ent.summary)

        if not unresolved:
            return
        for ent, norms in unresolved:
            vec = self.vectors(ent.name)
            # A name seen earlier in this same message resolves to that new entity.
            target = next((self.by_norm[n] for n in norms if n in self.by_norm), None)
            if target is None:
                label = sanitize_label(ent.label)
                for hit in self._hits.get(ent.name, []):
                    cand = self._fetched.get(hit.node_id)
                    if cand is not None and cand.label == label:
                        target = cand.id
                        by_id[target] = cand
                        break
            if target is None:
                target = hashed_id("ent_", self.user_id, self.message_id, ent.ref, norms[0])
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
            self._link(ent.ref, target, [ent.name, *ent.aliases], by_id, ent.summary)

    def _link(
        self, ref: str, target: str, names: Sequence[str], by_id: dict[str, EntityRecord], summary: str = ""
    ) -> None:
        self.by_ref[ref] = target
        if target in by_id:
            rec = by_id[target]
            self.mentioned.add(target)
            self._add_aliases(target, names, {normalize_name(n) for n in [rec.name, *rec.aliases]})
            if summary.strip() and summary.strip() != rec.summary:
                # What the model now says the entity is ("Ana's sister, a nurse in Porto") replaces the old line.
                self.changes.setdefault(target, EntityChange(id=target)).summary = summary.strip()
        elif target in self.new:
            rec = self.new[target]
            self._add_aliases(target, names, {normalize_name(n) for n in [rec.name, *rec.aliases]})

    def names_of(self, entity_id: str | None) -> list[str]:
        """The name and aliases of an entity this message resolved to (none for an unknown id)."""
        rec = self.new.get(entity_id or "") or self._fetched.get(entity_id or "")
        return [] if rec is None else [rec.name, *rec.aliases]

    def entity_for(self, ref: str | None) -> str | None:
        """A fact may name a thing the model did not list as an entity: create it on the fly."""
        if ref is None or not ref.strip():
            return None
        if ref in self.by_ref:
            return self.by_ref[ref]
        if ref.strip().lower() == SELF_REF:
            return self.self_id
        if _ID_SHAPED.match(ref.strip()):
            # A context id the model did not list: fine if it is one of this user's; never a new "Thing".
            known = self._fetched.get(ref.strip())
            if known is not None:
                self.by_ref[ref] = known.id
                self.mentioned.add(known.id)
                return known.id
            return None
        norm = normalize_name(ref)
        if not norm:
            return None
        if norm in self.by_norm:
            return self.by_norm[norm]
        if norm in self._fetched_norms:
            self.by_norm[norm] = self._fetched_norms[norm]
            self.mentioned.add(self.by_norm[norm])
            return self.by_norm[norm]
        eid = hashed_id("ent_", self.user_id, self.message_id, "name", norm)
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
