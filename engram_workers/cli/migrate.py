"""``engram migrate``: bring the graph database's schema and data to this version, once per database.

Run by an operator or an init job (the Helm chart's ``migrate`` Job, compose's one-shot ``migrate``
service) before the fleet starts or is upgraded: workers, Beat, the gateway and readers only check the
schema's version (one read) and refuse a database at another one, naming this command. Running it again is
a no-op. The embedded SQLite store migrates itself when it is opened (one process's file), so there this
command only opens it.
"""

from __future__ import annotations

import click

from engram_workers.cli._common import settings
from engram_workers.cli._output import emit_json, json_option

__all__ = ["COMMANDS"]


@click.command(short_help="Create or upgrade the graph database's schema (once, before starting the fleet).")
@json_option
def migrate(as_json: bool) -> None:
    """Create or upgrade the graph store's schema (indexes, constraints) and run its data migrations.

    Needs schema-admin rights on Neo4j; the processes themselves then need read and write rights only.
    Safe to run twice or from two places at once."""
    from engram_api.storage import migrate_graph_store

    current = settings()
    before, after = migrate_graph_store(current)
    backend = "neo4j" if current.neo4j_uri else "sqlite"
    result = {"backend": backend, "version_before": before, "version": after, "changed": before != after}
    if as_json:
        emit_json(result)
    elif backend == "sqlite":
        click.echo("sqlite: the embedded store migrates itself when opened; nothing to do")
    elif before == after:
        click.echo(f"neo4j: schema already at version {after}; nothing to do")
    else:
        click.echo(f"neo4j: schema {'created' if before is None else f'upgraded from {before}'} at version {after}")


COMMANDS = [migrate]
