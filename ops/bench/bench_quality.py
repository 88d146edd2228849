"""Retrieval quality without an LLM judge: LoCoMo evidence recall, and engram-ltm's sample_20 cases.

LoCoMo (see ``quality_locomo``): hybrid recall, each of its channels alone and naive RAG over the raw
turns, per category, plus what a 1,000-token ``get_context`` shows. The rule extractor only extracts
first-person facts, so many turns yield no fact: coverage is reported.

Data sets are read from ``--datasets`` (default ../shared/datasets; ``run.py`` skips this benchmark,
saying where the files go, when they are missing).

sample_20 (<datasets>/engram_ltm_samples/sample_20.json): each case's sessions are ingested, then
``get_context(question)`` must contain the answer and, for knowledge updates, not the superseded value;
once with the offline rule extractor and once with scripted extractions served by the LLM stand-in.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from benchlib import BenchContext, BenchResult, Table, load_json, start_workers
from ltm_script import STALE, extraction_for
from quality_locomo import answer_found, run_locomo

from engram_api.reader.context import EXCERPTS_HEADER

MODES = {"rules": "offline rule extractor", "scripted": "scripted stand-in extractions", "llm": "your LLM_MODEL"}


def _sample20(ctx: BenchContext, stack: Any, mode: str) -> list[dict[str, Any]]:
    cases = load_json(ctx.datasets / "engram_ltm_samples" / "sample_20.json")
    client = stack.client
    t0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    out = []
    for case in cases:
        user = ctx.uid(f"{mode}-{case['id']}")
        # Sessions are a week apart: each is applied before the next is sent, so its extraction sees the
        # earlier sessions' facts as known context (as in a real conversation, not a burst).
        for i, session in enumerate(case["sessions"]):
            receipt = client.enqueue(
                user,
                session["messages"],
                message_id=f"{case['id']}-{session['session_id']}",
                timestamp=t0 + timedelta(days=7 * i),
            )
            client.wait([receipt], timeout=600)
        context = client.get_context(user, case["question"])
        stale = STALE.get(case["id"])
        row = {
            "id": case["id"],
            "type": case["question_type"],
            "mode": MODES[mode],
            "context_lines": sum(line.startswith("- ") for line in context.splitlines()),
            "answer_found": None
            if case["question_type"] == "abstained_response"
            else answer_found(case["answer"], context),
            # The stale value may be in a dated excerpt (what was said then), never among current facts.
            "stale_absent": None
            if stale is None
            else stale.lower() not in context.partition(EXCERPTS_HEADER)[0].lower(),
        }
        row["passed"] = (
            None if row["answer_found"] is None else bool(row["answer_found"] and row["stale_absent"] is not False)
        )
        out.append(row)
    return out


def _sample20_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        "engram-ltm sample_20: get_context(question) contains the answer (and no stale value as a current fact)",
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

    def respond(request: dict[str, Any]) -> Reply:
        text = next((line for line in message_text(request).splitlines() if line in texts), "")
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        return Reply.json(extraction_for(text, prompt))

    return respond


def _cost_table(stack: Any, users: list[str], messages: int) -> tuple[Table, dict[str, float]]:
    """Tokens and calls per message as the user's model billed them (the stand-in is never used here)."""
    usage = [stack.client.stats(u).usage for u in users]
    per = {
        "messages": messages,
        "prompt_tokens_per_message": sum(u.prompt_tokens for u in usage) / max(1, messages),
        "completion_tokens_per_message": sum(u.completion_tokens for u in usage) / max(1, messages),
        "llm_calls_per_message": sum(u.llm_calls for u in usage) / max(1, messages),
        "cost_usd": sum(u.cost_usd for u in usage),
        "dead_lettered": sum(len(stack.client.dead_letters(u)) for u in users),
    }
    table = Table(
        "LLM extraction cost (your LLM_MODEL)",
        ["measure", "value"],
        caption="trivial messages skip the LLM; calls > 1.0 per message = answers that needed the one retry",
    )
    for key, value in per.items():
        table.add(key.replace("_", " "), value)
    return table, per


def _run_llm(ctx: BenchContext) -> BenchResult:
    """``--llm`` (docs/extraction.md): the same data and tables, extracted by the user's own model."""
    summary: dict[str, Any] = {}
    cases = load_json(ctx.datasets / "engram_ltm_samples" / "sample_20.json")
    with ctx.stack("quality-llm", llm=True) as stack:
        start_workers(stack, extract_concurrency=8)
        locomo_tables, summary["locomo"] = run_locomo(ctx, stack)
        ctx.log("sample_20 with your LLM_MODEL")
        rows = _sample20(ctx, stack, "llm")
        users = [*summary["locomo"]["users"], *(ctx.uid(f"llm-{c['id']}") for c in cases)]
        messages = summary["locomo"]["coverage"]["turns"] + sum(len(c["sessions"]) for c in cases)
        cost, summary["llm_cost"] = _cost_table(stack, users, messages)
    summary["sample20"] = rows
    return BenchResult(
        bench="quality",
        summary=summary,
        tables=[*locomo_tables, _sample20_table(rows), cost],
        notes=[
            "extracted by YOUR LLM_MODEL: speaker names, owner = LoCoMo speaker_a, the preceding turns as "
            "context; compare with the offline rows in docs/benchmarks.md",
            "recall@k = share of a question's evidence dia_ids among the source ids of the top-k items; MRR over the top 10",
        ],
    )


def run(ctx: BenchContext) -> BenchResult:
    if ctx.user_llm:
        return _run_llm(ctx)
    summary: dict[str, Any] = {}
    with ctx.stack("quality-rules", llm=False) as stack:
        start_workers(stack, extract_concurrency=4)
        locomo_tables, summary["locomo"] = run_locomo(ctx, stack)
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
            "LoCoMo rows use the OFFLINE RULE EXTRACTOR (no LLM): first-person facts only; every turn is also "
            "kept as an episode, so hybrid recall is not limited by extraction coverage",
            "recall@k = share of a question's evidence dia_ids among the source ids of the top-k items; "
            "MRR over the top 10; naive RAG embeds 'Speaker: text' (Engram's episodes embed that and the other speaker's turn before)",
            "sample_20 'answer found' = every answer word (3+ letters, stop words aside) is in the context; "
            "stale values of the knowledge-update cases are our annotation (ltm_script.STALE)",
            "sample_20 sessions are a week apart, each applied before the next is sent; a scripted answer that "
            "replaces a value names the known fact's handle in `updates`, as the prompt asks a model to",
            "LoCoMo is CC BY-NC 4.0 and read from the datasets directory (--datasets); nothing of it is stored in the repo",
        ],
    )
