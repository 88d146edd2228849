"""The processes a chaos scenario runs and breaks: the services, a fleet of real workers, and their control.

Invariants:

- every scenario gets its own fleet (``tests/support/stack.py``: own Redis database, own data directory)
  on the shared services, so no scenario sees another's queues, leases or breaker; the Redis-restart
  scenario starts a Redis of its own, so no scenario stops the shared one;
- ``kill_pid`` and ``restart_worker`` only touch processes this script started (or their pool children);
- a fleet is warmed up (``warm_up``) before the clock starts, so cold starts are not counted as recovery.

This folder's modules import ``engram_api``, ``engram_testing`` and ``tests.support`` from the source
tree's root: ``run_all.py`` puts it on ``sys.path``, pytest has it as its root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload import Workload

from engram_api.settings import Settings
from engram_api.storage import migrate_graph_store
from engram_testing import LLMStandin, Neo4jServer, Reply
from engram_workers.services import RedisServer
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER, ManagedProcess
from tests.support.stack import Stack, engram_stack

# The usual extract worker: threads, enough of them that the LLM stand-in's latency is not the bottleneck.
EXTRACT_8: Mapping[str, Any] = {**EXTRACT_WORKER, "concurrency": 8}
# One worker per stage, what most scenarios run.
ONE_OF_EACH: Mapping[str, Mapping[str, Any]] = {"extract": EXTRACT_8, "apply": APPLY_WORKER}


@dataclass
class Services:
    """Where Redis, Neo4j and the LLM stand-in are; ``neo4j`` is the server itself, for the outage scenario."""

    work_dir: Path
    redis_url: str
    neo4j_uri: str
    llm: LLMStandin
    neo4j: Neo4jServer | None = None

    @classmethod
    @contextlib.contextmanager
    def started(cls, work_dir: Path) -> Iterator[Services]:
        """Start all three on loopback for a run of the scenarios; everything is stopped afterwards."""
        work_dir.mkdir(parents=True, exist_ok=True)
        with (
            RedisServer(data_dir=work_dir / "redis", appendonly=True) as redis,
            Neo4jServer(data_dir=work_dir / "neo4j") as neo4j,
            LLMStandin() as llm,
        ):
            migrate_graph_store(Settings(neo4j_uri=neo4j.uri))  # `engram migrate`, as an init job would
            yield cls(work_dir=work_dir, redis_url=redis.url, neo4j_uri=neo4j.uri, llm=llm, neo4j=neo4j)


@contextlib.contextmanager
def fleet(services: Services, name: str, *, redis_url: str | None = None, **settings: object) -> Iterator[Stack]:
    """A stack (own Redis database, own data directory) with no workers yet: scenarios start their own."""
    with engram_stack(
        redis_url=redis_url or services.redis_url,
        data_dir=services.work_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}",
        neo4j_uri=services.neo4j_uri,
        llm_url=services.llm.url,
        workers=False,
        **settings,
    ) as stack:
        yield stack


def warm_up(stack: Stack, llm: LLMStandin, *rules: Callable[[dict[str, Any]], Reply | None], users: int = 4) -> None:
    """Run a few real messages through the fleet before the clock starts, so cold starts (litellm import,
    embedding model load) are not mistaken for fault recovery; then script the stand-in with ``rules``."""
    warm = Workload(f"warm{time.monotonic_ns()}", users=users, per_user=2)
    llm.script(warm.reply, *rules)
    # One message per user at a time: a user's second message makes extraction read the user's graph and
    # embed the text (the extract process loads the embedding model then), as in steady state.
    for n in range(2):
        stack.client.wait([stack.client.enqueue(**m.item()) for m in warm.messages[n::2]], timeout=300)
    llm.script(*rules)


def start_workers(stack: Stack, specs: Mapping[str, Mapping[str, Any]]) -> dict[str, ManagedProcess]:
    """Start several workers at once (each spends seconds on imports before "ready.") and wait for all.

    ``specs`` maps a worker name to ``EXTRACT_WORKER`` / ``APPLY_WORKER``, optionally with overrides.
    """
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {name: pool.submit(stack.start_worker, name, spec) for name, spec in specs.items()}
        return {name: future.result() for name, future in futures.items()}


# ----------------------------------------------------------------------------------------- processes
def pool_children(pid: int) -> list[int]:
    """Direct children of ``pid`` (a prefork worker's pool processes), read from /proc."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may hold spaces or parentheses: fields start after the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


def kill_pid(pid: int) -> bool:
    """SIGKILL one process we started (or one of its pool children); False if it was already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    return alive


def restart_worker(proc: ManagedProcess, *, orphans: Sequence[int] = (), timeout: float = 120.0) -> float:
    """Reap a worker whose main process died, start it again and wait for "ready."; returns seconds.

    Pool children outlive a SIGKILLed parent only until they notice it is gone; any still there after a
    grace period are killed (they are ours, and a real crash of the host process takes them too).
    """
    started = time.monotonic()
    assert proc.proc is not None
    proc.proc.wait()
    for pid in _wait_gone(orphans, timeout=10.0):
        kill_pid(pid)
    since = proc.log_path.stat().st_size if proc.log_path.exists() else 0
    proc.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with proc.log_path.open("rb") as log:
            log.seek(since)
            if b"ready." in log.read():
                return time.monotonic() - started
        if not proc.alive():
            break
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not come back within {timeout}s; see {proc.log_path}")


# ------------------------------------------------------------------------------- background threads
class Poller(threading.Thread):
    """A daemon thread that calls ``poll()`` at once and then every ``every`` seconds until ``stop()``."""

    def __init__(self, name: str, every: float, *, join_timeout: float) -> None:
        super().__init__(daemon=True, name=name)
        self.every = every
        self.join_timeout = join_timeout
        self._halt = threading.Event()

    def poll(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while True:
            self.poll()
            if self._halt.wait(self.every):
                return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=self.join_timeout)


class Supervisor(Poller):
    """Restarts worker processes that exit, as production's restart policy would (compose
    ``restart: unless-stopped``, systemd ``Restart=always``); ``restarts`` names each one it restarted."""

    def __init__(self, workers: Mapping[str, ManagedProcess], every: float = 0.5) -> None:
        # A restart waits for "ready." (up to 120 s): stop() lets one in progress finish.
        super().__init__("supervisor", every, join_timeout=150)
        self.workers = workers
        self.restarts: list[str] = []

    def poll(self) -> None:
        for name, proc in self.workers.items():
            if not proc.alive():
                self.restarts.append(name)
                restart_worker(proc)
