"""The query's side of ranking measured offline: fusion weighted by how sure the keyword channel is, the
dense channels' query reshaped for turns, BM25's k1 and b for short turns, a turn's window with its reply,
and a query's named entities as keyword sub-queries; over a kept store, no ingest.

``python ops/bench/query_offline.py --data-dir DIR --dev conv-26=<user id>,conv-41=<user id>
[--held conv-30=<user id>,...] [--only adaptive,forms,bm25,pools,depth,window,entities] [--bm25 k1,b,w;...]
[--pools fv,ev,kw,g;...]``

``DIR`` is the data folder of an embedded (SQLite) store the LoCoMo conversations were ingested into
(``run.py --only quality --store sqlite --keep``: ``<out>/work/<run>/quality-rules``); the user ids are the
run's id and the sample id (``ba4707f-conv-26``). The store is read, never written. Every parameter is
chosen on ``--dev`` alone; ``--held`` is then scored with the dev choice, never tuned on.

Each question with evidence is recalled by the reader itself (result cache off) and scored as
``offline_harness`` says (R@10, MRR, the evidence in ``get_context``'s 1,000 tokens), so each row differs
from "recall" by its change alone:

- adaptive: the dense channels (``episode_vector``, ``fact_vector`` weights and ``rerank_similarity``) scaled
  by ``s`` in a few levels, each question recalled once a level; a rule then picks a level a question from one
  feature of how sure the keyword channel is (``unsure``: the store's BM25 top, second over first score and
  the top 10's mean over the first; the query's terms; the top hit's missing share of the query's stems; the
  keyword and episode channels' top-10 overlap; the best turn cosine), ``s_hi`` at or above a threshold, else
  ``s_lo``. The levels and the threshold (a dev quartile) are chosen on dev; the oracle (each question its
  best level) bounds any such rule;
- forms: the text the encoder embeds for the query (the keyword channel keeps the question): the wh-word and
  auxiliaries dropped ("What did Caroline research?" -> "Caroline research"), the keyword terms alone, or
  shaped as a turn ("Caroline: research"); hybrid and the episode channel alone;
- bm25: the keyword channel's turns ranked by BM25 over the user's own turns with other k1 and b (the held
  snapshot's formula, ``storage.snapshot.keywords``), optionally the speaker's name as a field of its own
  weighted ``w`` (0 = the name not matched at all); facts as the store ranks them; hybrid and keyword only;
- pools: the recipe's channel pools (``RecallRecipe.k``: fact_vector, episode_vector, keyword, graph) set to
  each of ``--pools`` (the CPU of each: ``recall_dump.py cpu --pools``);
- depth, window, entities: recall's pool of 100 re-ordered (``pool_offline``): the evidence it holds at all, a
  turn's similarity from its window with the reply, the query's names as keyword sub-queries.

Zero LLM calls.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from offline_harness import (
    ASKING,
    NAME,
    WH,
    WORD,
    Asked,
    Rows,
    by_split,
    mean,
    opened,
    outcome,
    recalled,
    show,
    user_turns,
)
from pool_offline import as_recalled, depth, entities, pools, windows

from engram_api.models import KeywordHit
from engram_api.reader import recall as recall_module
from engram_api.reader.recipe import CHANNELS, DEFAULT_RECIPE, RecallRecipe
from engram_api.storage.graph.episodes import keyword_terms
from engram_api.storage.snapshot.keywords import stems

_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


@contextmanager
def embedded_as(reader: Any, form: Callable[[str], str]) -> Iterator[None]:
    """The encoder embeds ``form(query)`` in place of the query; recall's keyword side keeps the query."""
    embedder, original = reader.embedder, reader.embedder.prepare_one
    embedder.prepare_one = lambda text, *, user_id=None: original(form(text), user_id=user_id)
    try:
        yield
    finally:
        del embedder.prepare_one


@contextmanager
def keyword_answered(episodes: Callable[[str, str, int], list[KeywordHit]]) -> Iterator[None]:
    """Recall's keyword channel with its turns from ``episodes(user, query, k)``, its facts the store's."""
    original = recall_module.keyword_hits

    def hits(search: Any, query: str, recipe: RecallRecipe, window: Any) -> list[KeywordHit]:
        facts = [h for h in original(search, query, recipe, window) if h.kind == "fact"]
        return [*episodes(ASKING["user"], query, recipe.k.get("keyword", 40)), *facts]

    recall_module.keyword_hits = hits
    try:
        yield
    finally:
        recall_module.keyword_hits = original


# ------------------------------------------------------------------------------------------ adaptive
def unsure(reader: Any, q: Asked) -> dict[str, float]:
    """How unsure the keyword channel is, each feature higher when its top is flatter or the dense side
    disagrees: the store's BM25 scores (second over first, the top 10's mean over the first), the query's
    terms, the top hit's missing share of the query's stems, one minus the overlap of the keyword and episode
    channels' top 10, and the best turn cosine (higher: the dense side is surer)."""
    terms = keyword_terms(q.text)
    hits = [h for h in reader.graph.keyword_search(q.user, terms, DEFAULT_RECIPE.k["keyword"]) if h.kind == "episode"]
    scores = [h.score for h in hits]
    index = reader.keeper.current(q.user, reader.graph.user_stamp(q.user))
    dense = index.search(reader.embedder.encode_one(q.text), 10, kind="episode")
    qs = frozenset(stems(" ".join(terms)))
    top = reader.graph.get_chunks(q.user, [hits[0].node_id]) if hits else []
    held = len(qs & frozenset(stems(top[0].indexed_text))) / len(qs) if top and qs else 0.0
    top10 = {h.node_id for h in hits[:10]}
    return {
        "second/first": scores[1] / scores[0] if len(scores) > 1 and scores[0] > 0 else 1.0,
        "mean10/first": float(np.mean(scores[:10])) / scores[0] if scores and scores[0] > 0 else 1.0,
        "query terms": float(len(terms)),
        "top hit's missing share": 1.0 - held,
        "1 - keyword/episode top-10 overlap": 1.0 - len(top10 & {h.node_id for h in dense}) / 10,
        "best turn cosine": dense[0].score if dense else 0.0,
    }


def scaled(s: float) -> RecallRecipe:
    """The default recipe with its dense channels' weights and its cosine similarity step times ``s``."""
    weights = {**DEFAULT_RECIPE.weights, "episode_vector": 1.0 * s, "fact_vector": 0.5 * s}
    return DEFAULT_RECIPE.model_copy(
        update={"weights": weights, "rerank_signal": "similarity", "rerank_similarity": 1.5 * s}
    )


def adaptive(reader: Any, asked: list[Asked]) -> Rows:
    levels = {s: recalled(reader, asked, scaled(s)) for s in _LEVELS}
    rows: Rows = {f"dense channels x{s}": by_split(asked, outs) for s, outs in levels.items()}
    n_all = range(len(asked))
    best = [max(_LEVELS, key=lambda s, n=n: (levels[s][n][0] + levels[s][n][1], -abs(s - 1))) for n in n_all]
    rows["oracle: each question its best level"] = by_split(asked, [levels[s][n] for n, s in enumerate(best)])
    feats = [unsure(reader, q) for q in asked]
    dev = [n for n, q in enumerate(asked) if q.split == "dev"]
    for name in feats[0]:
        values = sorted(feats[n][name] for n in dev)
        found: tuple[float, float, float, float] | None = None
        for quant in (0.25, 0.5, 0.75):
            t = values[int(quant * (len(values) - 1))]
            for lo in _LEVELS:
                for hi in _LEVELS:
                    pick = [levels[hi if feats[n][name] >= t else lo][n] for n in dev]
                    gain = mean(pick, 0) + mean(pick, 1)
                    if lo != hi and (found is None or gain > found[0]):
                        found = (gain, t, lo, hi)
        assert found is not None
        _, t, lo, hi = found
        pick = [levels[hi if f[name] >= t else lo][n] for n, f in enumerate(feats)]
        rows[f"adaptive: {name} >= {t:.3g} x{hi}, else x{lo}"] = by_split(asked, pick)
    return rows


# ------------------------------------------------------------------------------------------ forms
def stripped(query: str) -> str:
    """The question without its wh-word and auxiliaries: "What did Caroline research?" -> "Caroline research"."""
    return " ".join(w for w in WORD.findall(query) if w.lower() not in WH) or query


def keywords_only(query: str) -> str:
    return " ".join(keyword_terms(query)) or query


def turn_shaped(query: str) -> str:
    """As a turn is embedded ("Speaker: words"): the first name the query gives, then the rest stripped."""
    names = NAME.findall(query)
    rest = stripped(query)
    if not names:
        return rest
    words = [w for w in rest.split() if w.removesuffix("'s") not in names[0].split()]
    return f"{names[0]}: {' '.join(words)}"


def forms(reader: Any, asked: list[Asked]) -> Rows:
    rows: Rows = {}
    episodes = DEFAULT_RECIPE.with_channels("episode_vector")
    print(
        "forms of "
        + repr(asked[0].text)
        + ": "
        + " | ".join(f(asked[0].text) for f in (stripped, keywords_only, turn_shaped))
    )
    rows["episodes only"] = by_split(asked, recalled(reader, asked, episodes))
    for name, form in (("stripped", stripped), ("keyword terms", keywords_only), ("turn-shaped", turn_shaped)):
        with embedded_as(reader, form):
            rows[f"query embedded {name}"] = by_split(asked, recalled(reader, asked, DEFAULT_RECIPE))
            rows[f"episodes only, query embedded {name}"] = by_split(asked, recalled(reader, asked, episodes))
    return rows


# ------------------------------------------------------------------------------------------ bm25
class TurnIndex:
    """A user's turns as BM25 documents, the words said and the speaker's name apart."""

    def __init__(self, chunks: Sequence[Any]) -> None:
        self.ids = [c.id for c in chunks]
        self.body = [Counter(stems(c.text)) for c in chunks]
        self.speaker = [frozenset(stems(c.speaker)) for c in chunks]
        self.lengths = np.array([sum(b.values()) for b in self.body], dtype=float)
        self.df: Counter[str] = Counter()
        for body, speaker in zip(self.body, self.speaker, strict=True):
            self.df.update(set(body) | speaker)

    def search(self, query: str, k: int, k1: float, b: float, w: float) -> list[KeywordHit]:
        """BM25 over the words said with ``k1`` and ``b``, plus ``w`` times a term's IDF when it is in the name
        of the turn's speaker (the name as a field of one word a term)."""
        n, avg = len(self.ids), float(self.lengths.mean())
        scores = np.zeros(n)
        for term in set(stems(" ".join(keyword_terms(query)))):
            df = self.df.get(term, 0)
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = np.array([d.get(term, 0) for d in self.body], dtype=float)
            scores += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.lengths / avg))
            if w:
                scores += w * idf * np.array([term in s for s in self.speaker], dtype=float)
        top = [int(i) for i in np.argsort(-scores, kind="stable")[:k] if scores[i] > 0]
        return [KeywordHit(node_id=self.ids[i], kind="episode", score=float(scores[i])) for i in top]


def bm25(reader: Any, asked: list[Asked], grid: Sequence[tuple[float, float, float]]) -> Rows:
    indexes = {u: TurnIndex(user_turns(reader, u)) for u in {q.user for q in asked}}
    keyword = DEFAULT_RECIPE.with_channels("keyword")
    rows: Rows = {}
    for k1, b, w in grid:
        with keyword_answered(lambda user, query, k, k1=k1, b=b, w=w: indexes[user].search(query, k, k1, b, w)):
            rows[f"BM25 k1 {k1} b {b} name {w}: hybrid"] = by_split(asked, recalled(reader, asked, DEFAULT_RECIPE))
            rows[f"BM25 k1 {k1} b {b} name {w}: keyword only"] = by_split(asked, recalled(reader, asked, keyword))
    return rows


def channel_pools(reader: Any, asked: list[Asked], specs: Sequence[str]) -> Rows:
    """Each question recalled with the recipe's channel pools set to each spec ("fv,ev,kw,g")."""
    rows: Rows = {}
    for spec in specs:
        k = dict(zip(CHANNELS, map(int, spec.split(",")), strict=True))
        recipe = DEFAULT_RECIPE.model_copy(update={"k": k})
        rows[f"pools {spec.replace(',', ' / ')}"] = by_split(asked, recalled(reader, asked, recipe))
    return rows


_POOLS = "30,40,40,50;15,40,40,20;30,40,40,20;15,40,40,50;30,30,30,50;15,30,30,20"
_BM25 = "1.2,0.75,1;1.2,0.75,0;1.2,0.3,1;0.8,0.5,1;1.6,0.5,1;1.2,1.0,1"


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="the data folder of an ingested SQLite store")
    parser.add_argument("--dev", default="", help="conversation=user id, comma-separated (parameters chosen here)")
    parser.add_argument("--held", default="", help="conversation=user id, comma-separated (scored, never tuned on)")
    parser.add_argument("--only", default="adaptive,forms,bm25,depth,window,entities")
    parser.add_argument("--datasets", type=Path, default=Path("/work/shared/datasets"))
    parser.add_argument("--bm25", default=_BM25, help="k1,b,name weight;... (the bm25 section's settings)")
    parser.add_argument("--pools", default=_POOLS, help="fv,ev,kw,g;... (the pools section's channel pools)")
    args = parser.parse_args()
    splits, client, asked = opened(args)
    reader = client.reader
    only = set(args.only.split(","))
    try:
        rows: Rows = {
            "recall": by_split(asked, recalled(reader, asked, DEFAULT_RECIPE)),
            "keyword only": by_split(asked, recalled(reader, asked, DEFAULT_RECIPE.with_channels("keyword"))),
        }
        sections: dict[str, Callable[[], Rows]] = {
            "adaptive": lambda: adaptive(reader, asked),
            "forms": lambda: forms(reader, asked),
            "bm25": lambda: bm25(reader, asked, [tuple(map(float, g.split(","))) for g in args.bm25.split(";")]),
            "pools": lambda: channel_pools(reader, asked, args.pools.split(";")),
        }
        for name, section in sections.items():
            if name in only:
                show(rows | section(), asked, splits)
        if only & {"window", "entities", "depth"}:
            pooled = pools(reader, asked)
            outs = [outcome(reader, q, p.ordered(as_recalled)) for q, p in zip(asked, pooled, strict=True)]
            rows["recall, from its pool of 100"] = by_split(asked, outs)
            if "depth" in only:
                show(rows | depth(asked, pooled), asked, splits)
            if "window" in only:
                show(rows | windows(reader, asked, pooled), asked, splits)
            if "entities" in only:
                show(rows | entities(reader, asked, pooled), asked, splits)
    finally:
        client.close()


if __name__ == "__main__":
    main()
