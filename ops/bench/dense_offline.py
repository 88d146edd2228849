"""Dense signals measured offline: the quality bench's questions re-scored over a kept store, no ingest.

``python ops/bench/dense_offline.py --data-dir DIR --users conv-26=<user id>,conv-41=<user id>
[--datasets /work/shared/datasets]``

``DIR`` is the data folder of an embedded (SQLite) store the LoCoMo conversations were ingested into
(``run.py --only quality --keep``, or the bench's ``_ingest`` in a script); ``--users`` names each
conversation's user id in it. The store is read, never written. Per question with evidence, the default
recipe's recall of 100 without its similarity step (``reader.rerank``) is taken once, with the keyword
channel's top hits and every episode chunk's stored vector; each variant then gives every row another
similarity and re-orders the top with the very step recall runs (``similarity_step``), so the row "turn
vector (as recall)" is recall's own order and every other row differs from it by the similarity alone.
Variants (the directions of docs/benchmarks.md, "Dense signals measured offline"):

- sentence vectors: a turn's similarity is its whole vector's, blended (share ``lam``) with the best of
  its sentences' (sentences of >= 5 words, each embedded as "Speaker: sentence", a turn of one such
  sentence keeps its turn vector); the extra vectors a user would store are counted;
- dense pseudo-relevance feedback (Rocchio): the query vector moved by ``beta`` times the mean vector of
  the keyword channel's top ``m`` turns;
- the same signals as the episode channel alone: all of a user's turns ranked by them, top 10.

R@10 and MRR are the quality bench's (``quality_locomo._scores``). Zero LLM calls; the sentences are
encoded once per run with the reader's encoder (MiniLM).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from quality_locomo import CATEGORIES, _scores, kept_store

from engram_api.reader.recipe import DEFAULT_RECIPE
from engram_api.reader.rerank import similarity_step

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_MIN_WORDS = 5  # shorter sentences ("Wow!", "Thanks, Mel!") match any query about as well
_POOL = 100  # the recall depth re-scored: the step re-orders the top 40 of it


@dataclass
class Turns:
    """A user's episode chunks: ids, what each says, its message id, its stored vector (rows of ``vectors``)."""

    ids: list[str]
    texts: list[str]
    messages: list[str]
    vectors: np.ndarray

    def position(self) -> dict[str, int]:
        return {cid: n for n, cid in enumerate(self.ids)}


@dataclass
class Question:
    user: str
    category: str
    evidence: set[str]
    answer: str
    qvec: np.ndarray
    rows: list[tuple[str, float, float, list[str]]]  # (id, total without the step, similarity, source ids)
    keyword_top: list[str]  # the keyword channel's turns, best first


def sentences(text: str) -> list[str]:
    """The sentences of a turn ("Speaker: words") of at least ``_MIN_WORDS`` words, each with its speaker."""
    speaker, _, body = text.partition(": ")
    if not body:
        speaker, body = "", text
    found = [s.strip() for s in _SENTENCE_END.split(body) if len(s.split()) >= _MIN_WORDS]
    return [f"{speaker}: {s}" if speaker else s for s in found]


def collect(reader: Any, data: list[dict[str, Any]], users: dict[str, str]) -> tuple[list[Question], dict[str, Turns]]:
    """Every question's recall pool and keyword hits, and every user's turns with their stored vectors."""
    # The cosine signal at 0: no second look at all (late interaction's own weight would still lift).
    bare = DEFAULT_RECIPE.model_copy(update={"rerank_signal": "similarity", "rerank_similarity": 0.0})
    keyword = DEFAULT_RECIPE.with_channels("keyword")
    questions: list[Question] = []
    turns: dict[str, Turns] = {}
    for conv in (c for c in data if c["sample_id"] in users):
        user = users[conv["sample_id"]]
        index = reader.keeper.current(user, reader.graph.user_stamp(user))
        ids = sorted(index.node_ids("episode"))
        vectors = index.vectors_for(ids)
        chunks = {c.id: c for c in reader.graph.get_chunks(user, ids)}
        kept = [cid for cid in ids if cid in chunks]
        turns[user] = Turns(
            kept,
            [chunks[c].text for c in kept],
            [chunks[c].episode_id for c in kept],
            np.stack([vectors[c] for c in kept]),
        )
        for qa in conv["qa"]:
            evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
            if not evidence:
                continue
            q = str(qa["question"])
            pool = reader.recall(user, q, k=_POOL, recipe=bare).items
            hits = reader.recall(user, q, k=10, recipe=keyword).items
            questions.append(
                Question(
                    user,
                    CATEGORIES[qa["category"]],
                    evidence,
                    str(qa.get("answer", "")),
                    reader.embedder.encode_one(q),
                    [(i.id, i.score, i.breakdown.similarity, list(i.source_ids)) for i in pool],
                    [i.id for i in hits if i.kind == "episode"],
                )
            )
    return questions, turns


Similarity = Callable[[Question, str, float], float]  # (question, row id, its recalled similarity) -> similarity


def reordered(question: Question, similarity: Similarity) -> list[list[str]]:
    """The pool's source ids in the order recall's similarity step gives it with ``similarity``."""
    rows = [
        (total, node_id, None, (max(0.0, similarity(question, node_id, sim)), 0.0, 0.0, 0.0, 0.0))
        for node_id, total, sim, _ in question.rows
    ]
    sources = {node_id: src for node_id, _, _, src in question.rows}
    return [sources[node_id] for _, node_id, _, _ in similarity_step(rows, DEFAULT_RECIPE)]  # type: ignore[arg-type]


class Signals:
    """Sentence vectors and feedback vectors over ``turns``, encoded once."""

    def __init__(self, encoder: Any, turns: dict[str, Turns]) -> None:
        self.turns, self.at = turns, {u: t.position() for u, t in turns.items()}
        wanted = sorted({s for t in turns.values() for text in t.texts for s in sentences(text)})
        self.vectors = dict(zip(wanted, encoder.encode(wanted), strict=True)) if wanted else {}

    def extra_vectors(self, user: str) -> int:
        """The sentence vectors ``user`` would store: the sentences of turns with more than one."""
        return sum(len(s) for text in self.turns[user].texts if len(s := sentences(text)) > 1)

    def sentence_best(self, user: str, node_id: str, qvec: np.ndarray) -> float | None:
        """The best cosine of the turn's sentences, None for a fact or a turn of at most one sentence."""
        n = self.at[user].get(node_id)
        found = sentences(self.turns[user].texts[n]) if n is not None else []
        return max(float(self.vectors[s] @ qvec) for s in found) if len(found) > 1 else None

    def moved(self, question: Question, m: int, beta: float) -> np.ndarray:
        """The query vector plus ``beta`` times the mean vector of the keyword channel's top ``m`` turns."""
        at, turns = self.at[question.user], self.turns[question.user]
        top = [at[c] for c in question.keyword_top[:m] if c in at]
        return question.qvec + beta * turns.vectors[top].mean(axis=0) if top else question.qvec

    def sentence_similarity(self, lam: float) -> Similarity:
        def sim(q: Question, node_id: str, whole: float) -> float:
            best = self.sentence_best(q.user, node_id, q.qvec)
            return whole if best is None else lam * max(best, whole) + (1 - lam) * whole

        return sim

    def feedback_similarity(self, m: int, beta: float) -> Similarity:
        def sim(q: Question, node_id: str, whole: float) -> float:
            n = self.at[q.user].get(node_id)  # a fact keeps its own similarity
            return whole if n is None else float(self.turns[q.user].vectors[n] @ self.moved(q, m, beta))

        return sim

    def channel(self, q: Question, lam: float = 0.0, feedback: tuple[int, float] | None = None) -> list[list[str]]:
        """The episode channel alone: the user's turns by similarity, top 10, as their message ids."""
        turns = self.turns[q.user]
        qvec = q.qvec if feedback is None else self.moved(q, *feedback)
        scores = turns.vectors @ qvec
        if lam:
            best = [self.sentence_best(q.user, cid, qvec) for cid in turns.ids]
            blended = [s if b is None else lam * max(b, s) + (1 - lam) * s for b, s in zip(best, scores, strict=True)]
            scores = np.array(blended)
        return [[turns.messages[n]] for n in np.argsort(-scores, kind="stable")[:10]]


def score(
    questions: Sequence[Question], order: Callable[[Question], list[list[str]]]
) -> dict[str, tuple[float, float]]:
    """R@10 and MRR, over all questions and by category."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for q in questions:
        ranked = order(q)[:10]
        _, r10, mrr, _ = _scores([set(s) for s in ranked], [], q.evidence, "")
        for cat in ("all", q.category):
            by[cat].append((r10, mrr))
    return {cat: (float(np.mean([r[0] for r in v])), float(np.mean([r[1] for r in v]))) for cat, v in by.items()}


def variants(signals: Signals) -> dict[str, Callable[[Question], list[list[str]]]]:
    out: dict[str, Callable[[Question], list[list[str]]]] = {
        "turn vector (as recall)": lambda q: reordered(q, lambda _q, _i, s: s),
    }
    for lam in (0.25, 0.5, 1.0):
        out[f"sentence best, share {lam}"] = lambda q, lam=lam: reordered(q, signals.sentence_similarity(lam))
    for m, beta in ((3, 0.5), (5, 0.5), (10, 0.25), (10, 0.5), (5, 1.0)):
        out[f"feedback m={m} beta={beta}"] = lambda q, m=m, b=beta: reordered(q, signals.feedback_similarity(m, b))
    out["episodes alone: turn vector"] = lambda q: signals.channel(q)
    for lam in (0.25, 0.5):
        out[f"episodes alone: sentence best, share {lam}"] = lambda q, lam=lam: signals.channel(q, lam)
    for m, beta in ((3, 0.5), (5, 1.0)):
        out[f"episodes alone: feedback m={m} beta={beta}"] = lambda q, fb=(m, beta): signals.channel(q, feedback=fb)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="the data folder of an ingested SQLite store")
    parser.add_argument("--users", required=True, help="conversation=user id, comma-separated")
    parser.add_argument("--datasets", type=Path, default=Path("/work/shared/datasets"))
    users, data, client = kept_store(parser.parse_args())
    try:
        questions, turns = collect(client.reader, data, users)
        signals = Signals(client.reader.embedder, turns)
    finally:
        client.close()
    for user, t in turns.items():
        print(f"{user}: {len(t.ids)} turns, {signals.extra_vectors(user)} sentence vectors to store beside them")
    cats = ["all", *sorted({q.category for q in questions})]
    print("| method | " + " | ".join(f"{c} R@10 / MRR" for c in cats) + " |")
    for name, order in variants(signals).items():
        got = score(questions, order)
        print(f"| {name} | " + " | ".join(f"{got[c][0]:.3f} / {got[c][1]:.3f}" for c in cats) + " |", flush=True)


if __name__ == "__main__":
    main()
