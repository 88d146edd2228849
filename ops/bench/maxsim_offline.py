"""Late interaction from the packaged MiniLM, measured offline: ColBERT-style MaxSim between the query's and a
candidate's token states re-orders recall's top 40, in place of the sentence cosine or beside it.

``python ops/bench/maxsim_offline.py --data-dir DIR --dev conv-26=<user id>,conv-41=<user id>
[--held conv-30=<user id>,... --choice NAME] [--cost N | --stored | --further]``

``DIR`` is the data folder of a kept SQLite store of the LoCoMo conversations (``run.py --only quality --store
sqlite --keep``: ``<out>/work/<run>/quality-rules``); the store is read, never written. Every variant is
chosen on ``--dev``; ``--held`` is scored only with ``--choice`` (the dev choice, one row, never tuned on).

The signal. A text's token states are MiniLM's last hidden states (``transformers`` on the bundled weights,
``HF_HUB_OFFLINE``), each L2-normalized; MaxSim(q, d) is the mean over the query's kept tokens of the best
inner product with any of the candidate's kept tokens. Masks: ``all`` keeps every token ([CLS] and [SEP]
too), ``words`` drops the special tokens and punctuation, ``content`` also the stop words (the keyword
channel's list, and for the query its wh-words and auxiliaries), ``own`` is ``words`` without a candidate's
tokens of the turn it answers (read in that context, matched on its own words: what a store would keep per
turn), a word's pieces kept or dropped together.
A turn is read as its keyword document (``indexed_text``: "Speaker: words") or as its vector is made
(``+reply``: with the turn it answers, ``stored_texts(..., "other_turn")``); a fact as its statement.

The pool is ``pool_offline``'s: each question's recall of 100 without the similarity step, taken once, so
"recall" below is recall's own order (``reader.rerank``: the top 40 by total each gain 1.5 x its cosine
min-max normalized over them). A variant gives each of those 40 ``cos`` x the normalized cosine plus ``w`` x
its MaxSim normalized the same way, and orders them again (``cos`` 0 replaces the cosine, 1.5 keeps it
beside); rows below the 40 are untouched, as in ``similarity_step``. Scored by ``offline_harness``: R@10, MRR
and the evidence ``get_context`` shows at 1,000 tokens, per category.

``--cost N``: the price at query time, on N dev questions in this process (``time.process_time``, medians):
the floor (query embedding + one FAISS search, top 30, as ``recall_dump.py cpu``), recall itself (k 10,
result cache and the encoder's query cache off), and the production encoder (ONNX, ``Embedder.encode``) run over the texts of the
question's top 40 (a token-state output of the same graph costs the same forward pass; the MaxSim itself,
a 40 x ~20 x ~30 product, is timed apart). Also the token counts a stored token matrix would hold per turn.

``--stored`` (dev only): dev's choice and the ``own`` mask ("+reply", ``cos`` 0, ``w`` 4.5) with the candidates'
states as a store could keep them (``stored_forms``: float16, int8 with a scale per token, at most 8 / 16 / 32
tokens by idf or norm, 1-bit signs, the signs' top 10 / 20 re-scored in float32), the query's in float32, and
the bytes a turn takes in each. ``--further`` (dev only): variants of the product's form (``maxsim_further``).

Zero LLM calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
from offline_harness import WH, Asked, Rows, by_split, opened, outcome, recalled, show, user_turns
from pool_offline import Pool, as_recalled, pools

from engram_api.models import RecallItem
from engram_api.reader.recipe import DEFAULT_RECIPE
from engram_api.reader.scoring import normalized
from engram_api.storage.embedding.embedder import _resolve
from engram_api.storage.graph.episodes import _STOP, stored_texts

Kept = Callable[[dict[str, np.ndarray], str], np.ndarray]  # a doc's memo entry, mask -> the states a store keeps

MASKS = ("all", "words", "content", "own")
FORMS = ("turn", "+reply")
REPLY = "\n(replying to "  # where ``stored_texts``' "other_turn" form appends the turn answered
MIXES = (  # (cos, w); (1.5, 0) is recall
    (1.5, 0.0), (0.0, 1.5), (0.0, 3.0), (0.0, 4.5), (0.0, 6.0), (1.5, 0.5), (1.5, 1.0), (1.5, 2.0), (1.5, 3.0), (1.5, 4.5)
)  # fmt: skip


class TokenStates:
    """MiniLM's last hidden states per text, normalized, with each token's mask membership; memoized."""

    def __init__(self, model_name: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)  # the machine is shared; one thread is what a worker gets
        path = _resolve(model_name)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.memo: dict[tuple[str, bool], dict[str, np.ndarray]] = {}

    def encode(self, texts: Sequence[str], query: bool = False) -> None:
        todo = sorted({t for t in texts if (t, query) not in self.memo}, key=len)
        for at in range(0, len(todo), 32):
            batch = todo[at : at + 32]
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
            with self.torch.no_grad():
                states = self.model(**enc).last_hidden_state.numpy()
            for row, text in enumerate(batch):
                n = int(enc["attention_mask"][row].sum())
                norms = np.linalg.norm(states[row, :n], axis=1)
                self.memo[(text, query)] = {
                    "vecs": (states[row, :n] / norms[:, None]).astype(np.float32),
                    "norms": norms,
                    "ids": enc["input_ids"][row, :n].numpy(),
                    **self._masks(enc, row, n, text, query),
                }

    def _masks(self, enc: Any, row: int, n: int, text: str, query: bool) -> dict[str, np.ndarray]:
        """Which of the ``n`` tokens each mask keeps: a word's pieces share their word's fate."""
        stop = _STOP | WH if query else _STOP
        reply = text.find(REPLY) if not query and REPLY in text else len(text)
        words, content, own, plain = (np.zeros(n, bool) for _ in range(4))
        for t, word in enumerate(enc.word_ids(row)[:n]):
            if word is None:
                continue
            start, end = enc.word_to_chars(row, word)
            span = text[start:end]
            words[t] = any(c.isalnum() for c in span)
            content[t] = words[t] and span.lower() not in stop
            own[t] = words[t] and start < reply
            plain[t] = words[t] and span.lower() not in WH
        masks = {"all": np.ones(n, bool), "words": words, "content": content if content.any() else words, "own": own}
        return masks | {"no wh": plain if plain.any() else words}  # the query's words but its wh-words, auxiliaries

    def maxsim(self, query: str, doc: str, mask: str, kept: Kept | None = None) -> float:
        """MaxSim of ``query`` against ``doc`` under ``mask``, the doc's states as ``kept`` stores them
        (``stored_states``; float32, all of them, if None)."""
        q, d = self.memo[(query, True)], self.memo[(doc, False)]
        qv = q["vecs"][q[mask]]
        dv = d["vecs"][d[mask]] if kept is None else kept(d, mask)
        if not len(qv) or not len(dv):
            return 0.0
        return float((qv @ dv.T).max(axis=1).mean())


def turn_texts(reader: Any, user: str) -> dict[str, dict[str, str]]:
    """Each turn's text by form: its keyword document, and with the turn it answers (as its vector is made)."""
    turns = user_turns(reader, user)
    episodes = [list(run) for _, run in groupby(turns, key=lambda c: c.episode_id)]
    replied: dict[str, str] = {}
    for before, chunks in zip([[], *episodes[:-1]], episodes, strict=True):
        replied.update(zip([c.id for c in chunks], stored_texts(chunks, before, "other_turn"), strict=True))
    return {"turn": {c.id: c.indexed_text for c in turns}, "+reply": replied}


def named(mask: str, form: str, cos: float, w: float) -> str:
    return f"MaxSim {mask}, {form}: cos {cos} + w {w}"


def parsed(name: str) -> tuple[str, str]:
    """A variant's mask and form from its row name (``named``)."""
    head, _ = name.removeprefix("MaxSim ").split(":", 1)
    mask, form = head.split(", ")
    return mask, form


def text_of(item: RecallItem, texts: dict[str, str]) -> str:
    return texts.get(item.id, item.statement)


def reordered(
    pool: Pool, sims: dict[str, float], cos: float, w: float, depth: int = DEFAULT_RECIPE.rerank_depth
) -> list[RecallItem]:
    """The pool in recall's order with its top ``depth`` (40) re-scored by ``cos`` x cosine and ``w`` x MaxSim,
    each min-max normalized over them (module doc); ``cos`` 1.5, ``w`` 0 is recall's own step."""
    rows = sorted(pool.items, key=lambda i: (-i.score, i.id))
    top = rows[:depth]
    cosines = normalized([max(0.0, as_recalled(i)) for i in top], cut=True)
    late = normalized([sims[i.id] for i in top], cut=True)
    lifted = [(i.score + cos * c + w * m, i.id, i) for i, c, m in zip(top, cosines, late, strict=True)]
    lifted.sort(key=lambda r: (-r[0], r[1]))
    return [r[2] for r in lifted] + rows[depth:]


def variants(reader: Any, asked: list[Asked], pooled: list[Pool], states: TokenStates, only: str | None = None) -> Rows:
    """Every mask x form x mix over the pools (or ``only`` the variant of that name)."""
    texts = {u: turn_texts(reader, u) for u in {q.user for q in asked}}
    rows: Rows = {}
    for form in FORMS:
        if only is not None and parsed(only)[1] != form:
            continue
        docs = {text_of(i, texts[q.user][form]) for q, p in zip(asked, pooled, strict=True) for i in p.items[:40]}
        states.encode(sorted(docs))
        states.encode([q.text for q in asked], query=True)
        for mask in MASKS:
            if only is not None and parsed(only)[0] != mask:
                continue
            sims = [
                {i.id: states.maxsim(q.text, text_of(i, texts[q.user][form]), mask) for i in p.items[:40]}
                for q, p in zip(asked, pooled, strict=True)
            ]
            for cos, w in MIXES[1:]:
                name = named(mask, form, cos, w)
                if only is None or name == only:
                    outs = [
                        outcome(reader, q, reordered(p, s, cos, w)) for q, p, s in zip(asked, pooled, sims, strict=True)
                    ]
                    rows[name] = by_split(asked, outs)
    return rows


def cost(
    reader: Any, asked: list[Asked], pooled: list[Pool], n: int, states: TokenStates, form: str, mask: str
) -> None:
    """The query-time price (module doc) of the variant reading turns in ``form`` with ``mask``, and what
    stored token states would take per turn."""
    med = statistics.median
    floor, recall_ms, encode40, late = [], [], [], []
    texts = {u: turn_texts(reader, u)[form] for u in {q.user for q in asked}}
    step = max(1, len(asked) // n)
    for q, p in list(zip(asked, pooled, strict=True))[::step][:n]:
        index = reader.keeper.current(q.user, reader.graph.user_stamp(q.user))
        docs = [text_of(i, texts[q.user]) for i in p.items[:40]]
        t = time.process_time()
        index.search(reader.embedder.encode([q.text])[0], 30)
        floor.append((time.process_time() - t) * 1e3)
        reader.embedder.clear()  # the pools recalled it: its embedding must be paid again, as a new query's is
        t = time.process_time()
        reader.recall(q.user, q.text, k=10)
        reader.flush()
        recall_ms.append((time.process_time() - t) * 1e3)
        t = time.process_time()
        reader.embedder.encode(docs)
        encode40.append((time.process_time() - t) * 1e3)
        states.encode([q.text], query=True)
        states.encode(docs)
        t = time.process_time()
        for d in docs:
            states.maxsim(q.text, d, mask)
        late.append((time.process_time() - t) * 1e3)
    f, r, e, m = med(floor), med(recall_ms), med(encode40), med(late)
    print(
        f"\ncost, {len(floor)} dev questions, load {os.getloadavg()[0]:.1f}, backend {reader.embedder.backend}: "
        f"floor {f:.2f} ms, recall {r:.2f} ms ({r / f:.2f}x), encoding the top 40 {e:.2f} ms, MaxSim over them "
        f"{m:.2f} ms: recall with it {(r + e + m) / f:.2f}x its floor"
    )
    tokens: dict[str, list[int]] = defaultdict(list)
    for user in {q.user for q in asked}:
        for form, by_id in turn_texts(reader, user).items():
            tokens[form].extend(len(states.tokenizer(t)["input_ids"]) for t in by_id.values())
    for form, counts in tokens.items():
        mean_tokens = float(np.mean(counts))
        print(
            f"stored token states, {form}: {len(counts)} turns, {mean_tokens:.1f} tokens a turn (p90 "
            f"{np.percentile(counts, 90):.0f}): {mean_tokens * 384 * 4:.0f} B float32, {mean_tokens * 384 * 2:.0f} B "
            f"float16, {mean_tokens * 384:.0f} B int8 a turn (its sentence vector: 1,536 B float32)"
        )


DIM = 384  # MiniLM's hidden size
PRUNED = (8, 16, 32)  # --stored: at most this many tokens kept a turn


def int8(v: np.ndarray) -> np.ndarray:
    """``v`` as int8 with a scale per token (its largest magnitude / 127), read back as float32."""
    scale = np.abs(v).max(axis=1, keepdims=True) / 127.0
    return (np.round(v / np.maximum(scale, 1e-12)) * scale).astype(np.float32)


def idfs(texts: Sequence[str], tokenizer: Any) -> dict[int, float]:
    """Each word piece's idf over ``texts`` (a user's turns: what a store could count at ingest)."""
    df: dict[int, int] = defaultdict(int)
    for text in texts:
        for piece in set(tokenizer(text, truncation=True, max_length=256)["input_ids"]):
            df[piece] += 1
    return {piece: float(np.log((len(texts) + 1) / (n + 1))) for piece, n in df.items()}


def stored_forms(idf: dict[int, float]) -> dict[str, Kept]:
    """The ways a store could keep a doc's states (``--stored``), by name: each takes the doc's memo entry and
    mask and returns the states MaxSim reads. A pruned form keeps the ``n`` masked tokens of highest idf (of
    their word piece over the user's turns; unseen pieces rarest) or of highest hidden-state norm (before the
    normalizing), in int8. ``sign`` keeps 1 bit a dimension (MaxSim against the float query)."""

    def pruned(n: int, by: str) -> Kept:
        def kept(d: dict[str, np.ndarray], mask: str) -> np.ndarray:
            at = np.flatnonzero(d[mask])
            weight = d["norms"][at] if by == "norm" else np.array([idf.get(int(p), 99.0) for p in d["ids"][at]])
            return int8(d["vecs"][np.sort(at[np.argsort(-weight, kind="stable")[:n]])])

        return kept

    return {
        "float32": lambda d, m: d["vecs"][d[m]],
        "float16": lambda d, m: d["vecs"][d[m]].astype(np.float16).astype(np.float32),
        "int8": lambda d, m: int8(d["vecs"][d[m]]),
        **{f"int8, {n} by {by}": pruned(n, by) for by in ("idf", "norm") for n in PRUNED},
        "sign": lambda d, m: np.where(d["vecs"][d[m]] >= 0, 1.0, -1.0).astype(np.float32),
    }


def token_bytes(name: str) -> float:
    """Bytes a stored token takes in form ``name`` (int8's scale a float16; ``sign`` 1 bit a dimension)."""
    return {"float32": DIM * 4, "float16": DIM * 2, "sign": DIM / 8}.get(name, DIM + 2)


def rescored(pool: Pool, coarse: dict[str, float], fine: dict[str, float], w: float, top: int) -> list[RecallItem]:
    """The pool ordered by the coarse MaxSim (``cos`` 0), then its first ``top`` ordered again by their fine
    MaxSim (min-max normalized over those ``top``): float states fetched for ``top`` rows only."""
    rows = reordered(pool, coarse, 0.0, w)
    head = rows[:top]
    late = normalized([fine[i.id] for i in head], cut=True)
    again = sorted(zip(head, late, strict=True), key=lambda r: (-(r[0].score + w * r[1]), r[0].id))
    return [i for i, _ in again] + rows[top:]


def stored(reader: Any, asked: list[Asked], pooled: list[Pool], states: TokenStates, w: float) -> Rows:
    """Dev's choice (``words``) and the per-turn ``own`` mask, "+reply", ``cos`` 0, weight ``w``, with the
    candidates' states kept in each ``stored_forms`` form (the query's in float32), and ``sign`` with its top
    10 / 20 re-scored in float32; prints the bytes a turn takes in each."""
    texts = {u: turn_texts(reader, u)["+reply"] for u in {q.user for q in asked}}
    docs = {text_of(i, texts[q.user]) for q, p in zip(asked, pooled, strict=True) for i in p.items[:40]}
    states.encode(sorted(docs))
    states.encode([q.text for q in asked], query=True)
    forms = {u: stored_forms(idfs(list(t.values()), states.tokenizer)) for u, t in texts.items()}
    rows: Rows = {}
    for mask in ("words", "own"):
        sims: dict[str, list[dict[str, float]]] = {
            name: [
                {
                    i.id: states.maxsim(q.text, text_of(i, texts[q.user]), mask, forms[q.user][name])
                    for i in p.items[:40]
                }
                for q, p in zip(asked, pooled, strict=True)
            ]
            for name in forms[asked[0].user]
        }
        for name, s in sims.items():
            outs = [outcome(reader, q, reordered(p, si, 0.0, w)) for q, p, si in zip(asked, pooled, s, strict=True)]
            rows[f"{mask}: {name}"] = by_split(asked, outs)
        for top in (10, 20):
            outs = [
                outcome(reader, q, rescored(p, c, f, w, top))
                for q, p, c, f in zip(asked, pooled, sims["sign"], sims["float32"], strict=True)
            ]
            rows[f"{mask}: sign, float32 top {top}"] = by_split(asked, outs)
    kept: dict[str, list[int]] = defaultdict(list)
    for by_id in texts.values():
        for text in by_id.values():
            enc = states.tokenizer([text], truncation=True, max_length=256)
            n = len(enc["input_ids"][0])
            for mask, keep in states._masks(enc, 0, n, text, False).items():
                kept[mask].append(int(keep.sum()))
    for mask in ("words", "own"):
        counts = np.array(kept[mask])
        print(
            f"\n{mask}, +reply: {len(counts)} turns, {counts.mean():.1f} tokens kept a turn (p90 "
            f"{np.percentile(counts, 90):.0f})"
        )
        for name in forms[asked[0].user]:
            n = next((k for k in PRUNED if name.startswith(f"int8, {k} ")), None)
            mean = np.minimum(counts, n).mean() if n else counts.mean()
            print(f"  {name}: {mean * token_bytes(name):,.0f} B a turn ({mean:.1f} tokens)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="the data folder of an ingested SQLite store")
    parser.add_argument("--dev", required=True, help="conversation=user id, comma-separated (variants chosen here)")
    parser.add_argument("--held", default="", help="conversation=user id, comma-separated (scored with --choice)")
    parser.add_argument("--choice", default="", help="the dev choice's row name, the only variant --held scores")
    parser.add_argument("--cost", type=int, default=0, help="time the price on this many dev questions (of --choice)")
    parser.add_argument("--stored", action="store_true", help="dev's choice with its states compressed (dev only)")
    parser.add_argument("--further", action="store_true", help="the signs `own` step's variants (dev only)")
    parser.add_argument("--datasets", type=Path, default=Path("/work/shared/datasets"))
    args = parser.parse_args()
    if args.held and not args.choice:
        parser.error("--held is scored with the dev choice only: give --choice")
    if args.held and (args.stored or args.further):
        parser.error("--stored and --further are measured on --dev only")
    splits, client, asked = opened(args)
    reader = client.reader
    try:
        pooled = pools(reader, asked)
        states = TokenStates(reader.embedder.model_name)
        if args.stored:
            dev = [(q, p) for q, p in zip(asked, pooled, strict=True) if q.split == "dev"]
            asked, pooled = [q for q, _ in dev], [p for _, p in dev]
            mine = [outcome(reader, q, p.ordered(as_recalled)) for q, p in zip(asked, pooled, strict=True)]
            show({"recall": by_split(asked, mine)} | stored(reader, asked, pooled, states, 4.5), asked, splits)
            return
        if args.cost:
            dev = [(q, p) for q, p in zip(asked, pooled, strict=True) if q.split == "dev"]
            mask, form = parsed(args.choice or named("words", "+reply", 0.0, 4.5))
            cost(reader, [q for q, _ in dev], [p for _, p in dev], args.cost, states, form, mask)
            return
        rows: Rows = {
            "recall": by_split(
                asked, [outcome(reader, q, p.ordered(as_recalled)) for q, p in zip(asked, pooled, strict=True)]
            ),
            "keyword only": by_split(asked, recalled(reader, asked, DEFAULT_RECIPE.with_channels("keyword"))),
        }
        if args.further:  # dev only (refused with --held above)
            from maxsim_further import further

            rows |= further(reader, asked, pooled, states)
        else:
            rows |= variants(reader, asked, pooled, states, args.choice or None)
        show(rows, asked, splits)
    finally:
        client.close()


if __name__ == "__main__":
    main()
