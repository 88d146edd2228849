"""The Neo4j connection pool's settings reach the driver: with one connection and a short acquisition
timeout, a second concurrent query waits, then fails with a typed error naming the settings; once the
first connection is free again, queries go through."""

from __future__ import annotations

import threading

import pytest

from engram_api.errors import StoreUnavailableError
from engram_api.settings import Settings
from engram_api.storage import open_graph_store


def test_one_pooled_connection_held_makes_another_query_fail_typed(neo4j_uri: str) -> None:
    settings = Settings(neo4j_uri=neo4j_uri, neo4j_max_pool_size=1, neo4j_pool_acquisition_timeout_s=0.5)
    assert settings.neo4j_pool["max_connection_pool_size"] == 1
    store = open_graph_store(settings)
    try:
        store.ensure_schema()
        outcome: list[BaseException | list[str]] = []

        def other_thread() -> None:
            try:
                outcome.append(store.list_users())
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)

        with store.batched():  # this thread's open transaction holds the pool's only connection
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join(timeout=60)
        (error,) = outcome
        assert isinstance(error, StoreUnavailableError), error
        assert "ENGRAM_NEO4J_MAX_POOL_SIZE" in str(error) and "no free Neo4j connection" in str(error)
        assert isinstance(store.list_users(), list)  # the connection is back in the pool
    finally:
        store.close()


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="neo4j_max_pool_size"):
        Settings(neo4j_max_pool_size=0)
