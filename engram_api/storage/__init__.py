"""Storage, one room per concern: ``graph/`` (the contract, policy above the backends, ``neo4j/`` and ``sqlite/``),
``faiss/`` (per-user vector indexes, a cache of the graph), ``snapshot/`` (a user's graph held in memory for recall),
``embedding/`` (the encoder) and ``writer/`` (the one writer per user: lease and ``UserWrite``).

Backends are imported lazily so that importing ``engram_api`` never needs the Neo4j driver to connect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_api.storage.graph.contract import ExtractionContext, GraphStep, GraphStepQuery, GraphStore
from engram_api.storage.graph.fading import Fading

if TYPE_CHECKING:
    from engram_api.settings import Settings

__all__ = ["ExtractionContext", "GraphStep", "GraphStepQuery", "GraphStore", "migrate_graph_store", "open_graph_store"]


def open_graph_store(settings: Settings) -> GraphStore:
    """Neo4j when ``NEO4J_URI`` is set, else the embedded SQLite store under ``ENGRAM_DATA_DIR``."""
    fading = Fading.of(settings.decay_per_day, settings.archive_threshold)
    if settings.neo4j_uri:
        from engram_api.storage.graph.neo4j.store import Neo4jGraphStore

        return Neo4jGraphStore(
            uri=settings.neo4j_uri,
            user=settings.neo4j_user,
            password=settings.neo4j_password,
            database=settings.neo4j_database,
            query_timeout_s=settings.neo4j_query_timeout_s,
            pool=settings.neo4j_pool,
            fading=fading,
        )
    from engram_api.storage.graph.sqlite.store import SqliteGraphStore

    return SqliteGraphStore(path=settings.sqlite_path, fading=fading)


def migrate_graph_store(settings: Settings) -> tuple[int | None, int | None]:
    """`engram migrate`: bring the configured graph store to this code's schema (Neo4j: the schema
    statements, data migrations and version marker, a no-op when already there; the embedded SQLite store
    migrates itself when opened). Returns the Neo4j schema version (before, after); (None, None) for SQLite."""
    graph = open_graph_store(settings)
    try:
        if settings.neo4j_uri:
            from engram_api.storage.graph.neo4j.connection import Neo4jConnection

            assert isinstance(graph, Neo4jConnection)
            return graph.migrate()
        graph.ensure_schema()
        return None, None
    finally:
        graph.close()
