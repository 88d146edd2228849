"""What might lift the late-interaction step further, with the candidates' states stored as the product
stores them: ``maxsim_offline.py --further`` (dev only; the module doc there gives the pools, the signal and
the scoring).

The baseline is the product's form: each candidate's ``own`` tokens (a turn's own words, read with the turn
it answers) kept as 1-bit signs, the query's ``words`` tokens in float32, MaxSim min-max normalized over
recall's top 40 and added with weight 4.5 to each one's fused total in place of the cosine. Each variant
changes one thing, chosen before any ran (few, not a grid: 390 questions would reward a grid's luck):

- depth: the same step over the top 60 or the whole pool of 100 (does MaxSim over a deeper pool find more?);
- mix: the fused total replaced (the top 40 ordered by MaxSim alone), a rank fusion of the two orders
  (``1 / (60 + rank)`` each, the usual constant, nothing to tune), or the total min-max normalized over the
  40 as MaxSim is and the two added with equal weights (alone and with the query's idf weights below);
- query: its wh-words and auxiliaries dropped (``offline_harness.WH``), or its tokens weighted by their
  word piece's idf over the user's turns (an unseen piece the rarest) instead of the plain mean; each
  token's best divided by its L1 norm (against signs a token's best is at most that, so the plain mean
  weights the tokens by it: this gives each the same range, as float states do), alone and with idf;
- multi-hop: a turn read with its neighbours (its own tokens and those of the turns before and after it in
  the same session: a query word may find its match beside the turn), or the names in the baseline's top 3
  (capitalized words not opening a sentence, other than the speakers' and the query's own) as a second
  query, its MaxSim added with weight 1.5 (a third of the first's).

Printed beside the table: how many questions each variant moves up and down against the baseline, and its
R@10 / MRR in each dev conversation (a gain that one conversation alone carries is not a choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import numpy as np
from maxsim_offline import TokenStates, reordered, text_of, turn_texts
from offline_harness import NAME, WH, Asked, Outcome, Rows, by_split, outcome, user_turns
from pool_offline import Pool

from engram_api.models import RecallItem
from engram_api.reader.scoring import normalized

W = 4.5  # MaxSim's weight in the step (the product's)
DEPTH = 40  # the product's rerank_depth
DEPTHS = (60, 100)
RRF_K = 60  # rank fusion's constant (Cormack et al.), not tuned
NAMES_FROM = 3  # the second query: the names in the baseline's top this many
NAMES_W = 1.5  # and its MaxSim's weight
BASE = "signs own, top 40, total + 4.5 MaxSim (the product's step)"


def signs(states: np.ndarray) -> np.ndarray:
    """A candidate's stored form: 1 bit a dimension, read back as +-1."""
    return np.where(states >= 0, 1.0, -1.0).astype(np.float32)


def late(query: np.ndarray, doc: np.ndarray, weights: np.ndarray | None = None) -> float:
    """MaxSim: each query token's best inner product with the doc's tokens, averaged (by ``weights`` if
    given); 0 when either side has no token."""
    if not len(query) or not len(doc):
        return 0.0
    best = (query @ doc.T).max(axis=1)
    return float(best.mean() if weights is None else (best * weights).sum() / weights.sum())


def by_ranks(pool: Pool, sims: dict[str, float], depth: int = DEPTH) -> list[RecallItem]:
    """The pool with its top ``depth`` ordered by rank fusion of the fused total's order and MaxSim's
    (``1 / (RRF_K + rank)`` each, rank from 1); rows below untouched."""
    rows = sorted(pool.items, key=lambda i: (-i.score, i.id))
    top = rows[:depth]
    by_late = {i.id: r for r, i in enumerate(sorted(top, key=lambda i: (-sims[i.id], i.id)), start=1)}
    fused = [(1 / (RRF_K + r) + 1 / (RRF_K + by_late[i.id]), i) for r, i in enumerate(top, start=1)]
    fused.sort(key=lambda f: (-f[0], f[1].id))
    return [i for _, i in fused] + rows[depth:]


def even(pool: Pool, sims: dict[str, float], depth: int = DEPTH) -> list[RecallItem]:
    """The pool with its top ``depth`` ordered by the fused total and MaxSim each min-max normalized over
    them, added with equal weights (the total's own spread no longer sets MaxSim's share); rows below
    untouched."""
    rows = sorted(pool.items, key=lambda i: (-i.score, i.id))
    top = rows[:depth]
    totals = normalized([i.score for i in top], cut=True)
    late_ = normalized([sims[i.id] for i in top], cut=True)
    mixed = sorted(zip(top, totals, late_, strict=True), key=lambda r: (-(r[1] + r[2]), r[0].id))
    return [r[0] for r in mixed] + rows[depth:]


def alone(pool: Pool, sims: dict[str, float], depth: int = DEPTH) -> list[RecallItem]:
    """The pool with its top ``depth`` ordered by MaxSim alone (the fused total replaced)."""
    rows = sorted(pool.items, key=lambda i: (-i.score, i.id))
    return sorted(rows[:depth], key=lambda i: (-sims[i.id], i.id)) + rows[depth:]


def lifted(pool: Pool, top: Sequence[RecallItem], extra: Sequence[float]) -> Pool:
    """The pool with each of ``top`` (its first rows) lifted by ``NAMES_W`` x its ``extra`` (normalized)
    before the step: copies, so the caller maps them back to the pool's own items by id."""
    lift = {i.id: NAMES_W * e for i, e in zip(top, extra, strict=True)}
    return Pool([i.model_copy(update={"score": i.score + lift.get(i.id, 0.0)}) for i in pool.items])


def neighbours(turns: Sequence[Any]) -> dict[str, list[str]]:
    """Each turn's id -> the ids of the turns before and after it (in conversation order) in the same
    session: said the same day (an episode is one message, so its id does not tell sessions apart)."""
    out: dict[str, list[str]] = {}
    for _, run in groupby(turns, key=lambda c: c.event_time.date()):
        ids = [c.id for c in run]
        for n, turn in enumerate(ids):
            out[turn] = ids[max(0, n - 1) : n] + ids[n + 1 : n + 2]
    return out


def names_in(texts: Sequence[str], query: str, speakers: set[str]) -> list[str]:
    """The names ``texts`` give (``offline_harness.NAME``) but the speakers', the query's and wh-words."""
    asked = query.lower()
    out = []
    for text in texts:
        for name in NAME.findall(text):
            if name.split()[0].lower() in WH or name.lower() in asked or any(p in speakers for p in name.split()):
                continue
            out.append(name)
    return list(dict.fromkeys(out))


def piece_weights(states: TokenStates, query: str, mask: str, idf: dict[int, float], unseen: float) -> np.ndarray:
    """The idf of each of the query's kept tokens' word piece (``unseen`` for a piece no turn has)."""
    q = states.memo[(query, True)]
    return np.array([idf.get(int(p), unseen) for p in q["ids"][q[mask]]])


def moved(got: Sequence[Outcome], base: Sequence[Outcome]) -> str:
    """How many questions a variant moves up and down against the baseline, in R@10 and in MRR: a
    difference of a few questions is the split's noise, whatever the means say."""
    pairs = list(zip(got, base, strict=True))
    counts = [(sum(g[m] > b[m] for g, b in pairs), sum(g[m] < b[m] for g, b in pairs)) for m in (0, 1)]
    return "; ".join(
        f"{what} up for {up}, down for {down}" for what, (up, down) in zip(("R@10", "MRR"), counts, strict=True)
    )


def further(reader: Any, asked: list[Asked], pooled: list[Pool], states: TokenStates) -> Rows:
    """The signs ``own`` baseline and each variant (module doc) over the same pools, by name."""
    from maxsim_offline import idfs

    users = sorted({q.user for q in asked})
    turns = {u: user_turns(reader, u) for u in users}
    texts = {u: turn_texts(reader, u) for u in users}
    reply = {u: texts[u]["+reply"] for u in users}
    docs = {t for u in users for t in reply[u].values()}
    states.encode(
        sorted(docs | {text_of(i, reply[q.user]) for q, p in zip(asked, pooled, strict=True) for i in p.items})
    )
    states.encode([q.text for q in asked], query=True)
    stored: dict[str, np.ndarray] = {}

    def kept(user: str, item_id: str, statement: str) -> np.ndarray:
        text = reply[user].get(item_id, statement)
        if text not in stored:
            d = states.memo[(text, False)]
            stored[text] = signs(d["vecs"][d["own"]])
        return stored[text]

    def query_states(text: str, mask: str = "words") -> np.ndarray:
        q = states.memo[(text, True)]
        return q["vecs"][q[mask]]

    around = {u: neighbours(turns[u]) for u in users}
    alone_turns = sum(not n for u in users for n in around[u].values())
    print(f"\nneighbours: {sum(map(len, around.values()))} turns, {alone_turns} alone in their session")
    speakers = {u: {c.speaker for c in turns[u]} for u in users}
    idf = {u: idfs(list(texts[u]["turn"].values()), states.tokenizer) for u in users}
    unseen = {u: float(np.log(len(texts[u]["turn"]) + 1)) for u in users}

    orders: dict[str, list[list[RecallItem]]] = {}
    names_found = 0
    spreads: list[float] = []  # the fused total's best minus its 40th, a question each
    for q, p in zip(asked, pooled, strict=True):
        qv, plain = query_states(q.text), query_states(q.text, "no wh")
        weights = piece_weights(states, q.text, "words", idf[q.user], unseen[q.user])
        own = {i.id: kept(q.user, i.id, i.statement) for i in p.items}
        by_l1 = qv / np.abs(qv).sum(axis=1, keepdims=True)  # a token's best against signs is at most its L1 norm
        sims = {i: late(qv, d) for i, d in own.items()}
        base = reordered(p, sims, 0.0, W)
        top = sorted(p.items, key=lambda i: (-i.score, i.id))[:DEPTH]
        spreads.append(top[0].score - top[-1].score)
        read_around = {
            i: late(qv, np.vstack([d, *(kept(q.user, n, "") for n in around[q.user].get(i, []))]))
            for i, d in own.items()
        }
        found = names_in(
            [texts[q.user]["turn"].get(i.id, i.statement) for i in base[:NAMES_FROM]], q.text, speakers[q.user]
        )
        second, p_ids = base, {i.id: i for i in p.items}
        if found:
            names_found += 1
            states.encode([", ".join(found)], query=True)
            nq = query_states(", ".join(found))
            extra = normalized([late(nq, own[i.id]) for i in top], cut=True)
            second = [p_ids[i.id] for i in reordered(lifted(p, top, extra), sims, 0.0, W)]
        got = {
            BASE: base,
            **{f"depth {d}": reordered(p, sims, 0.0, W, d) for d in DEPTHS},
            "mix: the total replaced (MaxSim alone)": alone(p, sims),
            f"mix: rank fusion (1 / ({RRF_K} + rank) each)": by_ranks(p, sims),
            "mix: the total and MaxSim each normalized, equal weights": even(p, sims),
            "mix: the same, idf-weighted query tokens": even(p, {i: late(qv, d, weights) for i, d in own.items()}),
            "query: no wh-words, auxiliaries": reordered(p, {i: late(plain, d) for i, d in own.items()}, 0.0, W),
            "query: idf-weighted tokens": reordered(p, {i: late(qv, d, weights) for i, d in own.items()}, 0.0, W),
            "query: each token's best over its L1 norm (the signs' scale)": reordered(
                p, {i: late(by_l1, d) for i, d in own.items()}, 0.0, W
            ),
            "query: idf-weighted and over its L1 norm": reordered(
                p, {i: late(by_l1, d, weights) for i, d in own.items()}, 0.0, W
            ),
            "multi-hop: a turn read with its neighbours": reordered(p, read_around, 0.0, W),
            f"multi-hop: top {NAMES_FROM}'s names as a second query, w {NAMES_W}": second,
        }
        for name, order in got.items():
            orders.setdefault(name, []).append(order)
    multi = sum(q.category == "multi-hop" for q in asked)
    print(f"\nthe fused total over the top {DEPTH}: best minus last, quartiles {np.percentile(spreads, [25, 50, 75])}")
    print(f"second query: names found for {names_found} of {len(asked)} questions ({multi} multi-hop in all)")
    rows: Rows = {}
    for name, per_question in orders.items():
        rows[name] = by_split(asked, [outcome(reader, q, o) for q, o in zip(asked, per_question, strict=True)])
    for name, got in rows.items():
        print(f"{name}: against the baseline, {moved(got['dev'], rows[BASE]['dev'])}")
        for user in users:
            mine = [o for q, o in zip(asked, got["dev"], strict=True) if q.user == user]
            print(f"  {user}: {np.mean([o[0] for o in mine]):.3f} / {np.mean([o[1] for o in mine]):.3f}")
    return rows
