"""One recall's state (``RecallRun``) and time window (``TimeWindow``): what the fusion steps
(``reader.fusion``) share.

Invariants:
- a record is read at most once a recall (``load_facts``, ``load_chunks`` skip what is held), and
  through the per-user caches or the held snapshot (``reader.facts``);
- ``ok`` is the recall's time window (``TimeWindow``) applied to a read record: an id never read is not
  ok, so a record forgotten while the recall ran is never ranked. A fact must hold at ``as_of`` (be current
  when None) and its validity overlap [since, until) (``storage.graph.validity``); an episode chunk's event
  time must be at or before ``as_of`` and in [since, until); a window with no bound checks nothing;
- a candidate is made once per id (``candidate``), of the kind of the record read under that id.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np

from engram_api.models import KeywordHit, utcnow
from engram_api.reader.cues import QueryCues
from engram_api.reader.facts import UserChunks, UserFacts
from engram_api.reader.items import Candidate
from engram_api.reader.recipe import RecallRecipe
from engram_api.settings import Settings
from engram_api.storage.faiss.files import Kind, UserIndex, VectorHit
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.validity import instant, overlaps, valid_at
from engram_api.storage.snapshot.keywords import TextTerms
from engram_api.storage.snapshot.rows import AnyChunk, AnyFact

__all__ = ["RecallRun", "TimeWindow"]


@dataclass(frozen=True, slots=True)
class TimeWindow:
    as_of: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def filtering(self) -> bool:
        return self.as_of is not None or self.since is not None or self.until is not None

    def chunk_ok(self, chunk: AnyChunk) -> bool:
        t = chunk.event_time
        return (
            (self.as_of is None or t <= self.as_of)
            and (self.since is None or t >= self.since)
            and (self.until is None or t < self.until)
        )

    def fact_ok(self, fact: AnyFact, at: datetime | None = None) -> bool:
        """``at``: the window's instant when known (``as_of``, else the recall's one reading of the clock),
        else read here. ``fact.current_at`` inlined (the method imports ``validity`` at every call) and
        ``overlaps`` skipped for an open window: a recall asks this of ~100-200 candidates and hits."""
        if not valid_at(fact.valid_from, fact.valid_until, fact.archived, instant(self.as_of) if at is None else at):
            return False
        return (self.since is None and self.until is None) or overlaps(
            fact.valid_from, fact.valid_until, self.since, self.until
        )


@dataclass
class RecallRun:
    """One recall's state: its inputs, the records it read, each candidate's similarity and hops, the
    candidates and the time spent by part; ``reader.fusion`` fills it."""

    graph: GraphStore
    user_facts: UserFacts
    user_chunks: UserChunks
    settings: Settings
    index: UserIndex
    qvec: np.ndarray
    user_id: str
    recipe: RecallRecipe
    window: TimeWindow
    graph_expansion: bool
    keyword: Future[list[KeywordHit]] | None
    cues: QueryCues
    terms: TextTerms  # the user's memo of texts' terms and dates (``reader.terms``)
    qstems: frozenset[str] = frozenset()
    qstates: np.ndarray | None = None  # the query's token states (late interaction; ``reader.rerank``)
    now: datetime = field(default_factory=utcnow)  # the recall's one reading of the clock
    at: datetime = field(init=False)  # the window's instant: ``as_of``, else ``now``
    facts: dict[str, AnyFact] = field(default_factory=dict)  # models, or a held snapshot's views of them
    chunks: dict[str, AnyChunk] = field(default_factory=dict)
    sims: dict[str, float] = field(default_factory=dict)
    hops: dict[str, int] = field(default_factory=dict)
    cands: dict[str, Candidate] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # ms per part (``RecallResult.timings_ms``)

    def __post_init__(self) -> None:
        self.at = instant(self.window.as_of, self.now)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[part] = self.timings.get(part, 0.0) + (time.perf_counter() - start) * 1e3

    def search(self, k: int, kind: Kind) -> list[VectorHit]:
        with self.timed("faiss"):
            return self.index.search(self.qvec, k, kind=kind)

    def load_facts(self, ids: Iterable[str]) -> None:
        missing = [i for i in dict.fromkeys(ids) if i not in self.facts]
        if missing:
            with self.timed("records"):
                self.facts.update(self.user_facts.load(missing))

    def load_chunks(self, ids: Iterable[str]) -> None:
        missing = [i for i in dict.fromkeys(ids) if i not in self.chunks]
        if missing:
            with self.timed("records"):
                self.chunks.update(self.user_chunks.load(missing))

    def ok(self, node_id: str) -> bool:
        fact = self.facts.get(node_id)
        if fact is not None:
            return self.window.fact_ok(fact, self.at)
        chunk = self.chunks.get(node_id)
        return chunk is not None and self.window.chunk_ok(chunk)

    def episode_hits(self, k: int) -> list[str]:
        """The top ``k`` episode chunks inside the time window (widening the search until found). Without
        a window nothing needs checking, so the chunks are loaded later with the keyword hits."""
        total = self.index.count("episode")
        if not self.window.filtering:
            hits = self.search(k, "episode")
            self.sims.update((h.node_id, h.score) for h in hits)
            return [h.node_id for h in hits]
        n = 4 * k
        while True:
            hits = self.search(min(n, total), "episode")
            self.sims.update((h.node_id, h.score) for h in hits)
            self.load_chunks(h.node_id for h in hits)
            kept = [h.node_id for h in hits if self.ok(h.node_id)]
            if len(kept) >= k or n >= total:
                return kept[:k]
            n *= 4

    def candidate(self, node_id: str) -> Candidate:
        """The candidate of a fact or chunk read in this recall, made on first mention."""
        cand = self.cands.get(node_id)
        if cand is None:
            kind: Literal["fact", "episode"] = "fact" if node_id in self.facts else "episode"
            cand = Candidate(kind=kind, fact=self.facts.get(node_id), chunk=self.chunks.get(node_id))
            self.cands[node_id] = cand
        return cand
