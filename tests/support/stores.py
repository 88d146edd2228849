"""A graph store per backend, for suites that run every test once on each ("sqlite", "neo4j"): a fresh
SQLite file per test, or the session's shared Neo4j (tests isolate by fresh user ids). A fixture module:
bring ``backend`` and ``store`` in by name. The ``"neo4j"`` case is slow (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_api.settings import Settings
from engram_api.storage import GraphStore, open_graph_store
from engram_api.storage.graph.sqlite.store import SqliteGraphStore


@pytest.fixture(params=["sqlite", "neo4j"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GraphStore]:
    if backend == "sqlite":
        graph: GraphStore = SqliteGraphStore(path=tmp_path / "g.db")
    else:
        # Resolved lazily so `-k sqlite` runs where no Neo4j can be started.
        graph = open_graph_store(Settings(neo4j_uri=request.getfixturevalue("neo4j_uri")))
    graph.ensure_schema()
    yield graph
    graph.close()
