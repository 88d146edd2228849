"""``engram probe live|ready --role ROLE``: Kubernetes exec probes of workers and Beat (the gateway has
HTTP ones: /v1/livez, /v1/readyz). One line a check on stdout, exit 1 when any fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from engram_workers.probes import ROLES

if TYPE_CHECKING:
    from engram_api.models import CheckResult

__all__ = ["COMMANDS"]

role_option = click.option(
    "--role",
    type=click.Choice(ROLES),
    required=True,
    help="The process probed: a worker's --stage, or beat.",
)
max_age_option = click.option(
    "--max-age",
    "max_age_s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds after which the heartbeat counts as stale (it is touched every 10 s).",
)


def _report(checks: dict[str, CheckResult], ok: bool) -> None:
    for name, check in checks.items():
        click.echo(f"{'ok  ' if check.ok else 'FAIL'} {name}: {check.detail}")
    if not ok:
        raise click.exceptions.Exit(1)


@click.group(short_help="Liveness and readiness probes of workers and Beat (for Kubernetes).")
def probe() -> None:
    """Liveness and readiness probes of `engram worker` and `engram beat`, for Kubernetes exec probes."""


@probe.command(short_help="Is the process alive? (its heartbeat file; no dependency checked)")
@role_option
@max_age_option
def live(role: str, max_age_s: float) -> None:
    """Exit 0 while the role's process touches its heartbeat file (every 10 s). Checks no dependency: a
    Redis or Neo4j outage must not restart pods."""
    from engram_workers.probes import check_live

    check = check_live(role, max_age_s)
    _report({"heartbeat": check}, check.ok)


@probe.command(short_help="Can the process work? (alive, Redis, and the graph store where needed)")
@role_option
@max_age_option
def ready(role: str, max_age_s: float) -> None:
    """Exit 0 when the process is alive and Redis answers (and the graph store, for every worker role;
    Beat does not use it)."""
    from engram_workers.probes import check_role_ready

    report = check_role_ready(role, max_age_s)
    _report(dict(report.checks), report.ok)


COMMANDS = [probe]
