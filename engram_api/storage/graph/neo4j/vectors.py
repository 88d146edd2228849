"""Vector catch-up reads on Neo4j: what changed in a user's vectors after a version, as a mixin of
``Neo4jGraphStore`` (the contract and the invariants are ``vectorsync``'s).

Writes mark their facts, entities and chunks with ``changed`` (``Q_APPLY_WRITES``, ``Q_BUMP``) and log the
ids they delete as ``(:Removal {user_id, version, ids})`` nodes (``Q_BUMP``); this reads both back through
the ``(user_id, changed)`` and ``(user_id, version)`` indexes in one statement, so a catch-up costs one
round trip and what changed, not the user's size. ``Q_USER_CHANGES`` is the same statement with the facts
and chunks a reader's snapshot lacks (``Q_CHANGED_FACTS``, ``Q_CHANGED_CHUNKS``): a reader holding both
copies of a user catches both up in that one round trip (``engram_api.reader.catchup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_api.storage.faiss.sync import UserChanges, VectorChanges
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j import rows as shape
from engram_api.storage.graph.neo4j.connection import Neo4jConnection
from engram_api.versions import Stamp

if TYPE_CHECKING:
    from neo4j import Record

__all__ = ["Q_APPLY_WRITES_CHANGES", "Neo4jVectors", "user_changes_of"]

# One statement, one round trip (an auto-commit read, ``_read_one``): the stamp, the removals, the records,
# the stamp again, in that order for the user's one row (the order ``vectorsync`` relies on under read
# committed isolation).
_HEAD = (
    """
OPTIONAL MATCH (u:User {user_id: $user_id})
WITH coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version, u.vectors_from AS horizon,
     coalesce(u.removed, 0) AS removed_at
"""
    + cy.removed_since("removed")
    + """CALL () {
  CALL () {
    MATCH (f:Fact {user_id: $user_id}) WHERE f.changed > $since AND f.embedding IS NOT NULL
    RETURN f.id AS node_id, 'fact' AS kind, f.embedding AS embedding, f.token_states AS states
    UNION ALL
    MATCH (e:Entity {user_id: $user_id}) WHERE e.changed > $since AND e.embedding IS NOT NULL
    RETURN e.id AS node_id, 'entity' AS kind, e.embedding AS embedding, null AS states
    UNION ALL
    MATCH (c:Chunk {user_id: $user_id}) WHERE c.changed > $since AND c.embedding IS NOT NULL
    RETURN c.id AS node_id, 'episode' AS kind, c.embedding AS embedding, c.token_states AS states
  }
  RETURN collect([node_id, kind, embedding, states]) AS upserts
}
"""
)
_TAIL = """
OPTIONAL MATCH (after:User {user_id: $user_id})
RETURN epoch, version, horizon, removed_at, removed, upserts, coalesce(after.epoch, 0) AS epoch_after"""
Q_VECTOR_CHANGES = _HEAD + _TAIL
# The snapshot's records after the vectors, before the second stamp read: what ``UserChanges`` holds.
Q_USER_CHANGES = (
    _HEAD
    + f"CALL () {{ CALL () {{ {cy.Q_CHANGED_FACTS} }} RETURN collect(row) AS facts }}\n"
    + f"CALL () {{ CALL () {{ {episodes_cypher.Q_CHANGED_CHUNKS} }} RETURN collect(row) AS chunks }}\n"
    + _TAIL
    + ", facts, chunks"
)


# A write's statement (``Neo4jGraphStore.apply``) followed by the read of the user's changes after ``$since``
# in the same statement, for the change feed (``Fence.changes_since``): it sees its own writes, under the
# user's lock, so it returns what ``user_changes`` would right after the commit, with no round trip of its own.
Q_APPLY_WRITES_CHANGES = cy.Q_APPLY_WRITES + "WITH count(*) AS written\n" + Q_USER_CHANGES


class Neo4jVectors(Neo4jConnection):
    """``vector_changes`` and ``user_changes`` of the graph-store contract on Neo4j."""

    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        (row,) = self._read_one(Q_VECTOR_CHANGES, {"user_id": user_id, "since": since})
        return _vectors(row)

    def user_changes(self, user_id: str, since: int) -> UserChanges:
        (row,) = self._read_one(Q_USER_CHANGES, {"user_id": user_id, "since": since})
        return user_changes_of(row)


def user_changes_of(row: Record) -> UserChanges:
    """The ``UserChanges`` of a row of ``Q_USER_CHANGES`` (or ``Q_APPLY_WRITES_CHANGES``)."""
    return UserChanges(
        vectors=_vectors(row),
        removed=int(row["removed_at"]),
        facts=shape.live_facts(row["facts"]),
        chunks=shape.live_chunks(row["chunks"]),
    )


def _vectors(row: Record) -> VectorChanges:
    horizon = row["horizon"]
    return VectorChanges(
        stamp=Stamp(int(row["epoch"]), int(row["version"])),
        horizon=None if horizon is None else int(horizon),
        removed=tuple(row["removed"]),
        upserts=[(node, kind, embedding) for node, kind, embedding, _ in row["upserts"]],
        settled=int(row["epoch_after"]) == int(row["epoch"]),
        states={node: bytes(states) for node, _, _, states in row["upserts"] if states is not None},
    )
