"""Closing ends what was started. A ``MemoryClient``'s reader starts threads (the erasure sweep, the stamp
listener, the recall pool, whose threads are not daemons) and a worker's resources an erasure sweep; each
ends when its owner is closed, so none outlives its client to keep calling a Redis that is gone (a test
session once took minutes to exit after its summary, a leftover sweep logging Redis's refusals). A sweep
whose Redis is away keeps trying while its process runs, and says so once an outage, not every interval.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engram_api import MemoryClient
from engram_api.reader.signals import StampSignals
from engram_api.settings import Settings
from engram_api.storage import open_graph_store
from engram_api.storage.faiss.erasure import IndexSweeper
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_workers.resources import WorkerResources
from engram_workers.services.ports import free_port
from engram_workers.services.redis_server import RedisServer
from tests.support.operator_processes import wait_until
from tests.support.stack import engram_stack


def _engram_threads_since(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.name.startswith("engram-")]


def test_closing_a_client_ends_every_thread_its_reader_started(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        before = set(threading.enumerate())
        client = MemoryClient(settings=stack.settings, redis_url=stack.env["REDIS_URL"])
        client.recall("closing_user", "where do I live?")
        started = _engram_threads_since(before)
        kinds = {t.name.rsplit("_", 1)[0] for t in started}  # the pool's threads are numbered
        assert {"engram-index-sweep", "engram-stamp-signals", "engram-recall-io"} <= kinds
        client.close()
        assert [t.name for t in started if t.is_alive()] == []  # ended by the time close returned


def test_closing_a_workers_resources_stops_its_erasure_sweep(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        before = set(threading.enumerate())
        ctx = WorkerResources(settings=stack.settings)
        assert ctx.keeper is not None and ctx.sweeper is not None  # the keeper starts this process's sweep
        assert ctx.sweeper.embedder is ctx.embedder  # which also drops erased users' texts from its encoder cache
        started = _engram_threads_since(before)
        assert [t.name for t in started] == ["engram-index-sweep"]
        ctx.close()
        assert not started[0].is_alive()


def test_a_sweep_without_redis_warns_once_an_outage_and_stops_when_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(data_dir=tmp_path)
    graph = open_graph_store(settings)
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=settings.index_dir, dim=384))
    # Nothing listens on the port: every sweep is refused at once (no retries inside the client).
    gone = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    sweeper = IndexSweeper(keeper, gone, interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="engram_api.storage.faiss.erasure"):
        sweeper.start()
        wait_until(lambda: sweeper.failures >= 5, timeout=60, what="five refused sweeps")
        sweeper.stop()
    assert sweeper.sweeps == 0 and sweeper._thread is not None and not sweeper._thread.is_alive()
    warnings = [r for r in caplog.records if r.name == "engram_api.storage.faiss.erasure"]
    assert len(warnings) == 1 and "erasure sweep failed" in warnings[0].getMessage()
    graph.close()


def test_a_client_many_threads_open_at_once_starts_one_reader_and_close_ends_its_threads(
    redis_url: str, tmp_path: Path
) -> None:
    """``AsyncMemoryClient`` runs methods on many threads at once: their first calls open ONE reader, so
    ``close`` stops every thread started (a second reader made by a race once left a stamp listener running
    into Redis's teardown: an unhandled ConnectionError in that thread)."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        before = set(threading.enumerate())
        client = MemoryClient(settings=stack.settings, redis_url=stack.env["REDIS_URL"])
        start = threading.Barrier(6)
        readers: list[object] = []

        def open_reader() -> None:
            start.wait()
            readers.append(client.reader)

        callers = [threading.Thread(target=open_reader) for _ in range(6)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert len({id(r) for r in readers}) == 1
        started = _engram_threads_since(before)
        names = sorted(t.name for t in started)
        assert names.count("engram-stamp-signals") == 1 and names.count("engram-index-sweep") == 1, names
        client.close()
        assert [t.name for t in started if t.is_alive()] == []


def test_the_stamp_listener_outlives_its_redis_quietly_and_ends_when_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis going away under the listener (a teardown, an outage) is an error it handles: no exception
    escapes its thread, and ``stop`` ends it."""
    escaped: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    server = RedisServer(data_dir=tmp_path / "redis")
    server.start()
    client = redis.Redis.from_url(str(server.url), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    signals = StampSignals(client, lambda user, stamp: None).start()
    try:
        wait_until(signals.subscribed.is_set, timeout=60, what="subscribed")
        server.stop()
        wait_until(lambda: not signals.subscribed.is_set(), timeout=60, what="the listener saw Redis go")
        client.close()
    finally:
        signals.stop()
        server.stop()
    assert signals._thread is not None and not signals._thread.is_alive()
    assert [(e.exc_type, e.thread.name if e.thread else None) for e in escaped] == []
