"""The pipeline's stages run in the test process, one ``WorkerResources`` standing for one worker process
(its own index cache, its own store connections), on real Redis and a real graph store (the ``stack``
fixture: Neo4j, then SQLite); and ``StalledGraph``, a store whose commit can be held after planning, the
way a commit stuck in retries does. For the write-fencing and forget-during-apply suites.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_api import keys
from engram_api.models import MessageState
from engram_api.storage.faiss.files import VectorStore
from engram_workers.resources import WorkerResources
from engram_workers.stages.apply import run_apply
from engram_workers.stages.extract import run_extract
from tests.support.stack import Stack, engram_stack

T0 = datetime(2024, 3, 1, tzinfo=UTC)


@pytest.fixture(params=["neo4j", "sqlite"])
def stack(
    request: pytest.FixtureRequest,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Stack]:
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    data_dir = tmp_path_factory.mktemp(f"fencing-{request.param}")
    with engram_stack(redis_url=redis_url, data_dir=data_dir, neo4j_uri=neo4j_uri, llm_url=None, workers=False) as s:
        # The stages hand messages on through the Celery app, which configures itself from the environment.
        for name, value in s.env.items():
            monkeypatch.setenv(name, value)
        yield s


def process(stack: Stack) -> WorkerResources:
    """A worker process's resources, in this process."""
    return stack.worker_resources()


def deliver(ctx: WorkerResources, stack: Stack, user: str, text: str, day: int) -> str:
    """Enqueue one message and run its extract and apply stages in ``ctx`` (no Celery worker)."""
    receipt = stack.client.enqueue(user, text, timestamp=T0 + timedelta(days=day))
    run_extract(ctx, user, receipt.message_id)
    outcome = run_apply(ctx, user, receipt.message_id)
    assert ctx.redis.hget(keys.status(user, receipt.message_id), "state") == MessageState.APPLIED, outcome
    return receipt.message_id


def index_ids(stack: Stack, user: str) -> set[str]:
    index = VectorStore(root=stack.settings.index_dir, dim=stack.client.reader.embedder.dim).load(user)
    assert index is not None
    return index.node_ids()


def graph_ids(stack: Stack, user: str) -> set[str]:
    return {item.node_id for item in stack.client.graph.vectors(user)[0]}


def new_user() -> str:
    return f"fence_{uuid.uuid4().hex[:10]}"


class StalledGraph:
    """The real graph store; while closed, ``apply`` (the commit of a fully planned write) waits, the way
    a commit stuck in Neo4j retries or behind a slow disk does. Everything else passes straight through."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._gate = threading.Event()
        self._gate.set()
        self.waiting = threading.Event()

    def close(self) -> None:
        self._gate.clear()

    def open(self) -> None:
        self._gate.set()

    def apply(self, plan: Any) -> Any:
        if not self._gate.is_set():
            self.waiting.set()
            self._gate.wait(timeout=120)
        return self._real.apply(plan)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)
