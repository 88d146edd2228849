"""LoCoMo evidence recall: hybrid recall against its own channels and against naive RAG over raw turns.

<datasets>/locomo/locomo_dev5.json (CC BY-NC 4.0, read in place, never copied): every turn is
ingested as one message through the real pipeline with the OFFLINE RULE EXTRACTOR (message id = the
turn's dia_id, event time = the session date plus a second per turn, the speaker's name in the message
metadata). Per question with evidence:
- recall@5 / recall@10: share of its evidence dia_ids among the source ids of the top-k items; MRR: the
  reciprocal rank of the first item citing any evidence (0 when none in the top 10); answer@10: every
  word of the reference answer (``answer_found``) is in what the top 10 items say, which credits an item
  for its content (a fact from an already-cited message still states something) where recall@k counts
  only messages not yet cited;
- methods: hybrid (the default recipe), its channels alone with the rest of the recipe (its links,
  neighbouring turns and query cues): facts only (fact vectors + graph: Engram before episodes), episodes
  only (episode vectors), keyword only (BM25); the bare BM25 ranking (keyword channel, nothing linked, no
  cues); naive RAG (raw turns with the speaker's name, one flat FAISS index, the same MiniLM; the fair
  baseline) and naive RAG over the bare turn text;
- context: evidence recall of ``get_context(question, max_tokens=1000)`` (the turns whose excerpt, or a
  fact extracted from them, made it into the block) against naive RAG's top turns packed into the same
  1,000 tokens as dated lines, and beside it the answer words in the context: the share of questions whose
  reference answer's words (``answer_found``) are all in the block's text, so a rendering that fits more
  turns by cutting what they say shows as a loss there; and the time of ``get_context`` (its recall, whose
  query vector the recalls before have cached, the choice of lines and the text);
- latency: hybrid recall (uncached) against its floor, query embedding + FAISS search of the same index,
  after WARMUP_RECALLS untimed recalls of other conversations' questions against the user (then the
  reader's caches of the user are dropped, so only the store's warmth carries over). The bench starts its
  Neo4j minutes before: a long-running server has compiled its read queries, a fresh JVM has not, and
  its first ~200 recalls ran 1.3-1.6x slower (measured: 3.53x, 2.74x, 2.41x, 2.28x the floor in four
  consecutive runs of 190 recalls against one new server).
Items are at most one message chunk, so methods stay comparable in size.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from benchlib import BenchContext, Table, dist, load_json

from engram_api.reader.context import count_tokens, render_context

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
QUICK_CONVERSATIONS = ("conv-30",)
METHODS = (
    "hybrid",
    "facts only",
    "episodes only",
    "keyword only",
    "BM25 ranking, bare",
    "naive RAG",
    "naive RAG, bare turns",
)
CONTEXT_METHODS = ("get_context", "naive RAG packed")
CONTEXT_TOKENS = 1000
WARMUP_RECALLS = 60  # per conversation, each through every recipe: see the module docstring


_STOP = {"the", "and", "for", "with", "his", "her", "their", "its", "was", "are", "that", "from"}


def answer_found(answer: str, text: str) -> bool:
    """Every answer word of 3+ letters (stop words aside) occurs in ``text``, case-insensitively."""
    words = [w for w in re.findall(r"[a-z0-9]+", answer.lower()) if len(w) > 2 and w not in _STOP]
    lowered = text.lower()
    return bool(words) and all(w in lowered for w in words)


def session_turns(conversation: dict[str, Any]) -> list[tuple[str, str, str, datetime]]:
    """(dia_id, speaker, text, event time) of every turn, sessions in order, a second apart."""
    out = []
    n = 1
    while f"session_{n}" in conversation:
        when = datetime.strptime(conversation[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
        for i, turn in enumerate(conversation[f"session_{n}"]):
            out.append((turn["dia_id"], turn["speaker"], turn["text"], when + timedelta(seconds=i)))
        n += 1
    return out


def _scores(ranked: list[set[str]], said: list[str], evidence: set[str], answer: str) -> tuple[float, ...]:
    """R@5, R@10, MRR and answer@10 (nan for a question without a reference answer)."""

    def at(k: int) -> float:
        found = set().union(*ranked[:k]) if ranked[:k] else set()
        return len(found & evidence) / len(evidence)

    rr = next((1.0 / (i + 1) for i, sources in enumerate(ranked[:10]) if sources & evidence), 0.0)
    words = float(answer_found(answer, "\n".join(said[:10]))) if answer else float("nan")
    return at(5), at(10), rr, words


def _packed(order: list[int], turns: list[tuple[str, str, str, datetime]]) -> tuple[set[str], str]:
    """Naive RAG's turns, best first, as dated lines while they fit in the context budget (counted as
    ``get_context`` counts it, each line with its line break): their ids and text."""
    used, kept, lines = 0, set(), []
    for j in order:
        dia, speaker, text, when = turns[j]
        line = f"- [{when.date().isoformat()}] {speaker}: {text}"
        cost = count_tokens(line) + 1
        if used + cost <= CONTEXT_TOKENS:
            kept.add(dia)
            lines.append(line)
            used += cost
    return kept, "\n".join(lines)


def kept_store(args: Any) -> tuple[dict[str, str], list[dict[str, Any]], Any]:
    """What the offline re-scoring scripts read, from their ``--data-dir``, ``--users`` (``conv-26=<user
    id>,...``) and ``--datasets``: each conversation's user id, the LoCoMo data, and a client reading the
    kept SQLite store (no Redis: the embedded store's reader, its store and FAISS files only; the caller
    closes it)."""
    from engram_api import MemoryClient
    from engram_api.settings import Settings

    users = dict(pair.split("=", 1) for pair in args.users.split(","))
    data = load_json(args.datasets / "locomo" / "locomo_dev5.json")
    return users, data, MemoryClient(settings=Settings(data_dir=str(args.data_dir), redis_url=None))


EARLIER_TURNS = 6  # --llm: the conversation's preceding turns each message carries as context


def ingest_items(
    user: str, owner: str, turns: list[tuple[str, str, str, datetime]], lo: int, llm: bool
) -> list[dict[str, Any]]:
    """enqueue_many items for turns[lo:lo+500]. For an LLM (``engram bench --llm``) each turn names its
    speaker, the first speaker is the memory owner and the preceding turns go along as ``earlier``."""
    if not llm:  # the two turns before go along as ``earlier`` (the extractor ignores it; chunk vectors may not)
        return [
            {
                "user_id": user,
                "messages": text,
                "message_id": dia,
                "timestamp": when,
                "metadata": {"speaker": who},
                "earlier": [{"role": "user", "name": t[1], "content": t[2]} for t in turns[max(0, i - 2) : i]],
            }
            for i, (dia, who, text, when) in enumerate(turns[lo : lo + 500], start=lo)
        ]
    return [
        {
            "user_id": user,
            "messages": [{"role": "user", "name": who, "content": text}],
            "message_id": dia,
            "timestamp": when,
            "metadata": {"speaker": who},
            "owner_name": owner,
            "earlier": [{"role": "user", "name": t[1], "content": t[2]} for t in turns[max(0, i - EARLIER_TURNS) : i]],
        }
        for i, (dia, who, text, when) in enumerate(turns[lo : lo + 500], start=lo)
    ]


def _ingest(ctx: BenchContext, client: Any, user: str, owner: str, turns: list[tuple[str, str, str, datetime]]) -> None:
    receipts = []
    for lo in range(0, len(turns), 500):
        receipts += client.enqueue_many(ingest_items(user, owner, turns, lo, ctx.user_llm))
    client.wait(receipts, timeout=3600)


def _covered(client: Any, user: str) -> set[str]:
    covered: set[str] = set()
    page = 1
    while True:
        got = client.get_graph(user, page=page, page_size=1000)
        covered.update(s for f in got.facts for s in f.source_ids)
        if page * 1000 >= got.total_facts:
            return covered
        page += 1


def extractor(ctx: BenchContext) -> str:
    return "your LLM_MODEL" if ctx.user_llm else "offline rule extractor"


def chosen_conversations(ctx: BenchContext, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``--conversations`` if given (unknown ids are an error naming them), else conv-30 quick, all five full."""
    wanted = ctx.conversations or (QUICK_CONVERSATIONS if ctx.quick else tuple(c["sample_id"] for c in data))
    unknown = sorted(set(wanted) - {c["sample_id"] for c in data})
    if unknown:
        raise ValueError(
            f"--conversations: no LoCoMo conversation {unknown}; the data has {[c['sample_id'] for c in data]}"
        )
    return [c for c in data if c["sample_id"] in wanted]


def run_locomo(ctx: BenchContext, stack: Any) -> tuple[list[Table], dict[str, Any]]:
    import faiss

    data = load_json(ctx.datasets / "locomo" / "locomo_dev5.json")
    convs = chosen_conversations(ctx, data)
    client, reader = stack.client, stack.client.reader
    base = reader.recipe()
    recipes = {
        "hybrid": base,
        "facts only": base.with_channels("fact_vector", "graph"),
        "episodes only": base.with_channels("episode_vector"),
        "keyword only": base.with_channels("keyword"),
        "BM25 ranking, bare": base.with_channels("keyword").model_copy(
            update={
                "window": 0,
                "link_share": 0.0,
                "speaker_boost": 0.0,
                "when_boost": 0.0,
                "period_boost": 0.0,
                "session_boost": 0.0,
            }
        ),
    }
    sums: dict[tuple[str, Any], list[tuple[float, ...]]] = defaultdict(list)
    coverage = {"turns": 0, "turns_with_facts": 0, "questions": 0, "questions_with_covered_evidence": 0}
    recall_ms: dict[str, list[float]] = defaultdict(list)  # per conversation: latency grows with the user
    floor_ms: dict[str, list[float]] = defaultdict(list)
    parts_ms: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # timings_ms, by part
    context_ms: dict[str, list[float]] = defaultdict(list)  # get_context: its recall (query vector cached) and text
    for conv in convs:
        user = ctx.uid(conv["sample_id"])
        turns = session_turns(conv["conversation"])
        ctx.log(f"locomo {conv['sample_id']}: ingesting {len(turns)} turns ({extractor(ctx)})")
        _ingest(ctx, client, user, conv["conversation"]["speaker_a"], turns)
        covered = _covered(client, user)
        coverage["turns"] += len(turns)
        coverage["turns_with_facts"] += len(covered & {t[0] for t in turns})
        ids = [t[0] for t in turns]
        rag = {}
        for name, texts in (
            ("naive RAG", [f"{who}: {text}" for _, who, text, _ in turns]),
            ("naive RAG, bare turns", [text for _, _, text, _ in turns]),
        ):
            vecs = reader.embedder.encode(texts)
            rag[name] = faiss.IndexFlatIP(vecs.shape[1])
            rag[name].add(np.ascontiguousarray(vecs, dtype=np.float32))
        index = reader.keeper.current(user, reader.graph.user_stamp(user))
        _warm_up(reader, user, [c for c in data if c["sample_id"] != conv["sample_id"]], recipes.values())
        ctx.log(f"locomo {conv['sample_id']}: {len(conv['qa'])} questions")
        for qa in conv["qa"]:
            evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
            if not evidence:
                continue
            coverage["questions"] += 1
            coverage["questions_with_covered_evidence"] += bool(evidence & covered)
            q = str(qa["question"])
            # The floor encodes without the embedder's query cache, so the hybrid recall after it (the
            # first recall of this question) pays the same encoding.
            t0 = time.perf_counter()
            qvec = reader.embedder.encode([q])[0]
            index.search(qvec, 10)
            floor_ms[conv["sample_id"]].append((time.perf_counter() - t0) * 1e3)
            ranked: dict[str, list[set[str]]] = {}
            said: dict[str, list[str]] = {}
            for name, recipe in recipes.items():
                t0 = time.perf_counter()
                result = reader.recall(user, q, k=10, recipe=recipe)
                if name == "hybrid":
                    recall_ms[conv["sample_id"]].append((time.perf_counter() - t0) * 1e3)
                    for part, ms in result.timings_ms.items():
                        parts_ms[conv["sample_id"]][part].append(ms)
                ranked[name] = [set(i.source_ids) for i in result.items]
                said[name] = [i.statement for i in result.items]
            orders = {name: rag[name].search(qvec.reshape(1, -1), len(turns))[1][0].tolist() for name in rag}
            for name, order in orders.items():
                ranked[name] = [{ids[j]} for j in order[:10]]
                said[name] = [turns[j][2] for j in order[:10]]
            answer = str(qa.get("answer", ""))
            t0 = time.perf_counter()
            chosen = reader.context_items(user, q, CONTEXT_TOKENS)
            text = render_context(chosen)
            context_ms[conv["sample_id"]].append((time.perf_counter() - t0) * 1e3)
            shown = {s for item in chosen for s in item.source_ids}
            contexts = {"get_context": (shown, text), "naive RAG packed": _packed(orders["naive RAG"], turns)}
            for method, rows in ranked.items():
                score = _scores(rows, said[method], evidence, answer)
                for cat in (qa["category"], "all", *(("covered",) if evidence & covered else ())):
                    sums[(method, cat)].append(score)
            for method, (kept, said_text) in contexts.items():
                words = float(answer_found(answer, said_text)) if answer else float("nan")
                share = (len(kept & evidence) / len(evidence), words)
                for cat in (qa["category"], "all"):
                    sums[(method, cat)].append(share)
    turns_of = {c["sample_id"]: len(session_turns(c["conversation"])) for c in convs}
    tables, summary = _tables(convs, sums, coverage, extractor(ctx))
    tables[-1].rows += _latency_rows(summary, turns_of, recall_ms, floor_ms, parts_ms)
    context_all = dist([x for v in context_ms.values() for x in v])
    summary["latency_ms"]["get_context"] = context_all
    tables[-1].add(
        "get_context p50 / p95 (ms; its query vector cached by the recalls before)",
        f"{context_all['p50']:.1f} / {context_all['p95']:.1f}",
    )
    summary["users"] = [ctx.uid(c["sample_id"]) for c in convs]
    return tables, summary


def _warm_up(reader: Any, user: str, others: list[dict[str, Any]], recipes: Any) -> None:
    """Untimed recalls of other conversations' questions, then the reader's caches of ``user`` dropped.
    Each question is marked, so the query-embedding cache never answers a later conversation's timed
    recall of the same question (those users are measured in this process too)."""
    questions = [f"warm-up: {qa['question']}" for conv in others for qa in conv["qa"]][:WARMUP_RECALLS]
    for q in questions:
        for recipe in recipes:
            reader.recall(user, q, k=10, recipe=recipe)
        reader.context_items(user, q, CONTEXT_TOKENS)
    for cache in (reader.cache, reader.facts, reader.chunks, reader.snapshots):
        cache.drop_user(user)


def _tables(
    convs: list[dict[str, Any]],
    sums: dict[tuple[str, Any], list[tuple[float, ...]]],
    coverage: dict[str, int],
    label: str,
) -> tuple[list[Table], dict[str, Any]]:
    names = ", ".join(c["sample_id"] for c in convs)
    table = Table(
        f"LoCoMo evidence recall ({names}; {label})",
        ["category", "n", "method", "R@5", "R@10", "MRR", "A@10"],
        caption="covered = questions with at least one evidence turn from which the extractor made a fact; "
        "A@10 = the reference answer's words are in what the top 10 items say (questions with an answer)",
    )
    context = Table(
        f"LoCoMo evidence in a {CONTEXT_TOKENS}-token context ({names})",
        ["category", "n", "get_context", "naive RAG packed", "answer words: get_context", "naive RAG packed"],
        caption="share of evidence turns shown (as an excerpt, or as a fact extracted from them); answer words = "
        "share of questions with a reference answer whose words (answer_found) are all in the context's text",
    )
    summary: dict[str, Any] = {"coverage": coverage, "by_category": {}, "context": {}, "context_answer_words": {}}
    labels = {**CATEGORIES, "all": "all", "covered": "covered only"}
    for cat in [*sorted(CATEGORIES), "all", "covered"]:
        for method in METHODS:
            rows = sums.get((method, cat), [])
            if rows:
                means = [float(np.nanmean([r[i] for r in rows])) for i in range(4)]
                summary["by_category"].setdefault(labels[cat], {"n": len(rows)})[method] = means
                table.add(labels[cat], len(rows), method, *means)
        shares = [sums.get((m, cat), []) for m in CONTEXT_METHODS]
        if shares[0]:
            means = [float(np.mean([r[0] for r in rows])) for rows in shares]
            words = [float(np.nanmean([r[1] for r in rows])) for rows in shares]
            summary["context"][labels[cat]] = dict(zip(CONTEXT_METHODS, means, strict=True))
            summary["context_answer_words"][labels[cat]] = dict(zip(CONTEXT_METHODS, words, strict=True))
            context.add(labels[cat], len(shares[0]), *means, *words)
    cov = Table(f"LoCoMo coverage of the {label}, and recall latency", ["measure", "value"])
    cov.add("turns that produced >= 1 fact", f"{coverage['turns_with_facts']} / {coverage['turns']}")
    cov.add(
        "questions with >= 1 evidence turn that produced a fact",
        f"{coverage['questions_with_covered_evidence']} / {coverage['questions']}",
    )
    return [table, context, cov], summary


def _latency_rows(
    summary: dict[str, Any],
    turns_of: dict[str, int],
    recall_ms: dict[str, list[float]],
    floor_ms: dict[str, list[float]],
    parts_ms: dict[str, dict[str, list[float]]],
) -> list[list[Any]]:
    """Hybrid recall (uncached) against its floor, per conversation (a user of that many turns) and over all,
    and the p50 of each part of the recall's ``timings_ms`` per conversation."""
    rows: list[list[Any]] = []
    runs = {f"{conv} ({turns_of[conv]} turns)": (recall_ms[conv], floor_ms[conv]) for conv in turns_of}
    if len(runs) > 1:
        runs["all"] = ([x for v in recall_ms.values() for x in v], [x for v in floor_ms.values() for x in v])
    summary["latency_ms"] = {}
    for name, (recall, floor) in runs.items():
        lat, low = dist(recall), dist(floor)
        summary["latency_ms"][name] = {"hybrid_recall": lat, "floor": low, "ratio_p50": lat["p50"] / low["p50"]}
        rows.append(
            [
                f"{name}: hybrid recall p50 / p95, floor p50 (ms)",
                f"{lat['p50']:.1f} / {lat['p95']:.1f}, {low['p50']:.1f}: {lat['p50'] / low['p50']:.2f}x the floor",
            ]
        )
    summary["latency_parts_p50_ms"] = {}
    for conv, parts in parts_ms.items():
        p50 = {part: float(np.percentile(ms, 50)) for part, ms in parts.items()}
        summary["latency_parts_p50_ms"][conv] = p50
        shown = ", ".join(f"{part} {ms:.1f}" for part, ms in p50.items())
        rows.append([f"{conv} ({turns_of[conv]} turns): hybrid recall parts, p50 of each (ms)", shown])
    return rows
