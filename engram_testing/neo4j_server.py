"""A real Neo4j 5.26 Community server (embedded in a small JVM launcher) speaking Bolt on 127.0.0.1.

Development only (tests, benchmarks, chaos): not shipped in the wheel. The launcher lives in
``ops/neo4j-launcher`` (Maven builds it once; ``build.sh`` is a no-op afterwards).
The JVM gets a stdin pipe and ``NEO4J_EXIT_ON_STDIN_EOF=1``: when this process dies, however it dies,
the pipe closes and the JVM shuts itself down, so no orphaned database outlives a killed test run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from engram_workers.services.process import HOST, ServiceProcess, ServiceStartError, file_size, log_tail

__all__ = ["LAUNCHER_DIR", "Neo4jServer"]

LAUNCHER_DIR = Path(__file__).resolve().parents[1] / "ops" / "neo4j-launcher"
_BUILD_TIMEOUT_S = 900  # a first build downloads ~120 MB of jars from Maven Central


class Neo4jServer(ServiceProcess):
    """One launcher JVM; its Neo4j home (store files, logs/debug.log) is ``data_dir``.

    The launcher's stderr is appended to ``data_dir/launcher.log``.
    """

    start_timeout = 180.0
    stop_timeout = 60.0  # SIGTERM: a clean Neo4j shutdown with a checkpoint

    def __init__(
        self, *, data_dir: Path, port: int | None = None, heap: str = "1g", conf: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(data_dir=data_dir, port=port)
        self.heap = heap
        self.conf = dict(conf or {})  # extra neo4j.conf settings (the launcher validates the keys)
        self._readers: list[threading.Thread] = []
        self._ready = threading.Event()

    @property
    def label(self) -> str:
        return "Neo4j launcher"

    @property
    def uri(self) -> str:
        return f"bolt://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "launcher.log"

    def _prepare(self) -> None:
        self.build()

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

    def _start_once(self, timeout: float) -> None:
        since = file_size(self.log_path)
        env = {**os.environ, "NEO4J_EXIT_ON_STDIN_EOF": "1", "NEO4J_HEAP": self.heap}
        if self.conf:
            env["NEO4J_RAW_CONF"] = ";".join(f"{key}={value}" for key, value in self.conf.items())
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

    def _released(self) -> None:
        if self._proc is not None and self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        self._join_readers()
