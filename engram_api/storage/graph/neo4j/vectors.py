"""Vector catch-up reads on Neo4j: what changed in a user's vectors after a version, as a mixin of
``Neo4jGraphStore`` (the contract and the invariants are ``vectorsync``'s).

Writes mark their facts, entities and chunks with ``changed`` (``Q_APPLY_WRITES``, ``Q_BUMP``) and log the
ids they delete as ``(:Removal {user_id, version, ids})`` nodes (``Q_BUMP``); this reads both back through
the ``(user_id, changed)`` and ``(user_id, version)`` indexes in one statement, so a catch-up costs one
round trip and what changed, not the user's size.
"""

from __future__ import annotations

from engram_api.storage.faiss.sync import VectorChanges
from engram_api.storage.graph.neo4j.connection import Neo4jConnection
from engram_api.versions import Stamp

__all__ = ["Neo4jVectors"]

# One statement, one round trip (an auto-commit read, ``_read_one``): the stamp, the removals, the records,
# the stamp again, in that order for the user's one row (the order ``vectorsync`` relies on under read
# committed isolation).
Q_VECTOR_CHANGES = """
OPTIONAL MATCH (u:User {user_id: $user_id})
WITH coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version, u.vectors_from AS horizon
CALL () {
  OPTIONAL MATCH (r:Removal {user_id: $user_id}) WHERE r.version > $since
  UNWIND coalesce(r.ids, []) AS id
  RETURN collect(DISTINCT id) AS removed
}
CALL () {
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
  RETURN collect([node_id, kind, embedding]) AS upserts
}
OPTIONAL MATCH (after:User {user_id: $user_id})
RETURN epoch, version, horizon, removed, upserts, coalesce(after.epoch, 0) AS epoch_after
"""


class Neo4jVectors(Neo4jConnection):
    """``vector_changes`` of the graph-store contract on Neo4j."""

    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        (row,) = self._read_one(Q_VECTOR_CHANGES, {"user_id": user_id, "since": since})
        horizon = row["horizon"]
        return VectorChanges(
            stamp=Stamp(int(row["epoch"]), int(row["version"])),
            horizon=None if horizon is None else int(horizon),
            removed=tuple(row["removed"]),
            upserts=[(node, kind, embedding) for node, kind, embedding in row["upserts"]],
            settled=int(row["epoch_after"]) == int(row["epoch"]),
        )
