"""The offline query measurements that re-order one recall pool (``query_offline.py --only depth,window,
entities``): each question's recall of 100 without its similarity step (``reader.rerank``) is taken once, and
each variant orders it again through that very step, so "recall, from its pool of 100" is recall's own order
and every other row differs from it by its change alone.

- depth: how much of the evidence the pool holds at all, in its first 40 (``get_context``'s candidates) and
  its 100: what any re-ordering of it can reach;
- window: the step given, for a turn, the best of its own cosine and the cosine of its window (the turn with
  the other speaker's reply the same day, "A: ...\\nB: ...", encoded here), blended by a share;
- entities: the query's names other than the speakers' and the calendar's (capitalized words not opening
  it), each searched alone by the keyword channel, their hits merged round-robin (at most ``m`` each) and
  each lifted by ``w`` times ``(1 - rank / n)`` before the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import numpy as np
from offline_harness import NAME, WH, Asked, Rows, by_split, outcome, recall, user_turns

from engram_api.models import RecallItem
from engram_api.reader.cues import QueryCues
from engram_api.reader.recipe import DEFAULT_RECIPE
from engram_api.reader.rerank import similarity_step
from engram_api.storage.graph.episodes import keyword_terms


@dataclass
class Pool:
    """One recall of 100 without its similarity step: its items, each one's total and similarity."""

    items: list[RecallItem]

    def ordered(self, sim: Callable[[RecallItem], float], lift: dict[str, float] | None = None) -> list[RecallItem]:
        """The items ordered as recall orders them, with ``sim`` as each one's similarity and ``lift`` added."""
        lift = lift or {}
        rows = [(i.score + lift.get(i.id, 0.0), i.id, i, (max(0.0, sim(i)), 0.0, 0.0, 0.0, 0.0)) for i in self.items]
        rows.sort(key=lambda r: (-r[0], r[1]))
        return [r[2] for r in similarity_step(rows, DEFAULT_RECIPE)]  # type: ignore[arg-type]


def pools(reader: Any, asked: list[Asked]) -> list[Pool]:
    # The cosine signal at 0: no second look at all (late interaction's own weight would still lift).
    bare = DEFAULT_RECIPE.model_copy(update={"rerank_signal": "similarity", "rerank_similarity": 0.0})
    return [Pool(recall(reader, q, bare, k=100)) for q in asked]


def depth(asked: Sequence[Asked], pooled: Sequence[Pool]) -> Rows:
    """How much evidence recall's pool holds at all: R@40 (``get_context``'s candidates) and R@100."""

    def found(q: Asked, items: Sequence[RecallItem]) -> float:
        return len({s for i in items for s in i.source_ids} & q.evidence) / len(q.evidence)

    outs = [(found(q, p.items[:40]), found(q, p.items), 0.0) for q, p in zip(asked, pooled, strict=True)]
    return {"recall's pool: R@40 / R@100 (in the R@10 / MRR columns)": by_split(asked, outs)}


def as_recalled(item: RecallItem) -> float:
    return item.breakdown.similarity


def reply_windows(turns: Sequence[Any]) -> dict[str, str]:
    """Each turn's window, by its id: the turn and the other speaker's turn right after it, said the same day
    ("Ana: Where did you move?\nBen: Austin."); a turn without such a reply has none."""
    out = {}
    for turn, after in zip(turns, [*turns[1:], None], strict=True):
        if after is not None and after.speaker != turn.speaker and after.event_time.date() == turn.event_time.date():
            out[turn.id] = f"{turn.indexed_text}\n{after.indexed_text}"
    return out


class Windows:
    """The windows' vectors (``reply_windows``), encoded once."""

    def __init__(self, encoder: Any, texts: dict[str, str]) -> None:
        ids = sorted(texts)
        self.vectors = dict(zip(ids, encoder.encode([texts[i] for i in ids]), strict=True))

    def similarity(self, qvec: np.ndarray, lam: float) -> Callable[[RecallItem], float]:
        def sim(item: RecallItem) -> float:
            own, vec = item.breakdown.similarity, self.vectors.get(item.id)
            return own if vec is None else lam * max(own, float(vec @ qvec)) + (1 - lam) * own

        return sim


def windows(reader: Any, asked: list[Asked], pooled: list[Pool]) -> Rows:
    texts = {k: v for u in {q.user for q in asked} for k, v in reply_windows(user_turns(reader, u)).items()}
    w = Windows(reader.embedder, texts)
    qvecs = [reader.embedder.encode_one(q.text) for q in asked]
    rows: Rows = {}
    for lam in (0.5, 1.0):
        outs = [
            outcome(reader, q, p.ordered(w.similarity(v, lam))) for q, p, v in zip(asked, pooled, qvecs, strict=True)
        ]
        rows[f"window with the reply, share {lam}"] = by_split(asked, outs)
    return rows


def names(query: str, speakers: set[str]) -> list[str]:
    """The names the query gives other than the speakers' and the calendar's."""
    out = []
    for name in NAME.findall(query):
        if name.split()[0].lower() in WH or QueryCues.of(name).period is not None:
            continue
        if not any(part in speakers for part in name.split()):
            out.append(name)
    return list(dict.fromkeys(out))


def entities(reader: Any, asked: list[Asked], pooled: list[Pool]) -> Rows:
    speakers = {u: {c.speaker for c in user_turns(reader, u)} for u in {q.user for q in asked}}
    named = [names(q.text, speakers[q.user]) for q in asked]
    multi = [n for n, q in enumerate(asked) if q.category == "multi-hop"]
    print(
        f"entities: {sum(1 for n in named if n)} of {len(asked)} questions name one beside the speakers "
        f"({sum(1 for n in multi if named[n])} of {len(multi)} multi-hop); e.g. "
        + "; ".join(f"{asked[n].text} -> {named[n]}" for n in multi if named[n])[:600]
    )
    rows: Rows = {}
    for m, w in ((5, 0.5), (5, 1.0), (10, 1.0), (5, 2.0)):
        outs = []
        for q, p, found in zip(asked, pooled, named, strict=True):
            lists = [
                [h.node_id for h in reader.graph.keyword_search(q.user, keyword_terms(e), m) if h.kind == "episode"]
                for e in found
            ]
            merged = list(dict.fromkeys(x for rank in zip_longest(*lists) for x in rank if x is not None))
            lift = {x: w * (1 - r / len(merged)) for r, x in enumerate(merged)}
            outs.append(outcome(reader, q, p.ordered(as_recalled, lift)))
        rows[f"entity sub-queries: {m} each, round-robin, w {w}"] = by_split(asked, outs)
    return rows
