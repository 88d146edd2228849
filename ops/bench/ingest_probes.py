"""In-process probes of ingest's parts for the ingest benchmark: where an apply's time goes, store call by
store call, and what the LLM circuit breaker costs concurrent calls.

The apply stage runs in the benchmark process on messages left ready to apply as the producer and the
extract stage would leave them (``ready_to_apply``: no task is published, so running workers never see
them), with its stores wrapped by ``_Timed``, which only times: every call reaches the real Neo4j,
Redis, FAISS file or model. The first applies (model load, driver warm-up) are not counted.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchlib import BenchContext, Table, process_cpu_seconds
from corpus import messages


class _Timed:
    """Forwards to ``target`` and adds each method call's seconds to ``totals[label.method]``, and the
    Neo4j server's CPU seconds over the call to ``server[label.method]`` when ``server_pid`` is given.

    Wraps our own stores in the benchmark process to see where an apply's time goes; it changes nothing
    they do (no mock: every call reaches the real Neo4j, Redis, FAISS file or model). The server's CPU is
    read from /proc in clock ticks (10 ms), so only sums over many calls mean anything; work the server
    does after a call returns (a commit's index refresh, GC) falls to the next call or to none.
    """

    def __init__(
        self,
        target: Any,
        label: str,
        totals: defaultdict[str, float],
        server: defaultdict[str, float] | None = None,
        server_pid: int | None = None,
    ) -> None:
        self._target, self._label, self._totals = target, label, totals
        self._server, self._server_pid = server, server_pid

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        pid, server = self._server_pid, self._server

        def timed(*args: Any, **kwargs: Any) -> Any:
            before = process_cpu_seconds(pid) if pid and server is not None else 0.0
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._totals[f"{self._label}.{name}"] += time.perf_counter() - start
                if pid and server is not None:
                    server[f"{self._label}.{name}"] += process_cpu_seconds(pid) - before

        return timed


def ready_to_apply(stack: Any, extractor: Any, uid: str, message: Any) -> str:
    """Leave ``message`` (a ``corpus.Message``) in Redis as the producer and the extract stage would: the
    payload, and the extraction with what the slim-context lookup of ``extractor`` (a ``WorkerResources``)
    encoded, filed as ready to apply. No task is published, so running workers never see it. Returns its id."""
    from engram_api import keys
    from engram_api.models import Extraction, MessageState, Usage
    from engram_api.producer import build_envelope
    from engram_workers.stages.common import set_state
    from engram_workers.stages.extract import read_prompt_inputs
    from engram_workers.stages.handover import HandOver

    env = build_envelope(stack.settings, uid, message.text, message_id=f"m{message.index}", timestamp=message.timestamp)
    vectors = read_prompt_inputs(extractor, env).vectors
    handed = HandOver.carrying(Extraction.model_validate(message.extraction), Usage(), extractor.embedder, vectors)
    stack.client.redis.set(keys.message_payload(uid, env.message_id), env.model_dump_json())
    set_state(
        extractor, uid, env.message_id, MessageState.EXTRACTED, extraction=handed.model_dump_json(),
        event_time=env.timestamp.timestamp(),
    )  # fmt: skip
    return env.message_id


def _apply_breakdown(ctx: BenchContext, stack: Any, n: int) -> tuple[Table, dict[str, float]]:
    """Run the apply stage in this process on ``n`` prepared messages and split its time by store call.
    Each hand-over carries what the extract stage's slim-context lookup would (done by an untimed
    extract-side context), so apply encodes what it would in the fleet."""
    from engram_workers.resources import WorkerResources
    from engram_workers.stages.apply import run_apply

    totals: defaultdict[str, float] = defaultdict(float)
    server: defaultdict[str, float] = defaultdict(float)
    pid = ctx.services.server_pids().get("neo4j") if stack.settings.neo4j_uri else None
    extractor = WorkerResources(settings=stack.settings)
    wctx = WorkerResources(settings=stack.settings)
    wctx.__dict__["graph"] = _Timed(wctx.graph, "neo4j", totals, server, pid)
    wctx.__dict__["embedder"] = _Timed(wctx.embedder, "embedder", totals)
    wctx.__dict__["redis"] = _Timed(wctx.redis, "redis", totals)
    wctx.keeper.vectors = _Timed(wctx.keeper.vectors, "faiss_file", totals)
    uid = ctx.uid("breakdown")
    wall = 0.0
    warm = 3  # the first applies load the model and warm the driver: not what a message costs
    for m in messages("breakdown", n + warm):
        if m.index == warm:
            totals.clear()
            server.clear()
            wall = 0.0
        mid = ready_to_apply(stack, extractor, uid, m)
        start = time.perf_counter()
        run_apply(wctx, uid, mid)
        wall += time.perf_counter() - start
    wctx.close()
    extractor.close()
    table = Table(
        f"apply stage in-process, {n} messages of one user: where the time goes (ms per message)",
        ["call", "ms / message", "share", "Neo4j server CPU ms / message"],
    )

    def server_ms(name: str) -> object:
        return server[name] / n * 1e3 if pid and name.startswith("neo4j.") else "-"

    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        table.add(name, seconds / n * 1e3, f"{seconds / wall:.0%}", server_ms(name))
    rest = wall - sum(totals.values())
    table.add("everything else (consolidation logic, pydantic, locks)", rest / n * 1e3, f"{rest / wall:.0%}", "-")
    table.add("total", wall / n * 1e3, "100%", sum(server.values()) / n * 1e3 if pid else "-")
    figures = {name: seconds / n * 1e3 for name, seconds in totals.items()} | {"total": wall / n * 1e3}
    if pid:
        figures |= {f"server.{name}": seconds / n * 1e3 for name, seconds in server.items()}
    return table, figures


def _breaker_probe(ctx: BenchContext, threads: int, call_s: float) -> tuple[Table, dict[str, float]]:
    """Wall time of ``threads`` concurrent calls through LLMBreaker vs the same calls without it: the
    extract worker's threads all go through one breaker per process."""
    from engram_api.connections import redis_client
    from engram_api.settings import Settings
    from engram_workers.control.breaker import LLMBreaker

    client = redis_client(ctx.services.redis_url, Settings())
    breaker = LLMBreaker(redis=client, fail_max=1000, reset_timeout=30, is_failure=lambda exc: True)

    def wall(call: Callable[[], object]) -> float:
        workers = [threading.Thread(target=call) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - start

    bare = wall(lambda: time.sleep(call_s))
    wrapped = wall(lambda: breaker.call(lambda: time.sleep(call_s)))
    table = Table(
        f"LLM circuit breaker: {threads} threads each making one {call_s:g} s call",
        ["path", "wall s", "calls in flight (effective)"],
    )
    table.add("direct", bare, threads * call_s / bare)
    table.add("through LLMBreaker.call", wrapped, threads * call_s / wrapped)
    return table, {"direct_s": bare, "breaker_s": wrapped}
