"""The operator's commands as real processes (``python -m engram_workers.cli ...``, exactly what the
``engram`` console script runs), a Celery event receiver in the test process, and a polling helper."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from engram_api.settings import Settings
from engram_workers.celery_config import make_celery
from engram_workers.services.celery_worker import ManagedProcess
from tests.support.stack import SOURCE_ROOT

__all__ = ["SERVICE_VARS", "EventLog", "clean_env", "engram_process", "wait_until"]

T = TypeVar("T")

# What a developer's shell might have set: every test states its services explicitly instead.
SERVICE_VARS = ("REDIS_URL", "NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD", "LLM_MODEL", "LLM_API_KEY", "LLM_API_BASE")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without Engram's settings (offline model flags kept on), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS and not k.startswith("ENGRAM_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.update(extra)
    return env


def engram_process(name: str, args: list[str], *, env: Mapping[str, str], log_dir: Path) -> ManagedProcess:
    """`engram <args>` as a child process (not started) logging to ``log_dir/<name>.log``."""
    argv = [sys.executable, "-m", "engram_workers.cli", *args]
    return ManagedProcess(name=name, argv=argv, env=env, log_dir=log_dir, cwd=SOURCE_ROOT)


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = 0.25) -> T:
    """The first truthy value of ``probe()``; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


def _worker_name(hostname: str) -> str:
    """A worker's name as started ("apply"), from its Celery hostname ("apply@host")."""
    return hostname.split("@")[0]


class EventLog:
    """Every Celery event of one broker (task-sent from producers and Beat, task-* and worker-* from
    workers), as the fleet reports it to Flower; collected by a receiver thread of this process."""

    def __init__(self, settings: Settings, broker_url: str) -> None:
        self._app = make_celery(settings, broker_url, name="engram-test-events")
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, name="celery-events", daemon=True)

    def _record(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._events.append(event)

    def _run(self) -> None:
        with self._app.connection_for_read() as connection:
            self._receiver = self._app.events.Receiver(connection, handlers={"*": self._record})
            # wakeup: ask the workers for a heartbeat at once, which tells start() the receiver is live.
            self._receiver.capture(limit=None, timeout=None, wakeup=True)

    def start(self, *, timeout: float = 30.0) -> EventLog:
        """Returns once an event arrived: a broadcast published before the subscription is lost, so a
        test must not make the fleet act before this. Needs a running worker (its heartbeats)."""
        self._thread.start()
        wait_until(lambda: self.of_type("worker-heartbeat"), timeout=timeout, what="a worker heartbeat event")
        return self

    def ask_for_task_events(self) -> set[str]:
        """What Flower does: ask every running worker for task events (they send none unless asked or
        ENGRAM_TASK_EVENTS is on); the names (before the @) of the workers that said yes."""
        replies = self._app.control.enable_events(reply=True, timeout=5)
        return {_worker_name(hostname) for reply in replies for hostname in reply}

    def task_events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if e["type"].startswith("task-")]

    def heartbeats_since(self, index: int) -> set[str]:
        """The workers (names before the @) whose heartbeat came after the first ``index`` events."""
        with self._lock:
            later = self._events[index:]
        return {_worker_name(e["hostname"]) for e in later if e["type"] == "worker-heartbeat"}

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True  # seen by the consume loop within its 1 s drain timeout
        self._thread.join(timeout=10)
        self._app.close()

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if e["type"] == event_type]

    def sent(self, task_name: str) -> list[dict[str, Any]]:
        """task-sent events of ``task_name`` (each names the sending process's pid), oldest first."""
        return sorted(
            (e for e in self.of_type("task-sent") if e.get("name") == task_name), key=lambda e: e["timestamp"]
        )

    def succeeded(self, task_name: str) -> list[dict[str, Any]]:
        """task-succeeded events of ``task_name`` (those carry only the task id: named via task-sent)."""
        ids = {e["uuid"] for e in self.sent(task_name)}
        return [e for e in self.of_type("task-succeeded") if e["uuid"] in ids]
