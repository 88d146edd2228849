"""The embedded/local topology ``engram up`` and ``engram demo`` run: Redis (unless REDIS_URL is set),
workers, Beat and Flower as child processes, with logs under ENGRAM_DATA_DIR/logs.

Children get absolute paths and the Redis URL in their environment: they run in the log directory,
not the caller's working directory, and must not depend on finding services.json.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from engram_api.settings import Settings
    from engram_workers.services.celery_worker import ManagedProcess
    from engram_workers.services.fleet import FleetRecord
    from engram_workers.services.redis_server import RedisServer

__all__ = ["LocalStack", "describe_reaped", "live_embedded_redis"]

_READY_TIMEOUT_S = 120.0  # a first start imports torch and Celery in every child


def live_embedded_redis(settings: Settings) -> str | None:
    """The URL in services.json when an embedded Redis answers there (another `engram up` runs)."""
    import redis

    from engram_api.connections import SERVICES_FILE, redis_client

    try:
        url = json.loads((settings.data_dir / SERVICES_FILE).read_text()).get("redis_url")
    except (OSError, ValueError, AttributeError):
        return None
    if not url:
        return None
    try:
        redis_client(url, settings, timeout_s=1).ping()
    except redis.RedisError:
        return None
    return str(url)


def describe_reaped(records: list[FleetRecord]) -> str:
    """One line per dead supervisor whose leftovers were ended."""
    return "\n".join(
        f"ended what a killed supervisor (pid {r.supervisor.pid}) left running: "
        + (", ".join(c.name for c in r.children) or "nothing")
        for r in records
    )


@dataclass
class LocalStack:
    settings: Settings
    data_dir: Path = field(init=False)
    redis_url: str = field(init=False, default="")
    redis_server: RedisServer | None = field(init=False, default=None)
    children: list[ManagedProcess] = field(init=False, default_factory=list)
    _ready: dict[str, str] = field(init=False, default_factory=dict)
    _record: FleetRecord = field(init=False)

    def __post_init__(self) -> None:
        from engram_workers.services.fleet import FleetRecord, ProcessRef

        self.data_dir = self.settings.data_dir.resolve()
        self._record = FleetRecord(supervisor=ProcessRef.of("supervisor", os.getpid()))

    def prepare(self, say: Callable[[str], object]) -> None:
        """Before any process starts: end a killed stack's leftovers (``say`` tells which), and bring Neo4j's
        schema to this code's version (a one-machine stack is its own operator: a fleet runs `engram
        migrate` apart; the embedded SQLite store needs nothing)."""
        reaped = self.clean_leftovers()
        if reaped:
            say(describe_reaped(reaped))
        if self.settings.neo4j_uri:
            from engram_api.storage import migrate_graph_store

            migrate_graph_store(self.settings)

    def clean_leftovers(self) -> list[FleetRecord]:
        """End what a killed `engram up`/`demo` on this data directory left running (see services.fleet)."""
        from engram_workers.services.fleet import reap_leftovers

        return reap_leftovers(self.data_dir)

    def _track(self, name: str, pid: int) -> None:
        """Record a started child in this supervisor's fleet record (for `engram down` and reaping)."""
        from engram_workers.services.fleet import ProcessRef, save_record

        try:
            self._record.children.append(ProcessRef.of(name, pid, leads_group=True))
        except ProcessLookupError:
            return  # already gone: wait_ready reports it
        save_record(self.data_dir, self._record)

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.redis_url, "ENGRAM_DATA_DIR": str(self.data_dir)}

    def start_redis(self, *, reuse: bool) -> str:
        """REDIS_URL when set; else the embedded Redis of this data directory, started here.

        With ``reuse`` a running embedded Redis (another `engram up`) is shared instead of refused: two
        servers must never write one AOF directory.
        """
        from engram_api.connections import write_services_file
        from engram_api.errors import ConfigError
        from engram_workers.services import RedisServer, ServiceStartError

        if self.settings.redis_url:
            self.redis_url = self.settings.redis_url
            return self.redis_url
        running = live_embedded_redis(self.settings)
        if running:
            if not reuse:
                raise ConfigError(
                    "ENGRAM_DATA_DIR",
                    f"an embedded Redis for {self.data_dir} already runs at {running} (another `engram up`?); "
                    "stop it with `engram down` or use another ENGRAM_DATA_DIR",
                )
            self.redis_url = running
            return running
        # Only its user may read the data directory (message text, the SQLite store, the Redis password in
        # services.json), and only with the password, new at every start, may anyone talk to the Redis.
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        server = RedisServer(
            data_dir=self.data_dir / "redis", appendonly=True, die_with_parent=True, password=secrets.token_urlsafe(24)
        )
        try:
            server.start()
        except ServiceStartError as exc:
            raise click.ClickException(f"the embedded Redis did not start: {str(exc).splitlines()[0]}") from None
        self.redis_server = server
        self._record.owns_redis = True
        assert server.pid is not None
        self._track("redis", server.pid)
        self.redis_url = self.redis_server.url
        self._resend_lost()
        write_services_file(self.settings, redis_url=self.redis_url)
        return self.redis_url

    def _resend_lost(self) -> None:
        """On a Redis this stack just started, before any worker or client connects: a message in flight whose
        task is in no queue and not unacked was taken by a worker killed before kombu recorded it
        (celery/celery#7950), so it is sent again now, not after the redelivery sweep's threshold."""
        from engram_workers.maintenance import resend_lost

        resend_lost(self.settings, self.redis_url, older_than_s=0)

    def _start(self, name: str, argv: list[str], ready: str) -> None:
        """Start a child without waiting for it: children boot in parallel, see ``wait_ready``."""
        from engram_workers.services.celery_worker import ManagedProcess

        proc = ManagedProcess(name=name, argv=argv, env=self.env, log_dir=self.log_dir, die_with_parent=True)
        # The log is appended to: the last run's "ready." must not pass for this run's. One old log is kept.
        if proc.log_path.exists():
            proc.log_path.replace(proc.log_path.with_suffix(".log.1"))
        proc.start()
        self._track(name, proc.pid)
        self.children.append(proc)
        self._ready[proc.name] = ready

    def start_extract_worker(self, name: str, concurrency: int) -> None:
        from engram_workers.services.celery_worker import EXTRACT_WORKER, worker_command

        argv = worker_command(**{**EXTRACT_WORKER, "concurrency": concurrency}, name=name)
        self._start(name, argv, "ready.")

    def start_apply_worker(self, name: str, concurrency: int) -> None:
        """Apply and maintenance share a worker here: one machine needs no separate maintenance fleet."""
        from engram_workers.services.celery_worker import APPLY_WORKER, worker_command

        argv = worker_command(**{**APPLY_WORKER, "concurrency": concurrency}, name=name)
        self._start(name, argv, "ready.")

    def start_beat(self) -> None:
        self._start("beat", [sys.executable, "-m", "engram_workers.cli", "beat"], "beat: Starting")

    def start_flower(self, port: int, address: str) -> None:
        argv = [sys.executable, "-m", "engram_workers.cli", "flower", "--port", str(port), "--address", address]
        self._start("flower", argv, "Visit me at")

    def start_gateway(self, port: int) -> None:
        """The HTTP/MCP gateway on loopback (keys from ENGRAM_API_KEYS, if any)."""
        argv = [sys.executable, "-m", "engram_workers.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        self._start("gateway", argv, "Application startup complete")

    def wait_ready(self) -> None:
        """Until every child has logged its ready line."""
        for proc in self.children:
            try:
                proc.wait_for_log(self._ready[proc.name], timeout=_READY_TIMEOUT_S)
            except RuntimeError:
                state = "exited" if not proc.alive() else f"was not ready within {_READY_TIMEOUT_S:.0f} s"
                raise click.ClickException(f"{proc.name} {state}; see {proc.log_path}") from None

    def dead_child(self) -> ManagedProcess | None:
        return next((p for p in self.children if not p.alive()), None)

    def stop(self) -> None:
        """Children newest first (Flower and Beat before the workers they watch and feed), Redis last."""
        from engram_api.connections import SERVICES_FILE
        from engram_workers.services.fleet import record_path

        for proc in reversed(self.children):
            proc.stop(timeout=30.0)
        self.children.clear()
        if self.redis_server is not None:
            self.redis_server.stop()
            # A stale services.json would send clients to a port nobody serves.
            (self.settings.data_dir / SERVICES_FILE).unlink(missing_ok=True)
            self.redis_server = None
        record_path(self.data_dir, self._record.supervisor.pid).unlink(missing_ok=True)
