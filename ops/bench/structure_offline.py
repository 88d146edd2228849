"""The conversation's own structure measured offline: sessions and shared rare words, over a kept store.

``python ops/bench/structure_offline.py --data-dir DIR --users conv-26=<user id>,conv-41=<user id>
[--datasets /work/shared/datasets]``

``DIR`` is the data folder of an embedded (SQLite) store the LoCoMo conversations were ingested into
(``run.py --only quality --store sqlite --keep``: ``<out>/work/<run>/quality-rules``); ``--users`` names each
conversation's user id in it (``ba4707f-conv-26``: the run's id and the sample id). The store is read, never
written. Per question with evidence, the default recipe's recall of 100 without its session lift
(``reader.sessions``) and, for the hybrid, without its similarity step (``reader.rerank``) is taken once,
and the keyword channel alone with the rest of the recipe (the bench's "keyword only") the same way; each
variant adds a structural signal to each row's total and orders the rows again (the hybrid's through the
very similarity step recall runs), so the first rows are recall's orders without the lift and every other
row differs from them by the signal alone. A session is a run of turns with no hour between two (LoCoMo's
sessions are days apart, its turns a second: the same sessions as recall's days). Signals:

- the keyword hits' share (what ``reader.sessions`` ships): the share of the query's stems that a session's
  turns among the keyword channel's top 40 hits hold together, each of its turns lifted by ``w`` times it;
  also with the session's turns among the episode channel's top 5-40 added to them, or those 40 alone;
- a session scored as a whole, by BM25 over all its turns' words, by the cosine of its turns' mean vector,
  or by the first pass itself (the totals of the pool's top 20 rows said in it), min-max normalized over the
  user's sessions, each of its turns lifted by ``w`` times that (or only the best ``m`` sessions' turns by
  ``w``); facts get nothing, as in recall;
- shared rare words: the stems of the pool's top ``m`` turns that at most ``df`` of the user's turns hold
  and the query does not, each row of another session holding any of them lifted by ``w`` times half the
  number of them it holds, at most ``w`` (a bounded second hop from the first hits, without a model).

R@10 and MRR are the quality bench's (``quality_locomo._scores``). Zero LLM calls.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from quality_locomo import CATEGORIES, _scores, kept_store

from engram_api.reader.cues import QueryCues
from engram_api.reader.recipe import DEFAULT_RECIPE
from engram_api.reader.rerank import similarity_step
from engram_api.storage.graph.episodes import keyword_terms
from engram_api.storage.snapshot.keywords import stems

_POOL = 100
_GAP_S = 3600.0  # a new session after an hour without a turn


@dataclass
class UserTurns:
    """A user's turns in conversation order, each one's session, stems and stored vector."""

    ids: list[str]
    episode: list[str]
    speakers: list[str]
    session: list[int]
    terms: list[frozenset[str]]
    counts: list[Counter[str]]
    vectors: np.ndarray
    df: Counter[str] = field(default_factory=Counter)

    @property
    def sessions(self) -> int:
        return self.session[-1] + 1 if self.session else 0

    def session_of_episode(self) -> dict[str, int]:
        return dict(zip(self.episode, self.session, strict=True))


@dataclass
class Pool:
    """One recall's rows: (id, total without the step, similarity, source ids, kind)."""

    rows: list[tuple[str, float, float, list[str], str]]


@dataclass
class Question:
    user: str
    category: str
    text: str
    evidence: set[str]
    qvec: np.ndarray
    hybrid: Pool
    keyword: Pool
    hits: list[str]  # the keyword channel's episode hits, best first
    vector_hits: list[str]  # the episode channel's top 40 turns, best first


def user_turns(reader: Any, user: str) -> UserTurns:
    index = reader.keeper.current(user, reader.graph.user_stamp(user))
    ids = sorted(index.node_ids("episode"))
    vectors = index.vectors_for(ids)
    chunks = sorted(reader.graph.get_chunks(user, ids), key=lambda c: c.conversation_order)
    session, last, n = [], None, -1
    for c in chunks:
        t: datetime = c.event_time
        if last is None or (t - last).total_seconds() > _GAP_S:
            n += 1
        session.append(n)
        last = t
    counts = [Counter(stems(c.text)) for c in chunks]
    turns = UserTurns(
        [c.id for c in chunks],
        [c.episode_id for c in chunks],
        [c.speaker for c in chunks],
        session,
        [frozenset(x) for x in counts],
        counts,
        np.stack([vectors[c.id] for c in chunks]),
    )
    for terms in turns.terms:
        turns.df.update(terms)
    return turns


def collect(
    reader: Any, data: list[dict[str, Any]], users: dict[str, str]
) -> tuple[list[Question], dict[str, UserTurns]]:
    # Recall without its session lift (what the variants add instead) and, for the hybrid, its similarity step.
    # The cosine signal at 0: no second look at all (late interaction's own weight would still lift).
    bare = DEFAULT_RECIPE.model_copy(
        update={"rerank_signal": "similarity", "rerank_similarity": 0.0, "session_boost": 0.0}
    )
    keyword = DEFAULT_RECIPE.with_channels("keyword").model_copy(update={"session_boost": 0.0})
    questions: list[Question] = []
    turns: dict[str, UserTurns] = {}

    def pool(user: str, q: str, recipe: Any) -> Pool:
        items = reader.recall(user, q, k=_POOL, recipe=recipe).items
        return Pool([(i.id, i.score, i.breakdown.similarity, list(i.source_ids), i.kind) for i in items])

    for conv in (c for c in data if c["sample_id"] in users):
        user = users[conv["sample_id"]]
        turns[user] = user_turns(reader, user)
        index = reader.keeper.current(user, reader.graph.user_stamp(user))
        for qa in conv["qa"]:
            evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
            if not evidence:
                continue
            q = str(qa["question"])
            terms, k, qvec = keyword_terms(q), DEFAULT_RECIPE.k["keyword"], reader.embedder.encode_one(q)
            questions.append(
                Question(
                    user,
                    CATEGORIES[qa["category"]],
                    q,
                    evidence,
                    qvec,
                    pool(user, q, bare),
                    pool(user, q, keyword),
                    [h.node_id for h in reader.graph.keyword_search(user, terms, k) if h.kind == "episode"],
                    [h.node_id for h in index.search(qvec, DEFAULT_RECIPE.k["episode_vector"], kind="episode")],
                )
            )
    return questions, turns


def _minmax(values: np.ndarray) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    return np.zeros_like(values) if hi <= lo else (values - lo) / (hi - lo)


class Structure:
    """The session and rare-word signals of every question, computed once."""

    def __init__(self, questions: Sequence[Question], turns: dict[str, UserTurns]) -> None:
        self.turns = turns
        self.of_episode = {u: t.session_of_episode() for u, t in turns.items()}
        self.at = {u: {cid: n for n, cid in enumerate(t.ids)} for u, t in turns.items()}
        self.docs: dict[str, list[Counter[str]]] = {}
        self.means: dict[str, np.ndarray] = {}
        for u, t in turns.items():
            docs: list[Counter[str]] = [Counter() for _ in range(t.sessions)]
            for s, c in zip(t.session, t.counts, strict=True):
                docs[s].update(c)
            self.docs[u] = docs
            means = np.stack([t.vectors[np.array(t.session) == s].mean(axis=0) for s in range(t.sessions)])
            self.means[u] = means / np.linalg.norm(means, axis=1, keepdims=True)

    def query_stems(self, q: Question) -> frozenset[str]:
        """The query's keyword stems without the names of the speakers it names (the speaker cue's)."""
        cues = QueryCues.of(q.text)
        named = {s for s in set(self.turns[q.user].speakers) if cues.names(s)}
        qs = frozenset(stems(" ".join(keyword_terms(q.text))))
        rest = qs - frozenset(stems(" ".join(sorted(named))))
        return rest or qs

    def bm25(self, q: Question, k1: float = 1.2, b: float = 0.75) -> np.ndarray:
        docs = self.docs[q.user]
        n = len(docs)
        lengths = np.array([sum(d.values()) for d in docs], dtype=float)
        avg = lengths.mean()
        out = np.zeros(n)
        for term in self.query_stems(q):
            df = sum(1 for d in docs if term in d)
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = np.array([d.get(term, 0) for d in docs], dtype=float)
            out += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths / avg))
        return out

    def dense(self, q: Question) -> np.ndarray:
        return self.means[q.user] @ q.qvec

    def session_of(self, q: Question, sources: list[str]) -> int | None:
        of = self.of_episode[q.user]
        found = [of[s] for s in sources if s in of]
        return found[0] if found else None

    def hits_share(self, q: Question, keyword: bool = True, vectors: int = 0) -> np.ndarray:
        """Each session's share of the query's stems that its keyword hits (``reader.sessions``) and its turns
        among the episode channel's top ``vectors`` hold together."""
        t, at, qs = self.turns[q.user], self.at[q.user], self.query_stems(q)
        held: list[set[str]] = [set() for _ in range(t.sessions)]
        for n in (at[h] for h in [*(q.hits if keyword else []), *q.vector_hits[:vectors]] if h in at):
            held[t.session[n]] |= t.terms[n] & qs
        return np.array([len(h) / max(1, len(qs)) for h in held])

    def mass(self, q: Question, pool: Pool, top: int) -> np.ndarray:
        """Each session's share of the first pass: its rows' totals among the pool's top ``top``, above the
        ``top``th total."""
        out = np.zeros(self.turns[q.user].sessions)
        rows = pool.rows[:top]
        floor = rows[-1][1] if rows else 0.0
        for _, total, _, src, _ in rows:
            s = self.session_of(q, src)
            if s is not None:
                out[s] += total - floor
        return out

    def rare_links(self, q: Question, pool: Pool, m: int, df: int) -> dict[str, float]:
        """Each row's share of the rare stems of the pool's top ``m`` turns (another session's turns only)."""
        t, at = self.turns[q.user], self.at[q.user]
        qs = self.query_stems(q)
        seeds = [at[r[0]] for r in pool.rows if r[4] == "episode" and r[0] in at][:m]
        rare: set[str] = set()
        for n in seeds:
            rare |= {w for w in t.terms[n] if t.df[w] <= df and w not in qs and len(w) > 2}
        seed_sessions = {t.session[n] for n in seeds}
        out: dict[str, float] = {}
        if not rare:
            return out
        for node_id, *_ in pool.rows:
            n = at.get(node_id)
            if n is None or n in seeds or t.session[n] in seed_sessions:
                continue
            shared = len(rare & t.terms[n])
            if shared:
                out[node_id] = min(1.0, shared / 2)
        return out


Lift = Callable[[Question, Pool], dict[str, float]]  # (question, pool) -> addition to each row's total


def ordered(q: Question, pool: Pool, lift: Lift | None, step: bool) -> list[list[str]]:
    add = lift(q, pool) if lift is not None else {}
    rows = [
        (total + add.get(node_id, 0.0), node_id, None, (max(0.0, sim), 0.0, 0.0, 0.0, 0.0))
        for node_id, total, sim, _, _ in pool.rows
    ]
    rows.sort(key=lambda r: (-r[0], r[1]))
    if step:
        rows = similarity_step(rows, DEFAULT_RECIPE)  # type: ignore[arg-type]
    sources = {r[0]: r[3] for r in pool.rows}
    return [sources[r[1]] for r in rows]


def session_lift(structure: Structure, signal: str, w: float, best: int = 0, top: int = 20) -> Lift:
    """``signal``: "hits" (the keyword hits' share), "hits+N" (with the episode channel's top N turns), "vectors"
    (those 40 alone), "bm25", "dense" or "mass" (the pool's top ``top``)."""

    def lift(q: Question, pool: Pool) -> dict[str, float]:
        if signal.startswith("hits"):
            raw = structure.hits_share(q, vectors=int(signal[5:] or 0))
        elif signal == "vectors":
            raw = structure.hits_share(q, keyword=False, vectors=40)
        elif signal == "bm25":
            raw = structure.bm25(q)
        elif signal == "dense":
            raw = structure.dense(q)
        else:
            raw = structure.mass(q, pool, top)
        if best:
            share = np.zeros_like(raw)
            share[np.argsort(-raw, kind="stable")[:best]] = 1.0
        else:
            share = raw if signal.startswith("hits") or signal == "vectors" else _minmax(raw)
        out = {}
        for node_id, _, _, src, kind in pool.rows:
            s = structure.session_of(q, src) if kind == "episode" else None  # a fact gets nothing (as recall)
            if s is not None:
                out[node_id] = w * float(share[s])
        return out

    return lift


def rare_lift(structure: Structure, w: float, m: int, df: int) -> Lift:
    def lift(q: Question, pool: Pool) -> dict[str, float]:
        return {i: w * v for i, v in structure.rare_links(q, pool, m, df).items()}

    return lift


def score(
    questions: Sequence[Question], order: Callable[[Question], list[list[str]]]
) -> dict[str, tuple[float, float]]:
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for q in questions:
        _, r10, mrr, _ = _scores([set(s) for s in order(q)[:10]], [], q.evidence, "")
        for cat in ("all", q.category):
            by[cat].append((r10, mrr))
    return {c: (float(np.mean([r[0] for r in v])), float(np.mean([r[1] for r in v]))) for c, v in by.items()}


def variants(structure: Structure) -> dict[str, tuple[Lift | None, Lift | None]]:
    """name -> (the hybrid's lift, the keyword channel's lift); None = recall's own order."""
    out: dict[str, tuple[Lift | None, Lift | None]] = {"recall without the session lift": (None, None)}
    for w in (0.5, 0.75, 1.0, 1.5, 2.0):
        lift = session_lift(structure, "hits", w)
        out[f"session: its keyword hits' share of the query, w {w}"] = (lift, lift)
    for signal in ("hits+5", "hits+20", "hits+40", "vectors"):
        out[f"session: {signal} turns' share of the query, w 1.0"] = (session_lift(structure, signal, 1.0), None)
    for signal in ("bm25", "dense", "mass"):
        for w in (0.25, 0.5, 1.0, 2.0):
            lift = session_lift(structure, signal, w)
            out[f"session {signal}, w {w}"] = (lift, lift if signal != "dense" else None)
        for best, w in ((1, 0.5), (3, 0.5), (3, 1.0)):
            lift = session_lift(structure, signal, w, best=best)
            out[f"session {signal}, best {best} by {w}"] = (lift, lift if signal != "dense" else None)
    for m, df, w in ((3, 3, 0.5), (5, 3, 0.5), (5, 5, 0.5), (5, 3, 1.0), (10, 3, 0.5), (5, 10, 0.5)):
        lift = rare_lift(structure, w, m, df)
        out[f"rare words: top {m}, df <= {df}, w {w}"] = (lift, lift)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="the data folder of an ingested SQLite store")
    parser.add_argument(
        "--users", required=True, help="conversation=user id (the bench's run id and the sample id), comma-separated"
    )
    parser.add_argument("--datasets", type=Path, default=Path("/work/shared/datasets"))
    users, data, client = kept_store(parser.parse_args())
    try:
        questions, turns = collect(client.reader, data, users)
    finally:
        client.close()
    for user, t in turns.items():
        print(f"{user}: {len(t.ids)} turns in {t.sessions} sessions")
    structure = Structure(questions, turns)
    cats = ["all", *sorted({q.category for q in questions})]
    print("| method | recipe | " + " | ".join(f"{c} R@10 / MRR" for c in cats) + " |")
    for name, (hybrid, keyword) in variants(structure).items():
        for label, pool_of, lift, step in (
            ("hybrid", lambda q: q.hybrid, hybrid, True),
            ("keyword only", lambda q: q.keyword, keyword, False),
        ):
            if lift is None and name != "recall without the session lift":
                continue
            got = score(questions, lambda q, p=pool_of, f=lift, s=step: ordered(q, p(q), f, s))
            print(
                f"| {name} | {label} | " + " | ".join(f"{got[c][0]:.3f} / {got[c][1]:.3f}" for c in cats) + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
