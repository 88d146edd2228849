"""A small user's whole graph in memory at one stamp, and recall's graph step and keyword search answered
from it.

``GraphStore.snapshot`` reads every fact and episode chunk of one user, the stamp read first, in one read
transaction. ``UserSnapshot.graph_step`` is a third implementation of ``GraphStore.graph_step`` over those
records, pinned to both stores' answers by the contract suite (tests/contract/test_graph_step.py). Why a
third: on Neo4j the step is a round trip that cost ~5 ms of a 700-turn user's ~21 ms recall (graph 4.9 ms
p50, docs/benchmarks/history.md), where the walk over a few hundred facts in Python takes a fraction of a
millisecond. Users above a size bound are not snapshotted: their step stays in the store. The keyword search is
answered from an in-memory BM25 index of the same records (``keywords``), so a snapshotted user's recall
makes no store call at all.

Invariants (those of the stores' step, which its docstring states in full):
- a fact mentions its subject and its object (Neo4j's SUBJECT/OBJECT edges, SQLite's mentions rows);
- the walk passes only facts valid at the query's instant (``GraphStepQuery.at``: ``as_of``, else ``now``;
  ``validity``); a seed fact must also overlap [since, until);
- each seed keeps its ``per_seed`` nearest facts by (hops, importance descending, id descending); a fact's hops is
  its minimum over the seeds that kept it; the walk from a seed stops at the first depth by which it has
  ``per_seed`` facts (deeper ones could not be kept), and never enters an entity in ``avoid``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from engram_api.models import ChunkRecord, FactRecord, KeywordHit
from engram_api.storage.graph import validity
from engram_api.storage.graph.step import GraphStepQuery
from engram_api.storage.graph.validity import instant, overlaps
from engram_api.storage.snapshot.keywords import KeywordIndex, TextTerms
from engram_api.storage.snapshot.overlay import Overlay, merge_due
from engram_api.storage.snapshot.removal import without, without_holes
from engram_api.storage.snapshot.rows import (
    ARCHIVED,
    CHUNK_FACTS,
    CHUNK_ROWS,
    EPISODE,
    EVENT_TIME,
    FACT_ROWS,
    IMPORTANCE,
    OBJECT,
    STATEMENT,
    SUBJECT,
    VALID_FROM,
    VALID_UNTIL,
    ChunkView,
    FactView,
    RecordRows,
    Row,
    conversation_order,
    valid_at,
)
from engram_api.versions import Stamp

if TYPE_CHECKING:
    from engram_api.storage.faiss.sync import UserChanges

__all__ = ["HeldStep", "UserSnapshot"]


@dataclass(frozen=True, slots=True)
class HeldStep:
    """``GraphStep``'s answer from a held snapshot: the same fields, the records as held (views, never
    models: ``record_rows`` says why)."""

    facts: list[FactView] = field(default_factory=list)
    hops: list[tuple[str, int]] = field(default_factory=list)
    chunks: list[ChunkView] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class UserSnapshot:
    """Every fact (any state) and every episode chunk of ``user_id``, read at ``stamp``: a base and what
    was written since it (``recent`` and the records' and keyword index's own recent parts, ``overlay``),
    read together; ``merged`` folds them into one base that answers every read the same."""

    user_id: str
    stamp: Stamp
    facts: RecordRows[FactRecord, FactView]  # held as rows (``record_rows``), not as models: a fifth of the memory
    chunks: RecordRows[ChunkRecord, ChunkView]
    touching: Mapping[str, tuple[str, ...]]  # the base's: entity id -> the facts mentioning it, in rank order
    episodes: Mapping[str, tuple[str, ...]]  # the base's: episode id -> its chunks, in conversation order
    keywords: KeywordIndex  # the chunks' indexed text and the facts' statements
    recent: Overlay = field(default_factory=Overlay)  # what was written since the base (``overlay``)
    # The terms of the texts recall scored (``TextTerms``): carried while records are only added, begun anew
    # by a removal (``removal.without``), so a forgotten text's terms go with the snapshot that held it.
    terms: TextTerms = field(default_factory=TextTerms, compare=False, repr=False)

    @classmethod
    def of(cls, user_id: str, stamp: Stamp, facts: Iterable[FactRecord], chunks: Iterable[ChunkRecord]) -> UserSnapshot:
        """The snapshot of these records; each is made a row as it comes (``GraphStore.snapshot`` reads them
        lazily, facts first), so the models are never all held at once."""
        fact_rows = RecordRows.of(FACT_ROWS, facts)
        chunk_texts: dict[str, str] = {}

        def texts(records: Iterable[ChunkRecord]) -> Iterator[ChunkRecord]:
            for c in records:
                chunk_texts[c.id] = c.indexed_text
                yield c

        chunk_rows = RecordRows.of(CHUNK_ROWS, texts(chunks))
        rows, held = fact_rows.rows(), chunk_rows.rows()
        touching: dict[str, list[str]] = {}
        # Each entity's facts in the stores' rank order (importance descending, id descending): a walk reads
        # an entity's facts only as far as it still needs, as the stores read their rank indexes.
        for fid in sorted(rows, key=lambda i: (rows[i][IMPORTANCE], i), reverse=True):
            for entity in dict.fromkeys((rows[fid][SUBJECT], rows[fid][OBJECT])):
                if entity:
                    touching.setdefault(entity, []).append(fid)
        episodes: dict[str, list[str]] = {}
        for cid in sorted(held, key=lambda i: conversation_order(held[i])):
            episodes.setdefault(held[cid][EPISODE], []).append(cid)
        return cls(
            user_id=user_id,
            stamp=stamp,
            facts=fact_rows,
            chunks=chunk_rows,
            touching={e: tuple(ids) for e, ids in touching.items()},
            episodes={e: tuple(ids) for e, ids in episodes.items()},
            keywords=KeywordIndex.of(chunk_texts.items(), ((i, row[STATEMENT]) for i, row in rows.items())),
        )

    def updated(self, stamp: Stamp, facts: Iterable[FactRecord], chunks: Iterable[ChunkRecord]) -> UserSnapshot:
        """This snapshot at ``stamp``: its records, those of ``facts`` and ``chunks`` (written since) in
        their place (``GraphStore.refresh_snapshot``, which knows nothing was removed), kept in the overlay
        (``overlay``): only what they touch is copied, so a refresh costs what changed, not the user's size."""
        fresh = {f.id: f for f in facts}
        held = self.facts.rows()
        by_id = self.facts.with_records(fresh.values())
        new_chunks = {c.id: c for c in chunks}
        all_chunks = self.chunks.with_records(new_chunks.values())
        chunk_rows = all_chunks.rows()
        moved = {i for i, f in fresh.items() if i not in held or held[i][IMPORTANCE] != f.importance}
        reached: dict[str, list[str]] = {}
        for f in fresh.values():
            for entity in dict.fromkeys((f.subject_id, f.object_id)):
                if entity and f.id in moved:
                    reached.setdefault(entity, []).append(f.id)
        joined: dict[str, list[str]] = {}
        for c in new_chunks.values():
            joined.setdefault(c.episode_id, []).append(c.id)
        episodes = dict(self.recent.episodes)
        for episode, ids in joined.items():
            merged = dict.fromkeys([*self.episode_chunk_ids(episode), *ids])
            episodes[episode] = tuple(sorted(merged, key=lambda i: conversation_order(chunk_rows[i])))
        keywords = self.keywords.added(
            ((c.id, c.indexed_text) for i, c in new_chunks.items() if i not in self.chunks),
            ((f.id, f.statement) for i, f in fresh.items() if i not in held),  # a statement never changes
        )
        recent = Overlay(touching=self.recent.with_facts(reached, self.facts.base, by_id.rows()), episodes=episodes)
        return UserSnapshot(
            user_id=self.user_id, stamp=stamp, facts=by_id, chunks=all_chunks, touching=self.touching,
            episodes=self.episodes, keywords=keywords, recent=recent, terms=self.terms,
        )  # fmt: skip

    def merged(self) -> UserSnapshot:
        """The same snapshot with its overlay folded into a new base (a copy of the user's records, off any
        recall's path: ``overlay``), the keyword tables' holes dropped (``removal.without_holes``); itself
        when it has none."""
        if not self.recent_size:
            return self
        facts = self.facts.merged()
        return UserSnapshot(
            user_id=self.user_id, stamp=self.stamp, facts=facts, chunks=self.chunks.merged(),
            touching=self.recent.merged_touching(self.touching, facts.rows()),
            episodes=self.recent.merged_episodes(self.episodes), keywords=without_holes(self.keywords.merged()),
            terms=self.terms,
        )  # fmt: skip

    @property
    def recent_size(self) -> int:
        """The records held in the overlay (new ones, new versions of the base's, the base's removed) and the
        documents removed from the recent keyword tables (a hole each, which no row counts): what the fold
        takes in."""
        rows = len(self.facts.recent) + len(self.chunks.recent) + len(self.facts.gone) + len(self.chunks.gone)
        return rows + self.keywords.recent_holes

    @property
    def merge_due(self) -> bool:
        """True when the overlay holds its share of the user's records (``overlay.merge_due``)."""
        return merge_due(self.recent_size, self.size)

    @property
    def fold_due(self) -> bool:
        """True when the overlay is to be folded into a new base: at its share (``merge_due``), or at once
        while it hides a removed record (a base row in ``gone``, a keyword document's hole with its
        postings), whose text stays in memory until the fold: a removal is a forget of a fact or a message,
        or decay's expired chunks, and the catch-up cannot tell them apart (a removal record is an id)."""
        return self.merge_due or bool(self.facts.gone or self.chunks.gone or self.keywords.holes)

    def refreshed(
        self,
        stamp: Stamp,
        removed: int,
        facts: Iterable[FactRecord],
        chunks: Iterable[ChunkRecord],
        *,
        max_records: int,
        size: int | None = None,
        gone: Collection[str] | None = None,
    ) -> UserSnapshot | None:
        """This snapshot at ``stamp`` given the facts and chunks marked after its stamp, the version of the
        user's last removal (read with ``stamp`` first) and, when known, the ids removed since its stamp
        (``gone``, ``removal.without``); itself when nothing changed. None when only a whole load can do it:
        another lifetime, a graph behind it, a record removed since with ``gone`` unknown, more than
        ``max_records``, or a ``size`` (the user's count of facts and chunks, when read) that disagrees with
        the merge (a writer that marked nothing: an older release's)."""
        if stamp == self.stamp:
            return self
        if stamp.epoch != self.stamp.epoch or stamp < self.stamp:
            return None
        kept = self
        if removed > self.stamp.version:
            if gone is None:
                return None
            kept = without(self, gone)
        if size is not None and size > max_records:
            return None  # before the merge: a user grown past the bound costs no merge
        fresh = kept.updated(stamp, facts, chunks)
        if fresh.size > max_records or (size is not None and fresh.size != size):
            return None
        return fresh

    def caught_up(self, changes: UserChanges, *, max_records: int) -> UserSnapshot | None:
        """``refreshed`` by ``GraphStore.user_changes`` or the change feed (read with a FAISS copy's
        catch-up), the ids removed since taken out (``changes.vectors.removed``: the removal records of
        every write after the read's version, complete with the rest): no count was read, so the records
        are known complete since this snapshot's stamp only when every write since marked what it wrote,
        which the vectors' horizon says (``VectorChanges.usable_from``)."""
        if not changes.vectors.usable_from(self.stamp):
            return None
        return self.refreshed(
            changes.vectors.stamp, changes.removed, changes.facts, changes.chunks, max_records=max_records,
            gone=changes.vectors.removed,
        )  # fmt: skip

    def entity_facts(self, entity: str) -> Iterable[str]:
        """The facts mentioning ``entity`` in the stores' rank order (importance descending, id descending),
        the overlay's among the base's (read lazily: a walk reads only as far as it needs)."""
        return self.recent.entity_facts(entity, self.touching, self.facts.rows())

    def episode_chunk_ids(self, episode: str) -> tuple[str, ...]:
        """The episode's chunks, in conversation order."""
        return self.recent.episode_chunks(episode, self.episodes)

    @property
    def size(self) -> int:
        return len(self.facts) + len(self.chunks)

    def episode_chunks(self, episode_ids: Sequence[str]) -> list[ChunkView]:
        """Every chunk of the user's episodes among ``episode_ids``, in conversation order."""
        rows, view = self.chunks.rows(), self.chunks.shape.viewed
        held = [c for e in dict.fromkeys(episode_ids) for c in self.episode_chunk_ids(e)]
        return [view(rows[c]) for c in sorted(held, key=lambda c: conversation_order(rows[c]))]

    def keyword_search(
        self,
        terms: Sequence[str],
        k: int,
        *,
        as_of: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[KeywordHit]:
        """``GraphStore.keyword_search`` for this user at ``stamp``, with no store call: at most ``k`` chunks
        (event time <= as_of, >= since, < until) and ``k`` facts (valid at ``as_of``, current when None, not
        archived) holding any of ``terms``, best first (``keywords`` says how they are scored)."""

        chunks = self.chunks.rows()

        def chunk_ok(chunk_id: str) -> bool:
            t = chunks[chunk_id][EVENT_TIME]
            return (as_of is None or t <= as_of) and (since is None or t >= since) and (until is None or t < until)

        rows = self.facts.rows()
        at = instant(as_of)

        def fact_ok(fact_id: str) -> bool:
            return valid_at(rows[fact_id], at)

        return self.keywords.search(list(dict.fromkeys(terms)), k, chunk_ok=chunk_ok, fact_ok=fact_ok)

    def graph_step(self, query: GraphStepQuery) -> HeldStep:
        """``GraphStore.graph_step`` for this user at ``stamp``, with no store call."""
        chunks = self.chunks.rows()
        sourced, chunk_seeds = query.chunk_facts_of(lambda cid: chunks[cid][CHUNK_FACTS] if cid in chunks else None)
        hops = self._expand(query, [*query.seed_facts, *chunk_seeds]) if query.expanding else []
        known = set(query.known)
        wanted = dict.fromkeys([*query.fact_ids, *sourced, *chunk_seeds, *(fid for fid, _ in hops)])
        return HeldStep(
            facts=list(self.facts.views(i for i in wanted if i not in known).values()),
            hops=hops,
            chunks=list(self.chunks.views(dict.fromkeys(query.chunk_ids)).values()),
        )

    def _expand(self, q: GraphStepQuery, seed_facts: list[str]) -> list[tuple[str, int]]:
        rows, at = self.facts.rows(), q.at
        recent, base = self.facts.recent, self.facts.base

        def seeding(f: Row) -> bool:
            return valid_at(f, at) and overlaps(f[VALID_FROM], f[VALID_UNTIL], q.since, q.until)

        avoid = set(q.avoid)
        from_facts = [
            x
            for fid in seed_facts
            if fid in rows and seeding(rows[fid])
            for x in (rows[fid][SUBJECT], rows[fid][OBJECT])
        ]
        seeds = [s for s in dict.fromkeys([*q.seeds, *from_facts]) if s and s not in avoid]
        # Each fact's validity at ``at`` is judged once a step (``validity.valid_at`` itself: ``at`` is
        # already an instant), and a kept fact's importance is noted as it is read: the orders below read it.
        valid: dict[str, bool] = {}
        importance: dict[str, float] = {}
        best: dict[str, int] = {}
        for seed in seeds:
            level: dict[str, int] = {}
            seen, frontier = {seed}, [seed]
            for depth in range(q.max_hops + 1):
                read: list[Row] = []  # the valid facts read at this depth, in order: the next depth's entities
                # An entity that yields ``need`` new facts at this depth ends the walk (the level is full),
                # and the depth's best ``need`` are among each entity's first ``need``: read no further.
                need = q.per_seed - len(level)
                for entity in frontier:
                    new = 0
                    for fid in self.entity_facts(entity):
                        if new == need:
                            break
                        fact = recent.get(fid) or base[fid]  # two dicts' lookups (C), not a Mapping's
                        ok = valid.get(fid)
                        if ok is None:
                            ok = valid[fid] = validity.valid_at(fact[VALID_FROM], fact[VALID_UNTIL], fact[ARCHIVED], at)
                        if not ok:
                            continue
                        if fid not in level:
                            level[fid] = depth
                            importance[fid] = fact[IMPORTANCE]
                            new += 1
                        read.append(fact)
                if len(level) >= q.per_seed or depth == q.max_hops:
                    break
                # Only a walk going deeper needs the entities its facts reach (most fill their level at once).
                frontier = []
                for fact in read:
                    for x in (fact[SUBJECT], fact[OBJECT]):
                        if x and x not in avoid and x not in seen:
                            seen.add(x)
                            frontier.append(x)
                if not frontier:
                    break
            # (hops, importance descending, id descending), the order the stores read a seed's facts in: one
            # sort, descending by (-hops, importance, id) (ids are distinct: no tie is left to stability)
            nearest = sorted(level, key=lambda fid: (-level[fid], importance[fid], fid), reverse=True)
            for fid in nearest[: q.per_seed]:
                hops, held = level[fid], best.get(fid)
                if held is None or hops < held:
                    best[fid] = hops
        ranked = sorted(best.items(), key=lambda kv: (kv[1], -importance[kv[0]], kv[0]))
        return ranked[: q.limit]
