"""Storage: the graph-store contract, its two backends, the per-user FAISS indexes and the embedder.

Backends are imported lazily so that importing ``engram_api`` never needs the Neo4j driver to connect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_api.storage.base import ExtractionContext, GraphStep, GraphStepQuery, GraphStore

if TYPE_CHECKING:
    from engram_api.settings import Settings

__all__ = ["ExtractionContext", "GraphStep", "GraphStepQuery", "GraphStore", "open_graph_store"]


def open_graph_store(settings: Settings) -> GraphStore:
    """Neo4j when ``NEO4J_URI`` is set, else the embedded SQLite store under ``ENGRAM_DATA_DIR``."""
    if settings.neo4j_uri:
        from engram_api.storage.neo4j_store import Neo4jGraphStore

        return Neo4jGraphStore(
            uri=settings.neo4j_uri,
            user=settings.neo4j_user,
            password=settings.neo4j_password,
            database=settings.neo4j_database,
            query_timeout_s=settings.neo4j_query_timeout_s,
        )
    from engram_api.storage.sqlite_store import SqliteGraphStore

    return SqliteGraphStore(path=settings.sqlite_path)
