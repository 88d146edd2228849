"""Process managers for the services Engram needs: Redis, Neo4j (embedded, via ops/neo4j-launcher) and
an OpenAI-compatible LLM stand-in. Tests, benchmarks, chaos scripts and ``engram up`` share them.

Importing this package starts nothing; the classes are loaded on first use::

    from engram_workers.services import Neo4jServer, RedisServer, LLMStandin
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram_workers.services.llm_standin import LLMStandin, Reply
    from engram_workers.services.neo4j_server import Neo4jServer
    from engram_workers.services.redis_server import RedisServer

__all__ = ["LLMStandin", "Neo4jServer", "RedisServer", "Reply", "ServiceStartError"]

_LAZY = {
    "LLMStandin": "engram_workers.services.llm_standin",
    "Reply": "engram_workers.services.llm_standin",
    "Neo4jServer": "engram_workers.services.neo4j_server",
    "RedisServer": "engram_workers.services.redis_server",
}


class ServiceStartError(RuntimeError):
    """A service did not come up; the message names the binary and quotes the end of its log."""


def __getattr__(name: str) -> Any:
    # Lazy so that the submodules can import ServiceStartError from here without a cycle, and so that
    # importing e.g. celery_worker does not load the HTTP server code.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def stop_process(proc: subprocess.Popen[Any], *, timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def kill_process(proc: subprocess.Popen[Any]) -> int:
    """SIGKILL, as a crash or the OOM killer would; returns the exit code."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # exited between poll() and kill()
    return proc.wait()
