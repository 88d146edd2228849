"""The LLM call's own CPU and the extract stage's CPU per message, against baselines in the same run.

Three measurements, all with the LLM stand-in in its own process (its CPU is not counted) and CPU read
as this process's CPU time (``time.process_time``: every thread), so a loaded machine inflates wall
times but hardly CPU:

1. One call after another: a bare OpenAI-compatible POST with httpx (the baseline: the least any client
   can do) against our litellm call (``engram_workers.extraction.llm``), alternating blocks.
2. Many calls in flight (the stand-in answering after a delay): a thread pool calling ``litellm.completion``
   (what the extract worker does) against one event loop with ``litellm.acompletion``, same calls.
3. The extract stage in process (``run_extract`` on a thread pool, real Redis and SQLite, stand-in at 0
   latency) on a user with memory, so the slim context does its real work: CPU per message with the
   query vectors encoded one by one (the baseline) and batched across the threads (``QueryBatcher``),
   and what is left beyond the LLM call of measurement 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from benchlib import BenchContext, BenchResult, Table, ratio

_ANSWER = {
    "entities": [{"ref": "N1", "name": "Lisbon", "label": "Place", "aliases": [], "summary": ""}],
    "facts": [
        {"subject": "user", "predicate": "LIVES_IN", "object": "N1", "statement": "User lives in Lisbon",
         "memory_type": "semantic", "importance": 0.7, "valid_from": None, "updates": None},
        {"subject": "user", "predicate": "LIKES", "object": None, "statement": "User likes long walks",
         "memory_type": "semantic", "importance": 0.5, "valid_from": None, "updates": None},
    ],
    "ends": [],
}  # fmt: skip
_CLIENT_ARGS = (
    "model",
    "api_key",
    "api_base",
    "timeout",
    "num_retries",
    "input_cost_per_token",
    "output_cost_per_token",
)
_TEXTS = [
    "I moved to Lisbon last spring and I walk along the river every evening.",
    "My sister Maya works as a nurse in Porto and visits me twice a year.",
    "I've been learning Portuguese with an app, twenty minutes a day.",
    "We adopted a cat called Rex from the shelter in March.",
    "I started a new job at a robotics startup downtown, mostly Python and C++.",
]


@contextmanager
def _standin(latency_s: float) -> Iterator[str]:
    """The stand-in as its own process, answering every call with ``_ANSWER``; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "engram_testing.llm_standin", "--port", "0", "--latency", str(latency_s),
         "--content", json.dumps(_ANSWER)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _settings(url: str, **extra: Any) -> Any:
    from engram_api.settings import Settings

    return Settings(
        llm_model="openai/standin", llm_api_base=url, llm_api_key="bench-key", llm_rate_per_s=100_000, **extra
    )


def _cpu_ms_per_call(fn: Callable[[], None], calls: int) -> float:
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) * 1e3 / calls


def _one_by_one(ctx: BenchContext, url: str) -> dict[str, float]:
    import httpx
    import litellm

    from engram_workers.extraction.llm import complete, completion_kwargs, response_format
    from engram_workers.extraction.prompt import SYSTEM_PROMPT

    settings = _settings(url)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": _TEXTS[0]}]
    client = httpx.Client(base_url=url, headers={"Authorization": "Bearer bench-key"}, timeout=30)
    # The same request litellm sends (messages, temperature, max_tokens, response_format).
    body = {k: v for k, v in completion_kwargs(settings, messages).items() if k not in _CLIENT_ARGS}

    def bare() -> None:
        response = client.post("/chat/completions", json={**body, "model": "standin"})
        response.raise_for_status()
        json.loads(response.json()["choices"][0]["message"]["content"])

    def ours() -> None:
        json.loads(complete(settings, messages)[0])

    def unpriced() -> None:
        # The call as it was before: no prices given, the response format looked up on every call.
        kwargs = {k: v for k, v in completion_kwargs(settings, messages).items() if not k.endswith("_per_token")}
        kwargs["response_format"] = response_format.__wrapped__(kwargs["model"])
        json.loads(litellm.completion(**kwargs).choices[0].message.content)

    calls = {"bare": bare, "unpriced": unpriced, "ours": ours}
    for fn in calls.values():
        _cpu_ms_per_call(fn, 5)  # imports, connection pools, litellm's first-call set-up
    block, rounds = 20, ctx.size(8, 40)
    ms: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):  # alternating blocks: machine drift hits all alike
        for name, fn in calls.items():
            ms[name].append(_cpu_ms_per_call(fn, block))
    client.close()
    b, u, o = (sorted(ms[n])[rounds // 2] for n in ("bare", "unpriced", "ours"))
    return {
        "bare_httpx_ms": b, "litellm_before_ms": u, "litellm_ms": o, "ratio": ratio(o, b),
        "ratio_before": ratio(u, b), "calls": 3 * block * rounds,
    }  # fmt: skip


def _in_flight(ctx: BenchContext, url: str, *, in_flight: int, calls: int) -> dict[str, float]:
    import litellm

    from engram_api.errors import LLMError
    from engram_workers.extraction.llm import complete, completion_kwargs
    from engram_workers.extraction.prompt import SYSTEM_PROMPT

    settings = _settings(url)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": _TEXTS[1]}]

    failed = {"thread pool": 0, "event loop": 0}

    def counted(mode: str, results: list[object]) -> None:
        # A call refused on a machine this loaded (a dropped connection) still spent its CPU: count it,
        # say how many there were, and keep measuring.
        failed[mode] += sum(isinstance(r, Exception) for r in results)

    def one_call(_: int) -> object:
        try:
            return complete(settings, messages)
        except LLMError as exc:
            return exc

    def threads(n: int) -> float:
        t = time.process_time()
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            counted("thread pool", list(pool.map(one_call, range(n))))
        return (time.process_time() - t) * 1e3 / n

    def event_loop(n: int) -> float:
        async def all_calls() -> list[object]:
            gate = asyncio.Semaphore(in_flight)

            async def one() -> object:
                async with gate:
                    return await litellm.acompletion(**completion_kwargs(settings, messages))

            return await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)

        t = time.process_time()
        counted("event loop", asyncio.run(all_calls()))
        return (time.process_time() - t) * 1e3 / n

    threads(in_flight)
    event_loop(in_flight)  # warm both
    failed.update({"thread pool": 0, "event loop": 0})
    pool_ms, loop_ms = [], []
    for _ in range(3):
        pool_ms.append(threads(calls))
        loop_ms.append(event_loop(calls))
    p, a = sorted(pool_ms)[1], sorted(loop_ms)[1]
    return {
        "thread_pool_ms": p, "event_loop_ms": a, "ratio": ratio(a, p), "in_flight": in_flight, "calls": calls,
        "failed_thread_pool": failed["thread pool"], "failed_event_loop": failed["event loop"],
    }  # fmt: skip


def _extract_stage(ctx: BenchContext, url: str, *, primed: int, measured: int, threads: int) -> dict[str, Any]:
    """CPU per message of ``run_extract`` on ``threads`` threads (as an extract worker runs it), with the
    slim-context query vectors encoded one by one (``max_batch=1``, the baseline) and batched."""
    from engram_api import MemoryClient
    from engram_api.models import StageOutcome
    from engram_workers.extraction.query_batch import QueryBatcher
    from engram_workers.resources import WorkerResources
    from engram_workers.stages.apply import run_apply
    from engram_workers.stages.extract import run_extract

    settings = _settings(url, redis_url=ctx.services.redis_url, data_dir=ctx.workdir / "llm-extract")
    worker = WorkerResources(settings=settings, dispatch=lambda _task, _args: None)
    client = MemoryClient(settings=settings)
    worker.warm_up()
    user = ctx.uid("llm-extract")
    start = datetime(2026, 1, 5, 9, tzinfo=UTC)
    sent = 0

    def send(n: int) -> list[str]:
        nonlocal sent
        ids = [
            client.enqueue(
                user, f"{_TEXTS[i % len(_TEXTS)]} (note {i})", timestamp=start + timedelta(hours=i)
            ).message_id
            for i in range(sent, sent + n)
        ]
        sent += n
        return ids

    for mid in send(primed):  # a user with memory: the slim context has hits to read
        run_extract(worker, user, mid)
        run_apply(worker, user, mid)
    cpu: dict[str, list[float]] = {"one by one": [], "batched": []}
    batching: list[float] = []
    block = max(1, measured // 3)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in range(3):  # alternating blocks: machine drift hits both alike
            for mode, max_batch in (("one by one", 1), ("batched", 32)):
                worker.queries = QueryBatcher(worker.embedder, max_batch=max_batch)  # type: ignore[misc]
                ids = send(block)
                t = time.process_time()
                outcomes = list(pool.map(lambda mid: run_extract(worker, user, mid), ids))
                cpu[mode].append((time.process_time() - t) * 1e3 / block)
                assert all(o.outcome is StageOutcome.LLM for o in outcomes), [str(o) for o in outcomes[:3]]
                if max_batch > 1:
                    batching.append(worker.queries.texts / max(1, worker.queries.batches))
    client.close()
    worker.close()
    one, batched = sorted(cpu["one by one"])[1], sorted(cpu["batched"])[1]
    return {
        "cpu_ms_one_by_one": one,
        "cpu_ms_batched": batched,
        "ratio": ratio(batched, one),
        "texts_per_encode": sum(batching) / len(batching),
        "messages": 6 * block,
        "threads": threads,
    }


def run(ctx: BenchContext) -> BenchResult:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with _standin(0.0) as url:
        ctx.log("one call after another: bare httpx vs litellm")
        single = _one_by_one(ctx, url)
        ctx.log("extract stage in process")
        stage = _extract_stage(ctx, url, primed=ctx.size(30, 100), measured=ctx.size(96, 480), threads=16)
    with _standin(0.2) as url:
        ctx.log("many calls in flight: thread pool vs event loop")
        flight = _in_flight(ctx, url, in_flight=64, calls=ctx.size(256, 1024))
    beyond = {k: stage[f"cpu_ms_{k}"] - single["litellm_ms"] for k in ("one_by_one", "batched")}

    calls = Table("LLM call, CPU ms per call (median of alternating blocks)", ["client", "CPU ms/call", "ratio"])
    calls.add("bare httpx POST (baseline)", single["bare_httpx_ms"], 1.0)
    calls.add("litellm.completion, as before (no prices, format per call)", single["litellm_before_ms"],
              single["ratio_before"])  # fmt: skip
    calls.add("litellm.completion (ours)", single["litellm_ms"], single["ratio"])
    pool = Table(
        f"{flight['in_flight']} calls in flight, stand-in 0.2 s, CPU ms per call",
        ["client", "CPU ms/call", "ratio", "failed calls"],
    )
    pool.add("thread pool + litellm.completion (baseline)", flight["thread_pool_ms"], 1.0, flight["failed_thread_pool"])
    pool.add("event loop + litellm.acompletion", flight["event_loop_ms"], flight["ratio"], flight["failed_event_loop"])
    extract = Table(
        f"extract stage in process, {stage['threads']} threads, stand-in 0 s, CPU ms per message",
        ["slim-context query vectors", "whole stage", "beyond the LLM call", "ratio"],
    )
    extract.add("one encode per message (baseline)", stage["cpu_ms_one_by_one"], beyond["one_by_one"], 1.0)
    extract.add(
        f"batched ({stage['texts_per_encode']:.1f} texts per encode)", stage["cpu_ms_batched"], beyond["batched"],
        stage["ratio"],
    )  # fmt: skip
    load = os.getloadavg()[0]
    return BenchResult(
        bench="llm",
        summary={
            "single": single,
            "in_flight": flight,
            "extract": {**stage, "cpu_beyond_llm_ms": beyond},
            "loadavg_1min": load,
        },
        tables=[calls, pool, extract],
        notes=[f"load average {load:.2f}: CPU times, not wall times, are the figures to read"],
    )
