"""Vector catch-up reads on Neo4j: what changed in a user's vectors after a version, as a mixin of
``Neo4jGraphStore`` (the contract and the invariants are ``vectorsync``'s).

Writes mark their facts, entities and chunks with ``changed`` (``Q_APPLY_WRITES``, ``Q_BUMP``) and log the
ids they delete as ``(:Removal {user_id, version, ids})`` nodes (``Q_BUMP``); this reads both back through
the ``(user_id, changed)`` and ``(user_id, version)`` indexes, so a catch-up costs what changed, not the
user's size.
"""

from __future__ import annotations

from neo4j import ManagedTransaction

from engram_api.storage.neo4j_connection import Neo4jConnection
from engram_api.storage.vectorsync import VectorChanges
from engram_api.versions import Stamp

__all__ = ["Neo4jVectors"]

Q_VECTOR_STAMP = """
OPTIONAL MATCH (u:User {user_id: $user_id})
RETURN coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version, u.vectors_from AS horizon
"""
Q_VECTOR_REMOVALS = """
MATCH (r:Removal {user_id: $user_id}) WHERE r.version > $since
UNWIND r.ids AS id
RETURN DISTINCT id
"""
Q_VECTOR_UPSERTS = """
CALL () {
  MATCH (f:Fact {user_id: $user_id}) WHERE f.changed > $since AND f.embedding IS NOT NULL
  RETURN f.id AS node_id, 'fact' AS kind, f.embedding AS embedding
  UNION ALL
  MATCH (e:Entity {user_id: $user_id}) WHERE e.changed > $since AND e.embedding IS NOT NULL
  RETURN e.id AS node_id, 'entity' AS kind, e.embedding AS embedding
  UNION ALL
  MATCH (c:Chunk {user_id: $user_id}) WHERE c.changed > $since AND c.embedding IS NOT NULL
  RETURN c.id AS node_id, 'episode' AS kind, c.embedding AS embedding
}
RETURN node_id, kind, embedding
"""


class Neo4jVectors(Neo4jConnection):
    """``_vector_changes`` of the graph-store contract on Neo4j."""

    def _vector_changes(self, user_id: str, since: int) -> VectorChanges:
        params = {"user_id": user_id, "since": since}

        def stamp(tx: ManagedTransaction) -> tuple[Stamp, int | None]:
            found = tx.run(Q_VECTOR_STAMP, params).single(strict=True)
            horizon = found["horizon"]
            return Stamp(int(found["epoch"]), int(found["version"])), None if horizon is None else int(horizon)

        def work(tx: ManagedTransaction) -> VectorChanges:
            # Stamp, removals, records, stamp: the order ``vectorsync`` relies on (read committed).
            before, horizon = stamp(tx)
            removed = tuple(r["id"] for r in tx.run(Q_VECTOR_REMOVALS, params))
            upserts = [(r["node_id"], r["kind"], r["embedding"]) for r in tx.run(Q_VECTOR_UPSERTS, params)]
            after, _ = stamp(tx)
            return VectorChanges(
                stamp=before, horizon=horizon, removed=removed, upserts=upserts, settled=after.epoch == before.epoch
            )

        return self._read(work)
