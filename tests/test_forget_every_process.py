"""Forgotten means gone from every process: a fact forgotten through one process leaves the encoder cache of
another, an apply worker that encoded its statement, within that worker's erasure sweep
(``engram_api.storage.faiss.erasure``, ``TextSweep``; docs/operations.md, "A reader's memory of an erased
user"). On both stores, with a real Redis.

The worker is a process of its own: its resources are a worker's (``WorkerResources``: its encoder, its index
keeper, whose first use starts its erasure sweep on its own timer), and it applies messages as the apply stage
does (``apply_message``), so its encoder cache holds their names and statements under the user. The test
process is the other host: its ``MemoryClient`` forgets the fact; it then asks the worker, over a pipe, which
texts its encoder cache holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_workers.services.celery_worker import _same_code_env
from tests.support.operator_processes import wait_until
from tests.support.stack import SOURCE_ROOT, Stack, engram_stack

SWEEP_S = 0.2  # the worker's ENGRAM_INDEX_SWEEP_INTERVAL_S: the documented step

WORKER = """
import json, sys
from datetime import datetime
from engram_api.producer import build_envelope
from engram_api.settings import load_settings
from engram_workers.extraction.rules import extract_rules
from engram_workers.middleware import Hooks
from engram_workers.resources import WorkerResources
from tests.support.memory import apply_message

ctx = WorkerResources(settings=load_settings())
ctx.keeper  # a worker's first task opens it, which starts the process's erasure sweep
print("@@ready", flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    if ask["op"] == "apply":
        when = datetime.fromisoformat(ask["when"])
        envelope = build_envelope(ctx.settings, ask["user"], ask["text"], message_id=ask["message"], timestamp=when)
        apply_message(ctx.writes, ctx.graph, ctx.embedder, Hooks(()), envelope, extract_rules(ask["text"], event_time=when))
        reply = True
    else:
        reply = {"texts": sorted(ctx.embedder._recent), "sweeps": ctx.sweeper.sweeps}
    print("@@" + json.dumps(reply), flush=True)
ctx.close()
"""


class Worker:
    """The apply worker's process (see the module docstring), answering one request a line."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], env=_same_code_env(env), cwd=SOURCE_ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        )  # fmt: skip
        assert self._reply() == "ready", f"the worker did not start: see {log}"

    def _reply(self) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return line[2:].strip()
        raise AssertionError(f"the worker ended (exit {self.proc.wait()})")

    def ask(self, **request: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._reply())

    def cached(self) -> set[str]:
        return set(self.ask(op="cached")["texts"])

    def sweeps(self) -> int:
        return int(self.ask(op="cached")["sweeps"])

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(params=["sqlite", "neo4j"])
def stack(request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    data_dir = tmp_path_factory.mktemp(f"forget-every-{request.param}")
    with engram_stack(redis_url=redis_url, data_dir=data_dir, neo4j_uri=neo4j_uri, llm_url=None, workers=False) as s:
        yield s


@pytest.fixture
def worker(stack: Stack, tmp_path: Path) -> Iterator[Worker]:
    env = {**stack.env, "ENGRAM_INDEX_SWEEP_INTERVAL_S": str(SWEEP_S)}
    if stack.env["NEO4J_URI"]:  # another host: its own data directory (SQLite's graph is a file of the stack's)
        env["ENGRAM_DATA_DIR"] = str(tmp_path / "worker-host")
    w = Worker(env, tmp_path / "worker.log")
    yield w
    w.stop()


def test_a_fact_forgotten_through_one_process_leaves_another_workers_encoder_cache_at_its_sweep(
    stack: Stack, worker: Worker
) -> None:
    user, other = (f"{who}_{uuid.uuid4().hex[:10]}" for who in ("f", "o"))
    for who, n, text in ((user, 0, "I live in Tampa."), (user, 1, "I like hiking."), (other, 0, "I live in Denver.")):
        worker.ask(op="apply", user=who, message=f"{who}-m{n}", text=text, when=f"2024-0{4 + n}-01T09:00:00+00:00")
    forgotten, kept = "User lives in Tampa", "User lives in Denver"
    assert {forgotten, kept} <= worker.cached()  # premise: the worker's apply cached both users' statements

    (fact,) = stack.client.history(user, "user", "LIVES_IN")
    assert fact.statement == forgotten
    sweeps = worker.sweeps()
    stack.client.forget(user, fact.id)  # through this process: the worker is not told
    wait_until(lambda: forgotten not in worker.cached(), timeout=60, what="the worker's sweep to drop the statement")
    assert worker.sweeps() > sweeps
    assert kept in worker.cached()  # a user with no forget keeps its texts (and its hits)
