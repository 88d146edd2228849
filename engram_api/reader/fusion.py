"""One recall: ask the recipe's channels, fuse their rankings, bring linked items, score, cut to k.

Invariants:
- every candidate passes the time window before it is ranked: a fact must hold at ``as_of`` (be current
  when None) and its validity must overlap [since, until); an episode chunk's event time must be at or
  before ``as_of`` and in [since, until). Vector hits are filtered on a widening top-k, so a filter never
  starves a channel; keyword search filters inside the store's query;
- a linked item (a fact's source episode, an episode's extracted facts, a neighbouring turn) obeys the
  same window and only adds a share of its parent's fusion score, never more than the parent has;
- the query's cues (``reader.cues``: the speaker it names, whether it asks when, the period it names) only
  add to a turn's fusion score, each a fixed amount of the recipe; a name the query gives counts through
  the speaker cue, not in a turn's keyword share;
- zero LLM calls, and at most a fixed number of store round trips whatever the user's size (none for a
  user whose snapshot the reader holds): the keyword search (started by the caller before it embedded the
  query), the graph step (hydrate the fact hits
  and the chunk hits the cache lacks, expand from the seeds), and the linked items' chunk reads; fact
  records, chunks and each message's chunk list come from the per-user caches when the user's stamp has
  not moved (``reader.facts``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from engram_api.models import Channel as ChannelName
from engram_api.models import KeywordHit, RecallItem
from engram_api.naming import self_entity_id
from engram_api.reader.cues import QueryCues
from engram_api.reader.facts import UserChunks, UserFacts
from engram_api.reader.items import result_items
from engram_api.reader.recipe import RecallRecipe, RetrievalChannel
from engram_api.reader.rerank import similarity_step
from engram_api.reader.scoring import Scoring, Weights, by_rank, normalized, word_share
from engram_api.reader.sessions import NO_SESSIONS, SessionShares
from engram_api.reader.state import RecallRun, TimeWindow
from engram_api.settings import Settings
from engram_api.storage.embedding.states import maxsims
from engram_api.storage.faiss.files import UserIndex, VectorHit
from engram_api.storage.graph.contract import GraphStepQuery, GraphStore
from engram_api.storage.graph.episodes import keyword_terms
from engram_api.storage.graph.validity import valid_at
from engram_api.storage.snapshot.keywords import TextTerms, stems
from engram_api.storage.snapshot.rows import AnyChunk

__all__ = ["TimeWindow", "keyword_hits", "query_stems", "recall_items"]

_SEED_MIN_SIM = 0.25
_SEED_CHUNKS = 5  # the top episode hits whose extracted facts seed the expansion


@dataclass
class _Run(RecallRun):
    """A recall's steps over its state: ask the channels, bring the top hits' linked items, score."""

    sessions: SessionShares = NO_SESSIONS  # each session's share of the query (``reader.sessions``)

    # ---------------------------------------------------------------------------------- channels
    def _rank(self, channel: RetrievalChannel, ids: Sequence[str], scores: dict[str, float]) -> None:
        """Add the channel's share to each of its hits: ``weight / (rrf_k + rank + 1)`` by rank, or with
        ``fusion_mode`` "score" ``weight`` times the hit's score over the channel's best (``normalized``);
        for the keyword channel, whose ``scores`` are each hit's share of the query's words, that share
        times its rank's (``by_rank``)."""
        weight, k = self.recipe.weights.get(channel, 1.0), self.recipe.k.get(channel, 0)
        if self.recipe.fusion_mode == "rank":
            shares = [1.0 / (self.recipe.rrf_k + rank + 1) for rank in range(len(ids))]
        elif channel == "keyword":
            # By rank and by the share of the query's words a hit holds: both the same whichever index
            # answers, where the BM25 scores are not (``scoring.by_rank``).
            shares = [share * scores[i] for share, i in zip(by_rank(len(ids), k), ids, strict=True)]
        else:
            shares = normalized([scores[i] for i in ids], cut=len(ids) >= k)
        cands = self.cands
        for node_id, share in zip(ids, shares, strict=True):
            (cands.get(node_id) or self.candidate(node_id)).add(channel, weight * share)

    def _coverage(self, node_id: str, turn_stems: frozenset[str]) -> float:
        """The share of the query's keyword stems the hit's indexed text holds (1 with no stems); a turn's
        share is of ``turn_stems``."""
        if node_id in self.facts:
            return word_share(self.qstems, self.facts[node_id].statement, self.terms)
        return word_share(turn_stems, self.chunks[node_id].indexed_text, self.terms)

    def _turn_stems(self, keyword: list[KeywordHit]) -> frozenset[str]:
        """The query's stems a turn's words are scored on: without the names of the keyword hits' speakers
        the query names. A name the query gives is matched by who said a turn (the speaker cue), not by its
        words: "Hey Melanie!" is not about Melanie, yet its indexed text holds her name, as every turn of
        hers does ("Melanie: ..."). All of them when nothing else is left. The hits are the same documents
        for a held snapshot and the store (the contract suite), so both readers score the same shares."""
        named = {
            c.speaker for h in keyword if (c := self.chunks.get(h.node_id)) is not None and self.cues.names(c.speaker)
        }
        rest = self.qstems - frozenset(stems(" ".join(sorted(named))))
        return rest or self.qstems

    def channels(self) -> None:
        recipe, k = self.recipe, self.recipe.k
        fact_hits: list[VectorHit] = []
        if recipe.uses("fact_vector") or recipe.uses("graph"):
            fact_hits = self.search(k.get("fact_vector", 30), "fact")
            self.sims.update((h.node_id, h.score) for h in fact_hits)
        episode_ids = self.episode_hits(k.get("episode_vector", 40)) if recipe.uses("episode_vector") else []
        with self.timed("keyword"):  # what is left of it once the query is embedded
            keyword = self.keyword.result() if self.keyword is not None else []
        # The chunks the cache holds serve as they are; the rest, and the facts extracted from the top ones,
        # come in the graph step's round trip.
        keyword_chunks = [h.node_id for h in keyword if h.kind == "episode"]
        self.chunks.update(self.user_chunks.held([*episode_ids, *keyword_chunks]))
        top_chunks = [
            *episode_ids[: recipe.links_from],
            *(h.node_id for h in keyword[: recipe.links_from] if h.kind == "episode"),
        ]
        expanding = recipe.uses("graph") and self.graph_expansion and self.settings.max_hops >= 0
        self._graph_step(
            [
                *(h.node_id for h in fact_hits),
                *(h.node_id for h in keyword if h.kind == "fact"),
                *(f for cid in top_chunks if cid in self.chunks for f in self.chunks[cid].fact_ids),
            ],
            fact_hits if expanding else None,
            episode_ids,
            chunk_ids=[cid for cid in dict.fromkeys([*episode_ids, *keyword_chunks]) if cid not in self.chunks],
            chunk_facts=[cid for cid in dict.fromkeys(top_chunks) if cid not in self.chunks],
        )
        if recipe.uses("fact_vector"):
            self._rank("fact_vector", [h.node_id for h in fact_hits if self.ok(h.node_id)], self.sims)
        # The index is the one of the stamp read first; a forget committed since removes chunks it still holds.
        self._rank("episode_vector", [cid for cid in episode_ids if self.ok(cid)], self.sims)
        turn_stems = self._turn_stems(keyword)
        for table in ("episode", "fact"):  # each table's own ranking (the stores' and the snapshot's)
            ids = [h.node_id for h in keyword if h.kind == table and self.ok(h.node_id)]
            self._rank("keyword", ids, {i: self._coverage(i, turn_stems) for i in ids})
            if table == "episode" and self.recipe.session_boost:
                self.sessions = SessionShares.of((self.chunks[i] for i in ids), turn_stems, self.terms)
        if expanding:
            # A fact reached but not read back was forgotten while the step ran (Neo4j reads at read committed).
            facts, at = self.facts, self.at
            reached = [fid for fid in self.hops if fid in facts and self.window.fact_ok(facts[fid], at)]
            decay = self.settings.hop_decay
            self._rank("graph", reached, {fid: decay ** self.hops[fid] for fid in reached})

    def _graph_step(
        self,
        fact_ids: list[str],
        fact_hits: list[VectorHit] | None,
        episode_ids: list[str],
        *,
        chunk_ids: list[str],
        chunk_facts: list[str],
    ) -> None:
        """Hydrate ``fact_ids`` and ``chunk_ids`` (with the facts of ``chunk_facts``) and, given the fact
        hits, expand from the seeds: one store round trip.

        Seeds: the entities most like the query, and the subject and object of the top fact hits and of
        the facts the top chunks were the source of (those valid in the window)."""
        expansion: dict[str, Any] = {}
        if fact_hits is not None:
            entity_hits = self.search(10, "entity")
            top_facts = [h.node_id for h in fact_hits if h.score >= _SEED_MIN_SIM][:5]
            # The top chunks that still exist (in the window): the store picks them when the cache lacks one.
            seeding = [cid for cid in episode_ids if cid not in self.chunks or self.ok(cid)]
            seed_chunks: list[str] = []
            if all(cid in self.chunks for cid in seeding[:_SEED_CHUNKS]):
                top_facts += [f for cid in seeding[:_SEED_CHUNKS] for f in self.chunks[cid].fact_ids]
            else:
                seed_chunks = seeding
            # The user's own node touches every fact: as a seed, or as a node paths pass through, it would
            # put everything one hop away and flood the graph ranking.
            w = self.window
            fact_ids = [*fact_ids, *top_facts]
            expansion = {
                "seeds": [h.node_id for h in entity_hits if h.score >= _SEED_MIN_SIM][:5],
                "seed_facts": top_facts,
                "seed_chunks": seed_chunks,
                "seed_chunk_count": _SEED_CHUNKS if seed_chunks else 0,
                "as_of": w.as_of,
                "since": w.since,
                "until": w.until,
                "max_hops": self.settings.max_hops,
                "limit": self.recipe.k.get("graph", 50),
                "per_seed": self.settings.graph_facts_per_seed,
                "avoid": [self_entity_id(self.user_id)],
            }
        # One model, validated once: the query is ~100 ids long.
        query = GraphStepQuery(
            fact_ids=fact_ids, now=self.now, chunk_ids=chunk_ids, chunk_facts=chunk_facts, **expansion
        )
        with self.timed("graph"):
            step = self.user_facts.step(query)
        for fact in step.facts:
            self.facts.setdefault(fact.id, fact)
        self.user_chunks.keep(step)
        self.chunks.update((c.id, c) for c in step.chunks)
        self.hops.update(step.hops)

    # ------------------------------------------------------------------------------------- links
    def links(self) -> None:
        """Each of the top ``links_from`` candidates brings its linked items with ``link_share`` of its fusion
        score: a fact its source message's chunks, an excerpt the facts extracted from it and the other
        speaker's turns around it; then every fact ranks at least with its source message's best excerpt."""
        recipe = self.recipe
        if recipe.links_from == 0 or recipe.link_share == 0:
            return
        top = sorted(self.cands.items(), key=lambda kv: -kv[1].fusion)[: recipe.links_from]
        sources = {fid: c.fact.source_ids for fid, c in top if c.fact is not None}
        extracted = {cid: c.chunk.fact_ids for cid, c in top if c.chunk is not None}
        with self.timed("records"):
            episode_chunks = self.user_chunks.of_episodes(sorted({e for ids in sources.values() for e in ids}))
        self.chunks.update((c.id, c) for c in episode_chunks)
        self.load_facts(f for ids in extracted.values() for f in ids)
        neighbours: dict[str, list[str]] = {}
        if recipe.window > 0 and extracted:
            anchors = list(extracted)
            with self.timed("records"):
                near = self.user_chunks.neighbours(anchors, recipe.window)
            self.chunks.update((c.id, c) for c in near)
            for cid in anchors:
                anchor = self.chunks[cid]
                # A turn's context is the exchange it is part of: the turn it replies to and the reply
                # ("Where did you move?" / "Austin."), not the same speaker's next statement.
                neighbours[cid] = [
                    c.id
                    for c in near
                    if c.speaker != anchor.speaker and abs((c.event_time - anchor.event_time).total_seconds()) < 86400
                ]
        by_episode: dict[str, list[str]] = {}
        for c in episode_chunks:
            by_episode.setdefault(c.episode_id, []).append(c.id)
        for node_id, parent in top:
            share = recipe.link_share * parent.fusion
            linked: list[tuple[ChannelName, str]] = []
            if parent.fact is not None:
                linked += [("source", cid) for e in sources[node_id] for cid in by_episode.get(e, [])]
            else:
                linked += [("extracted", fid) for fid in extracted[node_id]]
                linked += [("window", cid) for cid in neighbours.get(node_id, [])]
            for channel, other in linked:
                if other == node_id or not self.ok(other):
                    continue
                self.candidate(other).add(channel, share)
        # A fact says what the message it was extracted from says, in fewer words and as it holds now: it
        # ranks at least with that message's best excerpt.
        best: dict[str, float] = {}
        for c in self.cands.values():
            if c.chunk is not None:
                best[c.chunk.episode_id] = max(best.get(c.chunk.episode_id, 0.0), c.fusion)
        if best:  # else no excerpt is a candidate: nothing to lift
            for c in self.cands.values():
                if c.fact is not None:
                    for e in c.fact.source_ids:
                        lifted = best.get(e, 0.0)
                        if lifted > c.fusion:
                            c.fusion = lifted

    # ----------------------------------------------------------------------------------- scoring
    def _replaced(self, chunk: AnyChunk, at: datetime) -> bool:
        # ``valid_at`` at the recall's one instant (``as_of``, else now): the model's ``current_at`` imports
        # at every call.
        facts = [self.facts.get(f) for f in chunk.fact_ids]
        return bool(facts) and all(
            f is not None and not valid_at(f.valid_from, f.valid_until, f.archived, at) for f in facts
        )

    def items(self, weights: Weights, k: int) -> list[RecallItem]:
        now = self.at
        missing = [i for i in self.cands if i not in self.sims]
        with self.timed("faiss"):
            self.sims.update(self.index.similarities(missing, self.qvec))
        # Rank fusion's best share is 1 / (rrf_k + 1), score fusion's 1: either way a channel's top hit adds
        # its weight times ``fusion`` to the composite score.
        unit = 1.0 / (self.recipe.rrf_k + 1) if self.recipe.fusion_mode == "rank" else 1.0
        recipe, sims, hops, cues = self.recipe, self.sims, self.hops, self.cues
        scoring = Scoring.of(self.settings, now)
        boosting = bool(recipe.speaker_boost or recipe.when_boost or recipe.period_boost or recipe.session_boost)
        for cand in self.cands.values():
            chunk = cand.chunk
            if chunk is not None and self._replaced(chunk, now):
                # What it said has ended (every fact extracted from it ended by ``as_of``): "I live in
                # Tampa." after a move is history, so the fact that replaced it ranks ahead of it.
                cand.fusion *= 0.5
            if chunk is not None and boosting:
                # Who said it and when it says something happened are the turn's context, which its words
                # alone may lack ("I signed up yesterday" answers "when did Melanie sign up?"); so is when it
                # was said ("camping last week", said on 27 June, answers "camping in June").
                cand.fusion += unit * (
                    recipe.speaker_boost * cues.names(chunk.speaker)
                    + recipe.when_boost * cues.answers_when(chunk.text, chunk.event_time, self.terms)
                    + recipe.period_boost * cues.in_period(chunk.text, chunk.event_time, self.terms)
                    + recipe.session_boost * self.sessions.share(chunk)
                )
        rows = scoring.rows(self.cands, sims, hops, weights.values(), fusion=recipe.fusion, unit=unit)
        rows.sort(key=lambda r: (-r[0], r[1]))  # best first, ties by id: the order docs/api.md states
        # The top re-scored by late interaction or similarity, still best first (``reader.rerank``).
        rows = similarity_step(rows, recipe, self._late([node_id for _, node_id, _, _ in rows[: recipe.rerank_depth]]))
        return result_items(rows[:k], self.hops, self.now)

    def _late(self, node_ids: list[str]) -> dict[str, float]:
        """MaxSim of the query's token states against each of ``node_ids`` whose record has states in the
        user's index (``storage.embedding.states``); empty without query states or a late-interaction recipe."""
        if self.qstates is None or not len(self.qstates) or not self.recipe.late_interaction:
            return {}
        with self.timed("late"):
            held = self.index.states_for(node_ids)
            return dict(zip(held, maxsims(self.qstates, list(held.values())), strict=True))


def keyword_hits(
    search: Callable[..., list[KeywordHit]], query: str, recipe: RecallRecipe, window: TimeWindow
) -> list[KeywordHit]:
    """The keyword channel: BM25 over the user's chunks and fact statements inside the time window, by
    ``search`` (the store's ``GraphStore.keyword_search`` for the user, or a held ``UserSnapshot``'s)."""
    return search(
        keyword_terms(query),
        recipe.k.get("keyword", 40),
        as_of=window.as_of,
        since=window.since,
        until=window.until,
    )


def query_stems(query: str) -> frozenset[str]:
    """The query's keyword terms stemmed as the keyword index stems (what a hit's word share is of)."""
    return frozenset(stems(" ".join(keyword_terms(query))))


def recall_items(
    *,
    graph: GraphStore,
    user_facts: UserFacts,
    user_chunks: UserChunks,
    settings: Settings,
    index: UserIndex,
    qvec: np.ndarray,
    user_id: str,
    k: int,
    recipe: RecallRecipe,
    weights: Weights,
    window: TimeWindow,
    graph_expansion: bool,
    keyword: Future[list[KeywordHit]] | None,
    timings: dict[str, float],
    cues: QueryCues,
    qstems: frozenset[str],
    terms: TextTerms,
    qstates: np.ndarray | None = None,
) -> list[RecallItem]:
    """``keyword``: the keyword channel's hits (``keyword_hits``), started by the caller before it embedded
    the query, so the store's full-text search runs while the encoder does; None without that channel.
    ``cues`` and ``qstems``: the query's cues and stemmed keywords (``query_stems``), read by the caller
    while the encoder runs too: they need no vector. ``terms``: the user's memo of texts' terms
    and dates (``reader.terms``). ``qstates``: the query's token states, from its vector's pass (late interaction in
    the second look, ``reader.rerank``; None: the cosine).
    Adds to ``timings`` the ms spent in FAISS (``faiss``), waiting for the keyword hits (``keyword``), in
    the graph step (``graph``), reading other records (``records``) and the rest (``fusion``)."""
    run = _Run(
        graph=graph,
        user_facts=user_facts,
        user_chunks=user_chunks,
        settings=settings,
        index=index,
        qvec=qvec,
        user_id=user_id,
        recipe=recipe,
        window=window,
        graph_expansion=graph_expansion,
        keyword=keyword,
        cues=cues,
        qstems=qstems,
        terms=terms,
        qstates=qstates,
    )
    start = time.perf_counter()
    run.channels()
    run.links()
    items = run.items(weights, k)
    spent = (time.perf_counter() - start) * 1e3
    timings.update(run.timings, fusion=max(0.0, spent - sum(run.timings.values())))
    return items
