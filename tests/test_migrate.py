"""`engram migrate` on a Neo4j of its own (fresh: never migrated): processes refuse the database with a typed
error naming the command until it has run, start without running any schema statement after it, and a
second run changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import neo4j
import pytest

from engram_api.errors import SchemaNotMigratedError
from engram_api.settings import Settings
from engram_api.storage import open_graph_store
from engram_api.storage.graph.neo4j import cypher as cy
from engram_testing import Neo4jServer
from engram_workers.resources import WorkerResources

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with Neo4jServer(data_dir=tmp_path_factory.mktemp("neo4j-fresh")) as server:
        yield server.uri


def engram(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEO4J_URI": uri, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def schema(uri: str) -> dict[str, Any]:
    """Every index and constraint (name -> state) and the version marker, read from the server."""
    with neo4j.GraphDatabase.driver(uri, auth=None) as driver:
        indexes = {r["name"]: r["state"] for r in driver.execute_query("SHOW INDEXES YIELD name, state").records}
        constraints = {r["name"] for r in driver.execute_query("SHOW CONSTRAINTS YIELD name").records}
        marker = driver.execute_query("MATCH (s:EngramSchema) RETURN s.version AS v, s.migrated_at AS at").records
    return {"indexes": indexes, "constraints": constraints, "marker": [(r["v"], r["at"]) for r in marker]}


def test_processes_refuse_a_database_until_migrate_has_run_once(fresh_uri: str, tmp_path: Path) -> None:
    settings = Settings(neo4j_uri=fresh_uri, data_dir=tmp_path)

    # Never migrated: the worker's store refuses, naming the command, and created nothing.
    with pytest.raises(SchemaNotMigratedError, match="run `engram migrate`") as refused:
        WorkerResources(settings=settings).graph  # noqa: B018 (opening the store is the start-up check)
    assert (refused.value.found, refused.value.expected) == (None, cy.SCHEMA_VERSION)
    assert not [name for name in schema(fresh_uri)["indexes"] if name.startswith("engram_")]
    reader = engram(fresh_uri, "stats", "alice")
    assert reader.returncode == 2 and "run `engram migrate`" in reader.stderr, reader.stderr

    first = engram(fresh_uri, "migrate")
    assert first.returncode == 0 and "schema created at version" in first.stdout, first.stderr
    after = schema(fresh_uri)
    assert after["marker"] and after["marker"][0][0] == cy.SCHEMA_VERSION
    assert after["indexes"].get("engram_entity_user_norm") == "ONLINE"  # the composite entity-name index
    assert all(state == "ONLINE" for state in after["indexes"].values())

    # Migrated: a worker starts and writes. It ran no schema statement: an index dropped behind its back
    # stays dropped (only `engram migrate` creates them).
    with neo4j.GraphDatabase.driver(fresh_uri, auth=None) as driver:
        driver.execute_query("DROP INDEX engram_feedback_created")
    ctx = WorkerResources(settings=settings)
    assert ctx.graph.list_users() == []
    ctx.graph.close()
    assert "engram_feedback_created" not in schema(fresh_uri)["indexes"]

    # A second run is a no-op: nothing created, the marker untouched (the dropped index shows it too).
    second = engram(fresh_uri, "migrate", "--json")
    assert second.returncode == 0, second.stderr
    assert '"changed": false' in second.stdout
    assert schema(fresh_uri) == {
        **after,
        "indexes": {k: v for k, v in after["indexes"].items() if k != "engram_feedback_created"},
    }

    # A database at an older version is upgraded by the next run (the dropped index comes back).
    with neo4j.GraphDatabase.driver(fresh_uri, auth=None) as driver:
        driver.execute_query("MATCH (s:EngramSchema) SET s.version = 0")
    with pytest.raises(SchemaNotMigratedError, match="schema version 0"):
        open_graph_store(settings).ensure_schema()
    upgrade = engram(fresh_uri, "migrate")
    assert upgrade.returncode == 0 and "upgraded from 0" in upgrade.stdout, upgrade.stderr
    assert schema(fresh_uri)["indexes"]["engram_feedback_created"] == "ONLINE"


def test_a_one_machine_stack_migrates_a_fresh_database_itself(tmp_path: Path) -> None:
    """`engram up` and `engram demo` are their own operator: their stack migrates before any process opens
    the store, so a newcomer's NEO4J_URI works without a separate step."""
    from engram_workers.cli._local import LocalStack

    with Neo4jServer(data_dir=tmp_path / "neo4j") as server:
        settings = Settings(neo4j_uri=server.uri, data_dir=tmp_path / "data")
        with pytest.raises(SchemaNotMigratedError):
            open_graph_store(settings).ensure_schema()
        LocalStack(settings).prepare(print)
        assert [v for v, _ in schema(server.uri)["marker"]] == [cy.SCHEMA_VERSION]
        WorkerResources(settings=settings).graph.ensure_schema()  # the worker's start-up check passes
