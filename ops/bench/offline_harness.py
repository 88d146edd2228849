"""What the offline query measurements share (``query_offline.py``, ``pool_offline.py``): the questions of
a kept quality store, each recalled by the reader itself, scored as the quality bench scores it.

A question's outcome is R@10 and MRR of its first 10 items (``quality_locomo._scores``) and the share of its
evidence ``get_context`` shows at 1,000 tokens, chosen from the recall's 40 items as ``Reader.context_items``
chooses (a recall of 10 is the first 10 of one of 40: the similarity step's depth does not depend on k).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from quality_locomo import CATEGORIES, CONTEXT_TOKENS, _scores, kept_store

from engram_api.models import RecallItem
from engram_api.reader.context import select_context
from engram_api.reader.recipe import RecallRecipe

DEPTH = 40  # Reader.context_items' candidates
WH = frozenset({  # a question's wh-words and auxiliaries: what a turn does not say
    "what", "when", "where", "who", "whom", "whose", "which", "why", "how", "did", "does", "do", "is", "are",
    "was", "were", "has", "have", "had", "can", "could", "would", "will", "should", "shall", "may", "might",
    "must", "am", "be", "been", "being", "kind", "sort", "type"
})  # fmt: skip
WORD = re.compile(r"[A-Za-z0-9']+")
NAME = re.compile(r"(?<!^)(?<![.?!] )\b([A-Z][a-z]+(?:\s+[A-Z][a-z]+)*)")


ASKING: dict[str, str] = {}  # the user of the recall running (the keyword channel's stand-in needs it)


@dataclass
class Asked:
    user: str
    split: str
    category: str
    text: str
    evidence: set[str]


Outcome = tuple[float, float, float]  # R@10, MRR, get_context evidence
Outcomes = list[Outcome]
Rows = dict[str, dict[str, Outcomes]]  # method -> split -> one outcome a question


def questions(data: list[dict[str, Any]], splits: dict[str, dict[str, str]]) -> list[Asked]:
    out = []
    for split, users in splits.items():
        for conv in (c for c in data if c["sample_id"] in users):
            for qa in conv["qa"]:
                evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
                if evidence:
                    user, cat = users[conv["sample_id"]], CATEGORIES[qa["category"]]
                    out.append(Asked(user, split, cat, str(qa["question"]), evidence))
    return out


def opened(args: Any) -> tuple[dict[str, dict[str, str]], Any, list[Asked]]:
    """From a script's ``--dev``, ``--held``, ``--data-dir`` and ``--datasets``: the splits (split ->
    conversation -> user id), a client reading the kept store with its reader's result cache off (every
    question recalled afresh, whatever an earlier variant asked), and the questions; the caller closes it."""
    splits = {
        split: dict(p.split("=", 1) for p in users.split(","))
        for split, users in (("dev", args.dev), ("held aside", args.held))
        if users
    }
    args.users = ",".join(p for p in (args.dev, args.held) if p)
    _, data, client = kept_store(args)
    client.reader.cache.holds = lambda key: False
    client.reader.cache.get = lambda key, version: None
    return splits, client, questions(data, splits)


def user_turns(reader: Any, user: str) -> list[Any]:
    """The user's episode chunks (the turns), in conversation order."""
    index = reader.keeper.current(user, reader.graph.user_stamp(user))
    chunks = reader.graph.get_chunks(user, sorted(index.node_ids("episode")))
    return sorted(chunks, key=lambda c: c.conversation_order)


def outcome(reader: Any, q: Asked, items: Sequence[RecallItem]) -> Outcome:
    """R@10 and MRR of the first 10 items, and the evidence ``get_context`` shows choosing from them all."""
    _, r10, mrr, _ = _scores([set(i.source_ids) for i in items[:10]], [], q.evidence, "")
    chosen = select_context(items, CONTEXT_TOKENS, replaced=reader._replaced_excerpts(q.user, items))
    shown = {s for i in chosen for s in i.source_ids}
    return r10, mrr, len(shown & q.evidence) / len(q.evidence)


def recall(reader: Any, q: Asked, recipe: RecallRecipe, k: int = DEPTH) -> list[RecallItem]:
    ASKING["user"] = q.user
    return reader.recall(q.user, q.text, k=k, recipe=recipe).items


def recalled(reader: Any, asked: Sequence[Asked], recipe: RecallRecipe) -> Outcomes:
    return [outcome(reader, q, recall(reader, q, recipe)) for q in asked]


def by_split(asked: Sequence[Asked], outs: Outcomes) -> dict[str, Outcomes]:
    by: dict[str, Outcomes] = defaultdict(list)
    for q, o in zip(asked, outs, strict=True):
        by[q.split].append(o)
    return dict(by)


def mean(outs: Sequence[Outcome], i: int) -> float:
    return float(np.mean([o[i] for o in outs]))


def table(rows: Rows, asked: Sequence[Asked], split: str) -> None:
    at = [n for n, q in enumerate(asked) if q.split == split]
    cats = ["all", *sorted({asked[n].category for n in at})]
    print(f"\n{split}: {len(at)} questions")
    print("| method | " + " | ".join(f"{c} R@10 / MRR" for c in cats) + " | get_context |")
    print("|---|" + "---|" * (len(cats) + 1))
    for name, splits in rows.items():
        got = splits.get(split)
        if got is None:
            continue
        cells = []
        for cat in cats:
            mine = [got[i] for i, n in enumerate(at) if cat == "all" or asked[n].category == cat]
            cells.append(f"{mean(mine, 0):.3f} / {mean(mine, 1):.3f}")
        print(f"| {name} | " + " | ".join(cells) + f" | {mean(got, 2):.3f} |", flush=True)


def show(rows: Rows, asked: Sequence[Asked], splits: dict[str, dict[str, str]]) -> None:
    for split in splits:
        table(rows, asked, split)
