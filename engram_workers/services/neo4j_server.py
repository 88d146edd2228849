"""A real Neo4j 5.26 Community server (embedded in a small JVM launcher) speaking Bolt on 127.0.0.1.

The launcher lives in ``ops/neo4j-launcher`` (Maven builds it once; ``build.sh`` is a no-op afterwards).
The JVM gets a stdin pipe and ``NEO4J_EXIT_ON_STDIN_EOF=1``: when this process dies, however it dies,
the pipe closes and the JVM shuts itself down, so no orphaned database outlives a killed test run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from engram_workers.services import ServiceStartError, file_size, kill_process, log_tail, stop_process
from engram_workers.services.ports import start_on_port

__all__ = ["LAUNCHER_DIR", "Neo4jServer"]

HOST = "127.0.0.1"
LAUNCHER_DIR = Path(__file__).resolve().parents[2] / "ops" / "neo4j-launcher"
_BUILD_TIMEOUT_S = 900  # a first build downloads ~120 MB of jars from Maven Central


class Neo4jServer:
    """One launcher JVM; its Neo4j home (store files, logs/debug.log) is ``data_dir``.

    The launcher's stderr is appended to ``data_dir/launcher.log``.
    """

    def __init__(self, *, data_dir: Path, port: int | None = None, heap: str = "1g") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.heap = heap
        # As for Redis: only a port we picked and never served on may change on a retry.
        self._port_may_move = port is None
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._ready = threading.Event()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("Neo4jServer has no port before start()")
        return self._port

    @property
    def uri(self) -> str:
        return f"bolt://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "launcher.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @staticmethod
    def build() -> None:
        """Build the launcher if its sources changed or it was never built (Maven, cached in ~/.m2)."""
        if not (LAUNCHER_DIR / "run.sh").is_file():
            raise ServiceStartError(
                f"the Neo4j launcher is missing: expected {LAUNCHER_DIR}/run.sh. It ships in the source "
                "tree (ops/neo4j-launcher), so run from a checkout (pip install -e .), or set NEO4J_URI "
                "to a running Neo4j 5.x instead"
            )
        if shutil.which("java") is None:
            raise ServiceStartError(
                "`java` is not on PATH: the Neo4j launcher needs a JDK 17+ "
                "(apt-get install default-jdk-headless), or set NEO4J_URI to a running Neo4j 5.x"
            )
        try:
            done = subprocess.run(
                [str(LAUNCHER_DIR / "build.sh")],
                cwd=LAUNCHER_DIR,
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServiceStartError(f"{LAUNCHER_DIR}/build.sh took over {_BUILD_TIMEOUT_S}s") from exc
        if done.returncode != 0:
            # Maven is only needed when a build is due, so its absence is reported only here.
            hint = "\n`mvn` is not on PATH (apt-get install maven)" if shutil.which("mvn") is None else ""
            output = (done.stdout + done.stderr)[-3000:]
            raise ServiceStartError(f"{LAUNCHER_DIR}/build.sh failed (code {done.returncode}):\n{output}{hint}")

    def start(self, timeout: float = 180.0) -> Neo4jServer:
        """Build if needed, start, and wait for the launcher's READY line; a no-op when running."""
        if self.running:
            return self
        self.build()
        self.data_dir.mkdir(parents=True, exist_ok=True)

        def start_once(port: int) -> None:
            self._port = port
            self._start_once(timeout)

        self._port = start_on_port(
            label="Neo4j launcher",
            port=self._port or 0,
            movable=self._port_may_move,
            start_once=start_once,
            error=ServiceStartError,
            host=HOST,
        )
        self._port_may_move = False
        return self

    def _start_once(self, timeout: float) -> None:
        since = file_size(self.log_path)
        env = {**os.environ, "NEO4J_EXIT_ON_STDIN_EOF": "1", "NEO4J_HEAP": self.heap}
        self._ready.clear()
        self._proc = subprocess.Popen(
            [str(LAUNCHER_DIR / "run.sh"), str(self.data_dir), str(self.port)],
            cwd=LAUNCHER_DIR,
            env=env,
            stdin=subprocess.PIPE,  # never written to: its EOF is the JVM's "parent died" signal
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        # Both pipes are drained for the JVM's whole life: a full pipe would block its logging.
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            code = self._proc.poll()
            if code is not None:
                self._join_readers()
                raise ServiceStartError(
                    f"Neo4j launcher ({LAUNCHER_DIR}/run.sh) exited with code {code} before READY; "
                    f"end of {self.log_path}:\n{log_tail(self.log_path, since=since)}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceStartError(
                    f"Neo4j launcher ({LAUNCHER_DIR}/run.sh) not READY within {timeout:.0f}s; "
                    f"end of {self.log_path}:\n{log_tail(self.log_path, since=since)}"
                )

    def _read_stdout(self, stream: IO[bytes]) -> None:
        with self.log_path.open("ab") as log:
            for line in stream:
                if line.startswith(b"READY bolt://"):
                    self._ready.set()
                else:  # the launcher keeps stdout for READY; anything else is worth keeping
                    log.write(line)
                    log.flush()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        with self.log_path.open("ab") as log:
            for line in stream:
                log.write(line)
                log.flush()

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)
        self._readers = []

    def _close_stdin(self) -> None:
        if self._proc is not None and self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (clean Neo4j shutdown with a checkpoint), SIGKILL after ``timeout`` seconds."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout=timeout)
        self._close_stdin()
        self._join_readers()

    def kill(self) -> None:
        """SIGKILL, for chaos tests: the next start() runs Neo4j's recovery from the transaction log."""
        if self._proc is None:
            return
        kill_process(self._proc)
        self._close_stdin()
        self._join_readers()

    def restart(self, timeout: float = 180.0) -> Neo4jServer:
        """Graceful stop, then start on the same port and data directory."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> Neo4jServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Neo4jServer(port={self._port}, data_dir={str(self.data_dir)!r}, {state})"
