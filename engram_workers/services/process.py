"""The lifecycle every server child shares (the embedded Redis here; Neo4j in the dev-only
``engram_testing`` package): start on a port, stop gracefully, kill hard, restart on the same port.

Invariants: the port may only move while it was picked automatically and never served (clients hold
the URL after the first start, so restarts come back on the same port); ``stop()`` and ``kill()`` are
no-ops when nothing runs; subclasses only say how to start the process once and what to release after
it ended. ``stop_process`` and ``kill_process`` are the stop/kill of every child Engram starts, the
worker, Beat and Flower children of ``celery_worker.ManagedProcess`` too (which signal their group).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from engram_workers.services.ports import start_on_port

__all__ = ["HOST", "ServiceProcess", "ServiceStartError", "file_size", "kill_process", "log_tail", "stop_process"]

HOST = "127.0.0.1"


class ServiceStartError(RuntimeError):
    """A service did not come up; the message names the binary and quotes the end of its log."""


def log_tail(path: Path, *, since: int = 0, max_chars: int = 3000) -> str:
    """The end of a log file from byte offset ``since`` on (for error messages).

    Logs are appended to across restarts; ``since`` keeps an old run's errors out of a new message.
    """
    try:
        with path.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return text[-max_chars:] if text.strip() else f"(log {path} has nothing for this run)"


def file_size(path: Path) -> int:
    """Current size of a file, 0 if missing: where the next run's log output will start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _signal(proc: subprocess.Popen[Any], sig: signal.Signals, *, group: bool) -> None:
    """``sig`` to the process, or with ``group`` to its whole process group (it leads a session)."""
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass  # exited between the caller's check and the signal


def stop_process(proc: subprocess.Popen[Any], *, timeout: float, group: bool = False) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL (see ``kill_process``); returns the exit code."""
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group=group)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return kill_process(proc, group=group)
    return proc.wait()


def kill_process(proc: subprocess.Popen[Any], *, group: bool = False) -> int:
    """SIGKILL, as a crash or the OOM killer would; returns the exit code. With ``group`` the whole
    process group, even once its leader has exited: a prefork worker's pool children can outlive it."""
    if group or proc.poll() is None:
        _signal(proc, signal.SIGKILL, group=group)
    return proc.wait()


class ServiceProcess:
    """One server child process bound to 127.0.0.1 with a data directory of its own."""

    start_timeout: ClassVar[float] = 30.0
    stop_timeout: ClassVar[float] = 10.0

    def __init__(self, *, data_dir: Path, port: int | None = None, die_with_parent: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve()
        # The kernel ends the server when the thread that started it dies (see fleet.parent_death_signal).
        self.die_with_parent = die_with_parent
        self._port_may_move = port is None
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what a subclass says --------------------------------------------------------------------

    @property
    def label(self) -> str:
        """What error messages call the server (its binary or launcher)."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Before the first attempt (e.g. build the launcher); nothing by default."""

    def _start_once(self, timeout: float) -> None:
        """Start the process on ``self.port`` and return once it serves; raise ServiceStartError if not."""
        raise NotImplementedError

    def _released(self) -> None:
        """After the process ended (close pipes, join readers); nothing by default."""

    # -- the shared lifecycle --------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has no port before start()")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float | None = None) -> Self:
        """Start and wait until it serves; a no-op when already running."""
        if self.running:
            return self
        self._prepare()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        wait = self.start_timeout if timeout is None else timeout

        def start_once(port: int) -> None:
            self._port = port
            self._start_once(wait)

        self._port = start_on_port(
            label=self.label,
            port=self._port or 0,
            movable=self._port_may_move,
            start_once=start_once,
            error=ServiceStartError,
            host=HOST,
        )
        self._port_may_move = False
        return self

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM (a clean shutdown), SIGKILL if it takes longer than ``timeout`` seconds."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout=self.stop_timeout if timeout is None else timeout)
        self._released()

    def kill(self) -> None:
        """SIGKILL, for chaos tests: the next ``start()`` recovers from what was written to disk."""
        if self._proc is None:
            return
        kill_process(self._proc)
        self._released()

    def restart(self, timeout: float | None = None) -> Self:
        """Graceful stop, then start on the same port and data directory."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"{type(self).__name__}(port={self._port}, data_dir={str(self.data_dir)!r}, {state})"
