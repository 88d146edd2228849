"""Retrieval quality without an LLM judge: LoCoMo evidence recall, and engram-ltm's sample_20 cases.

Data sets are read from ``--datasets`` (default ../shared/datasets; ``run.py`` skips this benchmark,
saying where the files go, when they are missing).

LoCoMo (<datasets>/locomo/locomo_dev5.json, CC BY-NC 4.0, read in place, never copied): every
turn is ingested as one message (message id = the turn's dia_id, event time = the session date) through
the real pipeline with the OFFLINE RULE EXTRACTOR (no LLM). Per question, evidence recall@k is the share
of its evidence dia_ids among the source ids of the top-k recalled items, and MRR the reciprocal rank of
the first item citing any evidence. Compared: Engram recall, vector-only Engram recall
(``graph_expansion=False``) and a naive vector-RAG baseline (raw turns in one FAISS index, same MiniLM).
The rule extractor only extracts first-person facts, so many turns yield nothing: coverage is reported.

sample_20 (<datasets>/engram_ltm_samples/sample_20.json): each case's sessions are ingested, then
``get_context(question)`` must contain the answer and, for knowledge updates, not the superseded value;
once with the offline rule extractor and once with scripted extractions served by the LLM stand-in.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from benchlib import BenchContext, BenchResult, Table, load_json, start_workers
from ltm_script import STALE, extraction_for

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
METHODS = ("engram", "engram vector-only", "naive RAG")
QUICK_CONVERSATIONS = ("conv-30",)
MODES = {"rules": "offline rule extractor", "scripted": "scripted stand-in extractions"}
_STOP = {"the", "and", "for", "with", "his", "her", "their", "its", "was", "are", "that", "from"}


def _session_turns(conversation: dict[str, Any]) -> list[tuple[str, str, datetime]]:
    """(dia_id, text, event time) of every turn, sessions in order, a second apart within a session."""
    out = []
    n = 1
    while f"session_{n}" in conversation:
        when = datetime.strptime(conversation[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
        for i, turn in enumerate(conversation[f"session_{n}"]):
            out.append((turn["dia_id"], turn["text"], when + timedelta(seconds=i)))
        n += 1
    return out


def _scores(ranked: list[set[str]], evidence: set[str]) -> tuple[float, float, float]:
    """recall@5, recall@10, reciprocal rank of the first hit (0 when none in the ranking)."""

    def at(k: int) -> float:
        found = set().union(*ranked[:k]) if ranked[:k] else set()
        return len(found & evidence) / len(evidence)

    rr = next((1.0 / (i + 1) for i, sources in enumerate(ranked) if sources & evidence), 0.0)
    return at(5), at(10), rr


def _locomo(ctx: BenchContext, stack: Any) -> tuple[list[Table], dict[str, Any]]:
    data = load_json(ctx.datasets / "locomo" / "locomo_dev5.json")
    convs = [c for c in data if not ctx.quick or c["sample_id"] in QUICK_CONVERSATIONS]
    client, reader = stack.client, stack.client.reader
    sums: dict[tuple[str, Any], list[tuple[float, float, float]]] = defaultdict(list)
    coverage = {"turns": 0, "turns_with_facts": 0, "questions": 0, "questions_with_covered_evidence": 0}
    for conv in convs:
        user = ctx.uid(conv["sample_id"])
        turns = _session_turns(conv["conversation"])
        ctx.log(f"locomo {conv['sample_id']}: ingesting {len(turns)} turns (rule extractor)")
        receipts = []
        for lo in range(0, len(turns), 500):
            receipts += client.enqueue_many(
                [
                    {"user_id": user, "messages": text, "message_id": dia, "timestamp": when}
                    for dia, text, when in turns[lo : lo + 500]
                ]
            )
        client.wait(receipts, timeout=3600)
        covered: set[str] = set()
        page = 1
        while True:
            got = client.get_graph(user, page=page, page_size=1000)
            covered.update(s for f in got.facts for s in f.source_ids)
            if page * 1000 >= got.total_facts:
                break
            page += 1
        coverage["turns"] += len(turns)
        coverage["turns_with_facts"] += len(covered & {t[0] for t in turns})
        # The baseline: raw turns, one flat inner-product index, the same model.
        import faiss

        vecs = reader.embedder.encode([text for _, text, _ in turns])
        rag = faiss.IndexFlatIP(vecs.shape[1])
        rag.add(np.ascontiguousarray(vecs, dtype=np.float32))
        ctx.log(f"locomo {conv['sample_id']}: {len(conv['qa'])} questions x {len(METHODS)} methods")
        for qa in conv["qa"]:
            evidence = {e.strip() for e in qa.get("evidence", []) if e.strip()}
            if not evidence:
                continue
            coverage["questions"] += 1
            coverage["questions_with_covered_evidence"] += bool(evidence & covered)
            q = str(qa["question"])
            ranked = {
                "engram": [set(i.source_ids) for i in reader.recall(user, q, k=10).items],
                "engram vector-only": [
                    set(i.source_ids) for i in reader.recall(user, q, k=10, graph_expansion=False).items
                ],
                "naive RAG": [{turns[j][0]} for j in rag.search(reader.embedder.encode([q]), 10)[1][0] if j >= 0],
            }
            for method, rows in ranked.items():
                score = _scores(rows, evidence)
                sums[(method, qa["category"])].append(score)
                sums[(method, "all")].append(score)
                if evidence & covered:
                    sums[(method, "covered")].append(score)

    table = Table(
        f"LoCoMo evidence recall ({', '.join(c['sample_id'] for c in convs)}; offline rule extractor)",
        ["category", "n", "method", "R@5", "R@10", "MRR"],
        caption="covered = questions with at least one evidence turn from which the extractor made a fact",
    )
    summary: dict[str, Any] = {"coverage": coverage, "by_category": {}}
    labels = {**CATEGORIES, "all": "all", "covered": "covered only"}
    for cat in [*sorted(CATEGORIES), "all", "covered"]:
        for method in METHODS:
            rows = sums.get((method, cat), [])
            if not rows:
                continue
            means = [float(np.mean([r[i] for r in rows])) for i in range(3)]
            summary["by_category"].setdefault(labels[cat], {"n": len(rows)})[method] = means
            table.add(labels[cat], len(rows), method, *means)
    cov = Table("LoCoMo coverage of the offline rule extractor", ["measure", "value"])
    cov.add("turns that produced >= 1 fact", f"{coverage['turns_with_facts']} / {coverage['turns']}")
    cov.add(
        "questions with >= 1 evidence turn that produced a fact (Engram's ceiling)",
        f"{coverage['questions_with_covered_evidence']} / {coverage['questions']}",
    )
    return [table, cov], summary


def _answer_found(answer: str, context: str) -> bool:
    """Every answer word of 3+ letters (stop words aside) occurs in the context, case-insensitively."""
    words = [w for w in re.findall(r"[a-z0-9]+", answer.lower()) if len(w) > 2 and w not in _STOP]
    text = context.lower()
    return bool(words) and all(w in text for w in words)


def _sample20(ctx: BenchContext, stack: Any, mode: str) -> list[dict[str, Any]]:
    cases = load_json(ctx.datasets / "engram_ltm_samples" / "sample_20.json")
    client = stack.client
    t0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    out = []
    for case in cases:
        user = ctx.uid(f"{mode}-{case['id']}")
        receipts = [
            client.enqueue(
                user,
                session["messages"],
                message_id=f"{case['id']}-{session['session_id']}",
                timestamp=t0 + timedelta(days=7 * i),
            )
            for i, session in enumerate(case["sessions"])
        ]
        client.wait(receipts, timeout=600)
        context = client.get_context(user, case["question"])
        stale = STALE.get(case["id"])
        row = {
            "id": case["id"],
            "type": case["question_type"],
            "mode": MODES[mode],
            "context_lines": max(0, len(context.splitlines()) - 1),
            "answer_found": None
            if case["question_type"] == "abstained_response"
            else _answer_found(case["answer"], context),
            "stale_absent": None if stale is None else stale.lower() not in context.lower(),
        }
        row["passed"] = (
            None if row["answer_found"] is None else bool(row["answer_found"] and row["stale_absent"] is not False)
        )
        out.append(row)
    return out


def _sample20_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        "engram-ltm sample_20: get_context(question) contains the answer (and not the stale value)",
        ["extraction mode", "question type", "cases", "answer found", "stale absent", "passed", "avg lines"],
        caption="abstained_response: no answer exists; without an LLM judge only the context size is reported",
    )
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["mode"], r["type"])].append(r)
    for (mode, qtype), rs in sorted(groups.items()):

        def count(key: str, rs: list[dict[str, Any]] = rs) -> str:
            vals = [r[key] for r in rs if r[key] is not None]
            return f"{sum(vals)}/{len(vals)}" if vals else "n/a"

        table.add(
            mode,
            qtype,
            len(rs),
            count("answer_found"),
            count("stale_absent"),
            count("passed"),
            float(np.mean([r["context_lines"] for r in rs])),
        )
    return table


def _first_turn_responder(cases: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    """The stand-in gets the whole session (user and assistant turns): answer by the user's turn."""
    from engram_testing.llm_standin import Reply
    from tests.support.extractions import message_text

    texts = {m["content"] for c in cases for s in c["sessions"] for m in s["messages"] if m["role"] == "user"}
    return lambda request: Reply.json(
        extraction_for(next((line for line in message_text(request).splitlines() if line in texts), ""))
    )


def run(ctx: BenchContext) -> BenchResult:
    summary: dict[str, Any] = {}
    with ctx.stack("quality-rules", llm=False) as stack:
        start_workers(stack, extract_concurrency=4)
        locomo_tables, summary["locomo"] = _locomo(ctx, stack)
        ctx.log("sample_20 with the offline rule extractor")
        rows = _sample20(ctx, stack, "rules")
    llm = ctx.services.llm
    llm.reset()
    llm.script(_first_turn_responder(load_json(ctx.datasets / "engram_ltm_samples" / "sample_20.json")))
    with ctx.stack("quality-scripted", llm=True) as stack:
        start_workers(stack, extract_concurrency=8)
        ctx.log("sample_20 with scripted stand-in extractions")
        rows += _sample20(ctx, stack, "scripted")
    llm.reset()
    summary["sample20"] = rows
    return BenchResult(
        bench="quality",
        summary=summary,
        tables=[*locomo_tables, _sample20_table(rows)],
        notes=[
            "LoCoMo rows use the OFFLINE RULE EXTRACTOR (no LLM): first-person facts only; the baseline embeds "
            "every raw turn, so it is not limited by extraction coverage",
            "recall@k = share of a question's evidence dia_ids among the source ids of the top-k items; "
            "MRR over the top 10",
            "sample_20 'answer found' = every answer word (3+ letters, stop words aside) is in the context; "
            "stale values of the knowledge-update cases are our annotation (ltm_script.STALE)",
            "LoCoMo is CC BY-NC 4.0 and read from the datasets directory (--datasets); nothing of it is stored in the repo",
        ],
    )
