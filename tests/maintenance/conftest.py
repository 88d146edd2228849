"""Fixtures of the maintenance tests: each test runs once per graph backend ("sqlite", "neo4j").

Like the contract suite, the Neo4j run shares one database, so every test works on fresh user ids and
passes them explicitly (``list_users`` would also see other tests' users there).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from engram_api.storage import GraphStore
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.writer.userwrite import UserWrites
from tests.support.builders import DIM, GuardedGraph, GuardSpy, new_user
from tests.support.stores import backend as backend  # the fixtures, brought in under their names
from tests.support.stores import store as store


@pytest.fixture
def guard(store: GraphStore, keeper: IndexKeeper) -> Iterator[GuardSpy]:
    spy = GuardSpy(UserWrites(graph=store, keeper=keeper, redis_client=None, lease_ttl_s=30))
    yield spy
    assert not spy.violations, spy.violations


@pytest.fixture
def graph(store: GraphStore, guard: GuardSpy) -> GraphStore:
    """The store as the jobs see it: every per-user write must happen inside that user's guard."""
    return cast(GraphStore, GuardedGraph(store, guard))


@pytest.fixture
def keeper(store: GraphStore, tmp_path: Path) -> IndexKeeper:
    return IndexKeeper(graph=store, vectors=VectorStore(root=tmp_path / "indexes", dim=DIM))


@pytest.fixture
def user() -> str:
    return new_user()
