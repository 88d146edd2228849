"""Fixtures of the contract suite: every test runs once per backend ("sqlite", "neo4j").

The Neo4j run shares one database across tests, so isolation comes from a fresh user id per test
(never from wiping the database); the SQLite run gets a fresh file per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_api.storage import GraphStore
from tests.support.factories import new_user, open_store

BACKENDS = ["sqlite", "neo4j"]


@pytest.fixture(params=BACKENDS)
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(backend, location): enough to open the same store again, in this process or another."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "graph.sqlite3")
    # Resolved lazily so `-k sqlite` runs even where no Neo4j can be started.
    return "neo4j", str(request.getfixturevalue("neo4j_uri"))


@pytest.fixture
def graph_store(store_spec: tuple[str, str]) -> Iterator[GraphStore]:
    store = open_store(*store_spec)
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture(params=BACKENDS)
def unreachable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GraphStore]:
    """A store pointed at something that cannot answer: a directory as the SQLite file, or a closed
    port for Neo4j. Building it must not fail; ``ping`` must."""
    location = str(tmp_path) if request.param == "sqlite" else "bolt://127.0.0.1:1"
    store = open_store(request.param, location)
    yield store
    store.close()


@pytest.fixture
def user() -> str:
    return new_user()


@pytest.fixture
def other_user() -> str:
    return new_user()
