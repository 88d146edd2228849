"""``engram maintenance <job>`` runs a Beat job now, in this process; ``engram reindex`` rebuilds FAISS indexes.

The jobs are the Celery task functions themselves, called directly (no broker round trip, no worker
needed), so they take the same per-user locks as the fleet and are as safe to run at any time.
"""

from __future__ import annotations

import json
from typing import Any

import click

from engram_workers.cli._common import open_client, user_option
from engram_workers.cli._output import emit_json, json_option, table

__all__ = ["COMMANDS"]

_JOBS = {
    "decay": (
        "decay_task",
        "Archive the facts whose faded strength fell below ENGRAM_ARCHIVE_THRESHOLD (the facts due).",
    ),
    "hierarchy": ("hierarchy_task", "Rebuild the topic clusters that `search --detail broad` returns."),
    "weights": ("weights_task", "Learn recall scoring weights from feedback (needs ENGRAM_MIN_FEEDBACK rows)."),
    "reconcile": (
        "reconcile_task",
        "Check every FAISS index against the graph; rebuild what drifted; backfill episode chunks.",
    ),
    "reembed": (
        "reembed_task",
        "Re-embed the episode chunks whose vectors were made under another ENGRAM_CHUNK_EMBED_CONTEXT.",
    ),
}


def _print_report(job: str, report: dict[str, Any]) -> None:
    scalars = [(k, v) for k, v in report.items() if not isinstance(v, list | dict)]
    table(f"maintenance {job}", ["", "value"], scalars)
    for name, value in report.items():
        if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
            columns = list(value[0])
            rows = [
                [json.dumps(row.get(c)) if isinstance(row.get(c), dict | list) else row.get(c) for c in columns]
                for row in value
            ]
            table(name, columns, rows)


def _job_command(job: str, task_name: str, summary: str) -> click.Command:
    @click.command(job, help=f"{summary}\n\nRuns now, in this process (every user unless --user is given).")
    @user_option("Only this user (repeatable).")
    @json_option
    def command(user_ids: tuple[str, ...], as_json: bool) -> None:
        from engram_workers import tasks
        from engram_workers.resources import close_resources

        try:
            report: dict[str, Any] = getattr(tasks, task_name)(user_ids=list(user_ids) or None)
        finally:
            close_resources()  # a one-shot command: its stores and its erasure sweep end with the job
        if as_json:
            emit_json(report)
        else:
            _print_report(job, report)
        if report.get("failed"):
            raise click.exceptions.Exit(1)

    return command


@click.group(short_help="Run a maintenance job now.")
def maintenance() -> None:
    """Run a maintenance job now (Beat runs them on a schedule)."""


for _job, (_task, _summary) in _JOBS.items():
    maintenance.add_command(_job_command(_job, _task, _summary))


@maintenance.command("ledger-reindex")
@json_option
def ledger_reindex(as_json: bool) -> None:
    """Once after upgrading from an Engram without per-user Redis indexes: file the messages, recall logs
    and dead letters written before in their users' indexes (one SCAN of the keyspace), so that erasure,
    which reads only those indexes, finds them. Safe to run twice or with the fleet running."""
    from engram_api.ledger.reindex import reindex as reindex_ledger

    with open_client() as client:
        report = reindex_ledger(client.redis, status_ttl_s=client.settings.status_ttl_s)
    if as_json:
        emit_json(report)
    else:
        click.echo(
            f"indexed {report.messages} message keys and {report.recall_logs} recall logs; "
            f"moved {report.dead_letters} dead letters to their own keys"
        )


@click.command(short_help="Rebuild FAISS indexes from the graph.")
@user_option("Only this user (repeatable).")
@json_option
def reindex(user_ids: tuple[str, ...], as_json: bool) -> None:
    """Rebuild this host's FAISS indexes from the graph store (the source of truth), every user unless --user.
    Each is a user write (``reindex_user``): other processes learn what it changed as they learn any write."""
    from engram_workers.maintenance import reindex_user

    with open_client() as client:
        keeper = client.reader.keeper
        users = list(user_ids) or client.graph.list_users()
        rows = []
        for user_id in users:
            # As a user write: a message applied mid-rebuild would otherwise be missing from the file.
            with client.reader.writes.open(user_id, wait=60.0) as write:
                index = reindex_user(keeper, write)
            rows.append({"user_id": user_id, "vectors": len(index), "version": index.version})
    if as_json:
        emit_json(rows)
    else:
        table("rebuilt indexes", ["user", "vectors", "graph version"], [tuple(r.values()) for r in rows])


COMMANDS = [maintenance, reindex]
