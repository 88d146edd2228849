"""Runs Engram worker, Beat and Flower processes as children (for ``engram up``, demos, tests, chaos).

Each child is a real OS process speaking to Redis like a production worker: nothing runs in eager mode.
Children run in their log directory (never a source tree, which ``python -m`` would put first on their
import path) and import the same engram code as this process: a checkout run without an install passes
its root on through PYTHONPATH.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import engram_workers
from engram_api import keys
from engram_workers.services.fleet import parent_death_signal
from engram_workers.services.process import kill_process, stop_process

__all__ = ["APPLY_WORKER", "EXTRACT_WORKER", "ManagedProcess", "worker_command"]

# Extraction waits on the LLM: many threads in one process keep many calls in flight.
EXTRACT_WORKER = {"queues": [keys.EXTRACT_QUEUE], "pool": "threads", "concurrency": 32}
# Apply is CPU/DB work under a per-user lock: one process per core.
APPLY_WORKER = {"queues": [keys.APPLY_QUEUE, keys.MAINTENANCE_QUEUE], "pool": "prefork", "concurrency": 2}


def worker_command(
    *, queues: Sequence[str], pool: str, concurrency: int, name: str, loglevel: str = "INFO"
) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "engram_workers.app", "worker",
        "-Q", ",".join(queues), "--pool", pool, "-c", str(concurrency), "-n", f"{name}@%h",
        "--loglevel", loglevel,
    ]  # fmt: skip


def _same_code_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this process's engram import root first on PYTHONPATH, unless an install provides it."""
    root = str(Path(engram_workers.__file__).resolve().parents[1])
    installed = {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root in installed:
        return dict(env)
    paths = [root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


class ManagedProcess:
    """A child process with its output in a log file; stop() is graceful, kill() is SIGKILL."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        cwd: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = _same_code_env({**os.environ, **env})
        self.log_path = Path(log_dir) / f"{name}.log"
        # Tests pass the source root: their workers load test-only middleware from it.
        self.cwd = Path(cwd) if cwd is not None else self.log_path.parent
        # Only for a supervisor that starts children from one long-lived thread (``engram up``): the
        # kernel's signal follows the starting thread, not the process.
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # A new session: chaos tests kill the whole group (main process and pool children).
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal() if self.die_with_parent else None,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log_path.exists() and text in self.log_path.read_text(errors="replace"):
                return
            if not self.alive():
                break
            time.sleep(0.1)
        tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        raise RuntimeError(f"{self.name} did not log {text!r} within {timeout}s; log tail:\n{tail}")

    # Signals go to the whole process group (the child leads its own session), so a worker's pool
    # children stop and die with it; the lifecycle itself is the one every service shares.
    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, SIGKILL if it takes longer than ``timeout`` seconds."""
        if self.proc is not None:
            stop_process(self.proc, timeout=timeout, group=True)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None:
            kill_process(self.proc, group=True)

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
