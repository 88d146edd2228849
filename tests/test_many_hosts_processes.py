"""Many hosts, real processes: an extract worker, two apply workers and a reader, each with its OWN data
directory (``ENGRAM_DATA_DIR``; no file shared), against one Neo4j and one Redis.

Messages for one user are applied one at a time, alternately by the two apply workers (before each one,
Celery's remote control has only that worker consume the apply queue: ``add_consumer`` / ``cancel_consumer``).
After each write the reader host's recall returns what a fresh single-host reader returns (same ids, same
order), and no process reads the user whole again after its first load of it (the workers' Prometheus
counter ``engram_index_loads_total{how="rebuild"}``, the reader's ``IndexKeeper.rebuilds``). Then
``forget_user`` from the reader: within the workers' sweep interval no data directory holds a file of the
user's hashed name or the bytes of one of its vectors, and no process recalls the forgotten facts.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from engram_api import MemoryClient, keys
from engram_api.settings import Settings
from engram_api.storage.faiss.files import VectorStore
from engram_workers.celery_config import make_celery
from engram_workers.services.celery_worker import ManagedProcess
from tests.support.gateway import free_port
from tests.support.operator_processes import engram_process, wait_until
from tests.support.stack import Stack, engram_stack

pytestmark = pytest.mark.slow

MESSAGES = [
    "I live in Paris.",
    "I work at Acme.",
    "I have a dog named Rex.",
    "My sister is called Ana.",
    "I play the guitar.",
    "I drive a Volvo.",
]
QUERIES = ["where does the user live?", "what does the user play?", "who is in the family?"]
SWEEP_S = 1.0


@dataclass
class Worker:
    name: str
    data_dir: Path
    process: ManagedProcess
    port: int

    def counter(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
            body = response.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


@pytest.fixture
def stack(redis_url: str, neo4j_uri: str, tmp_path: Path) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path / "reader", neo4j_uri=neo4j_uri, llm_url=None, workers=False,
        index_sweep_interval_s=SWEEP_S, visibility_timeout_s=3600,
    ) as s:  # fmt: skip
        yield s


@pytest.fixture
def workers(stack: Stack, tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for name, queue, concurrency in (
            ("extract", keys.EXTRACT_QUEUE, 2),
            ("apply-a", keys.APPLY_QUEUE, 1),
            ("apply-b", keys.APPLY_QUEUE, 1),
        ):
            data_dir, port = tmp_path / name, free_port()
            (data_dir / "prometheus").mkdir(parents=True)
            env = {**stack.env, "ENGRAM_DATA_DIR": str(data_dir), "ENGRAM_METRICS_DIR": str(data_dir / "prometheus")}
            args = ["worker", "--queues", queue, "--concurrency", str(concurrency), "--metrics-port", str(port),
                    "--hostname", f"{name}@%h"]  # fmt: skip
            process = engram_process(name, args, env=env, log_dir=data_dir).start()
            started.append(Worker(name, data_dir, process, port))
        for worker in started:
            worker.process.wait_for_log("ready.", timeout=120)
        yield started
    finally:
        for worker in started:
            worker.process.stop()


def only_consumer(celery: Celery, consumer: Worker, idle: Worker) -> None:
    """Only ``consumer`` takes the next apply task (the queue is empty between the test's messages)."""
    node = f"@{socket.gethostname()}"
    assert celery.control.cancel_consumer(keys.APPLY_QUEUE, destination=[idle.name + node], reply=True, timeout=10)
    assert celery.control.add_consumer(keys.APPLY_QUEUE, destination=[consumer.name + node], reply=True, timeout=10)


def applied(worker: Worker) -> float:
    return worker.counter("engram_messages_total", stage="apply", outcome="applied")


def single_host(stack: Stack, tmp_path: Path, n: int) -> MemoryClient:
    """A reader with no copy of anything (a fresh data directory): what one host with the graph answers."""
    fields = {"data_dir": tmp_path / f"single-{n}", "neo4j_uri": stack.settings.neo4j_uri, "cache_ttl_s": 0}
    return MemoryClient(settings=Settings(**fields), redis_url=stack.env["REDIS_URL"])


def recalled(client: MemoryClient, user: str) -> list[list[str]]:
    return [[item.id for item in client.recall(user, query, k=10).items] for query in QUERIES]


def files_of(dirs: list[Path], stem: str) -> list[Path]:
    return [p for d in dirs for p in (d / "indexes").glob(f"{stem}*") if (d / "indexes").is_dir()]


def test_two_apply_hosts_and_a_reader_share_nothing_but_the_graph(
    stack: Stack, workers: list[Worker], tmp_path: Path
) -> None:
    user, reader = "hosts_alex", stack.client
    extract, a, b = workers
    celery = make_celery(stack.settings, stack.env["REDIS_URL"])
    writers: list[str] = []
    for n, text in enumerate(MESSAGES):
        only_consumer(celery, (a, b)[n % 2], (b, a)[n % 2])
        before = {w.name: applied(w) for w in (a, b)}
        receipt = reader.enqueue(user, text)
        assert reader.wait([receipt], timeout=120).applied == [receipt.message_id]
        wait_until(lambda done=n + 1: sum(applied(w) for w in (a, b)) == done, timeout=30, what="the apply counters")
        writers += [w.name for w in (a, b) if applied(w) > before[w.name]]
        with single_host(stack, tmp_path, n) as fresh:
            assert recalled(reader, user) == recalled(fresh, user)
    assert writers == ["apply-a", "apply-b"] * (len(MESSAGES) // 2)
    # a created the user (nothing to read); b read it whole once, at its first write; after that every write
    # found the writer's copy one write behind and caught up: nobody reads the user whole again.
    loads = {w.name: (w.counter("engram_index_loads_total", how="rebuild"), w.counter("engram_index_loads_total",
             how="catchup")) for w in (a, b)}  # fmt: skip
    assert loads == {"apply-a": (0, 2), "apply-b": (1, 2)}
    assert extract.counter("engram_index_loads_total", how="rebuild") <= 1
    assert reader.reader.keeper.rebuilds == 1 and reader.reader.keeper.catchups >= len(MESSAGES) - 1

    # forget_user on the reader host: every host's files and bytes of the user go within the sweep interval.
    items, _ = stack.client.graph.vectors(user)
    markers = [np.asarray(item.embedding, dtype=np.float32).tobytes() for item in items if item.kind == "fact"]
    dirs, stem = [stack.data_dir, *(w.data_dir for w in workers)], VectorStore.stem(user)
    assert files_of([a.data_dir, b.data_dir], stem)  # the apply hosts hold copies until the sweep
    reader.forget_user(user)

    def cleaned() -> bool:
        return not files_of(dirs, stem)

    wait_until(cleaned, timeout=30 * SWEEP_S, what="every host's sweep of the forgotten user's files")
    for d in dirs:
        for path in (d / "indexes").iterdir() if (d / "indexes").is_dir() else ():
            data = path.read_bytes()
            assert not any(marker in data for marker in markers), path
    assert all(recalled(reader, user)[i] == [] for i in range(len(QUERIES)))
    with single_host(stack, tmp_path, 99) as fresh:
        assert recalled(fresh, user) == [[], [], []]
