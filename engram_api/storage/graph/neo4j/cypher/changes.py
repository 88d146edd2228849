"""What a write leaves for the copies other processes hold, and the reads that keep those copies: the bump
that ends every write but apply's (``Q_BUMP``: the version, the change marks, the removal records and the
horizon), the changes since a version (``Q_CHANGES_STAMP``, ``Q_CHANGED_FACTS``: a reader's snapshot
refresh and a FAISS copy's catch-up), and the whole reads a copy is built from (``Q_USER_SIZE``,
``Q_USER_FACTS``, ``Q_VECTORS``).

Invariants: the package's (``neo4j.cypher``): every query filters on ``$user_id``, and model-provided text
is only ever a parameter.
"""

from __future__ import annotations

from engram_api.storage.graph.neo4j.cypher.schema import FACT

__all__ = [
    "Q_BUMP",
    "Q_CHANGED_FACTS",
    "Q_CHANGES_STAMP",
    "Q_USER_FACTS",
    "Q_USER_SIZE",
    "Q_VECTORS",
    "removed_since",
]

# Every write but apply's ends with this bump, which marks the facts and chunks the write created or
# changed ($facts, $chunks) with the version it commits, or the user's node with it when the write removed
# one ($removed): ``GraphStore.refresh_snapshot`` reads only what a reader's snapshot lacks. Apply marks its
# own records with its version (``Q_APPLY_WRITES``' $version). The ids a write deleted ($gone) become one
# removal record of that version, and records older than $retain versions go, the horizon following them
# (``vectorsync``: a FAISS copy catches up by these).
Q_BUMP = """
MATCH (u:User {user_id: $user_id})
SET u.vectors_from = coalesce(u.vectors_from, u.version)
SET u.version = u.version + 1, u.updated_at = $now
WITH u
SET u.removed = CASE WHEN $removed THEN u.version ELSE u.removed END
WITH u
CALL (u) { MATCH (f:Fact {user_id: $user_id}) WHERE f.id IN $facts SET f.changed = u.version }
CALL (u) { MATCH (c:Chunk {user_id: $user_id}) WHERE c.id IN $chunks SET c.changed = u.version }
FOREACH (_ IN CASE WHEN size($gone) > 0 THEN [1] ELSE [] END |
  CREATE (:Removal {user_id: $user_id, version: u.version, ids: $gone}))
WITH u
CALL (u) {
  MATCH (r:Removal {user_id: $user_id}) WHERE size($gone) > 0 AND r.version <= u.version - $retain DELETE r
}
SET u.vectors_from = CASE WHEN size($gone) > 0 AND u.version - $retain > u.vectors_from
                          THEN u.version - $retain ELSE u.vectors_from END
"""


def removed_since(alias: str) -> str:
    """A subquery binding ``alias`` to the ids the user's writes after ``$since`` removed (their removal
    records; complete from the user's horizon, ``vectorsync``)."""
    return f"""CALL () {{
  OPTIONAL MATCH (r:Removal {{user_id: $user_id}}) WHERE r.version > $since
  UNWIND coalesce(r.ids, []) AS id
  RETURN collect(DISTINCT id) AS {alias}
}}
"""


# The stamp, then the ids removed after $since and the horizon they are complete from.
Q_CHANGES_STAMP = f"""
OPTIONAL MATCH (u:User {{user_id: $user_id}})
{removed_since("gone")}RETURN coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version, coalesce(u.removed, 0) AS removed,
       u.vectors_from AS horizon, gone
"""
Q_USER_SIZE = """
CALL () { MATCH (f:Fact {user_id: $user_id}) RETURN count(f) AS facts }
CALL () { MATCH (c:Chunk {user_id: $user_id}) RETURN count(c) AS chunks }
RETURN facts + chunks AS n
"""
Q_USER_FACTS = f"MATCH (f:Fact {{user_id: $user_id}}) RETURN {FACT} AS row"
Q_CHANGED_FACTS = f"MATCH (f:Fact {{user_id: $user_id}}) WHERE f.changed > $since RETURN {FACT} AS row"
Q_VECTORS = """
CALL () {
  MATCH (f:Fact {user_id: $user_id}) WHERE f.embedding IS NOT NULL
  RETURN f.id AS node_id, 'fact' AS kind, f.embedding AS embedding, f.token_states AS states
  UNION ALL
  MATCH (e:Entity {user_id: $user_id}) WHERE e.embedding IS NOT NULL
  RETURN e.id AS node_id, 'entity' AS kind, e.embedding AS embedding, null AS states
  UNION ALL
  MATCH (c:Chunk {user_id: $user_id}) WHERE c.embedding IS NOT NULL
  RETURN c.id AS node_id, 'episode' AS kind, c.embedding AS embedding, c.token_states AS states
}
RETURN node_id, kind, embedding, states
"""
