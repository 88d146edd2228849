"""Liveness and readiness of the fleet's processes, for Kubernetes probes (``engram probe live|ready``).

Liveness is local and depends on nothing else: ``engram worker`` and ``engram beat`` touch a heartbeat file
(``heartbeat_path(role)``) from a daemon thread every ``HEARTBEAT_S``; the file is fresh while the
interpreter runs, so a Redis or Neo4j outage never restarts a pod. It is not tied to Celery's event loop
on purpose: that loop stops while the consumer reconnects to the broker, and a standby Beat blocks on the
leader lock by design. The file lives in the temporary directory (TMPDIR; an emptyDir in the chart) and
is removed when the process exits normally.

Readiness adds the dependencies the role needs to do any work: Redis for every role, the graph store for
every worker (extract reads a user's context from it; Beat only publishes); see
``engram_api.health.check_ready``.
"""

from __future__ import annotations

import atexit
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `engram probe` reads ROLES before anything heavy loads
    from engram_api.models import CheckResult, HealthReport

__all__ = ["HEARTBEAT_S", "ROLES", "check_live", "check_role_ready", "heartbeat_path", "start_heartbeat"]

HEARTBEAT_S = 10.0
ROLES = ("extract", "apply", "maintenance", "all", "beat")
# Roles whose work touches the graph store (extract reads a user's context from it); Beat only publishes.
_GRAPH_ROLES = frozenset({"extract", "apply", "maintenance", "all"})


def heartbeat_path(role: str) -> Path:
    """Where a process of ``role`` keeps its heartbeat (one process of a role per container)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    return Path(tempfile.gettempdir()) / f"engram-{role}.alive"


def start_heartbeat(role: str, interval_s: float = HEARTBEAT_S) -> Path:
    """Touch ``heartbeat_path(role)`` now and every ``interval_s`` from a daemon thread; removed at exit."""
    path = heartbeat_path(role)
    path.touch()

    def beat() -> None:
        while True:
            time.sleep(interval_s)
            path.touch()

    threading.Thread(target=beat, name=f"engram-heartbeat-{role}", daemon=True).start()
    # Pool children leave through os._exit: only this (the owning) process removes it.
    atexit.register(path.unlink, missing_ok=True)
    return path


def check_live(role: str, max_age_s: float) -> CheckResult:
    """The role's heartbeat is younger than ``max_age_s`` (several heartbeats: a loaded node may be late)."""
    from engram_api.models import CheckResult

    path = heartbeat_path(role)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return CheckResult(ok=False, detail=f"no heartbeat at {path} (not started, or exited)")
    ok = age <= max_age_s
    detail = f"heartbeat {age:.1f}s old" + ("" if ok else f" (stale: more than {max_age_s:g}s)")
    return CheckResult(ok=ok, detail=f"{detail} at {path}")


def check_role_ready(role: str, max_age_s: float) -> HealthReport:
    """Live, and the dependencies of the role answer (Redis; the graph store for every worker role)."""
    from engram_api.client import MemoryClient
    from engram_api.health import check_ready
    from engram_api.models import HealthReport

    client = MemoryClient()
    try:
        report = check_ready(client, graph=role in _GRAPH_ROLES)
    finally:
        client.close()
    checks = {"heartbeat": check_live(role, max_age_s), **report.checks}
    return HealthReport(ok=all(c.ok for c in checks.values()), checks=checks)
