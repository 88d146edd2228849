"""What each message did to an entity, so that forgetting the message undoes it (Neo4j side).

Apply (``neo4j_cypher.Q_APPLY_WRITES``) records one ``(:EntityEdit {user_id, entity_id, episode_id, seq,
added, summary_set, replaced})`` per entity a message created or changed. Forgetting the message runs
``revert_edits`` in the forget's transaction, before the episode goes: the rules are
``forgetting.revert_edit``'s and ``sqlite_edits``' (the SQLite side) says them in full. Topic clusters
holding a forgotten fact or entity are dropped (``drop_clusters``); the next hierarchy run rebuilds them.
"""

from __future__ import annotations

from datetime import datetime

from neo4j import ManagedTransaction

from engram_api.storage.graph.forgetting import revert_edit

__all__ = ["drop_clusters", "revert_edits"]

_EDITS = """
MATCH (x:EntityEdit {user_id: $user_id, episode_id: $episode_id})
MATCH (e:Entity {user_id: $user_id, id: x.entity_id})
RETURN x.entity_id AS entity_id, x.added AS added, x.summary_set AS summary_set, x.replaced AS replaced,
       coalesce(e.aliases, []) AS aliases, coalesce(e.summary, '') AS summary
ORDER BY x.seq DESC
"""
_REVERT = """
MATCH (e:Entity {user_id: $user_id, id: $row.entity_id})
SET e.aliases = $row.aliases, e.summary = $row.summary, e.updated_at = $now
WITH e
CALL (e) {
  MATCH (e)-[:HAS_ALIAS]->(a:Alias) WHERE a.norm IN $row.drop_norms
  DETACH DELETE a
}
WITH e WHERE $row.summary_set IS NOT NULL
MATCH (y:EntityEdit {user_id: $user_id, entity_id: e.id})
WHERE y.episode_id <> $episode_id AND y.replaced = $row.summary_set
SET y.replaced = $row.replaced
"""
_FORGET_EDITS = "MATCH (x:EntityEdit {user_id: $user_id, episode_id: $episode_id}) DELETE x"
_DROP_CLUSTERS = """
MATCH (c:Cluster {user_id: $user_id})-[:HAS_MEMBER]->(n {user_id: $user_id})
WHERE n.id IN $ids
WITH DISTINCT c
DETACH DELETE c
"""


def revert_edits(tx: ManagedTransaction, user_id: str, episode_id: str, now: datetime) -> list[str]:
    """Undo the episode's entity edits, newest first, and delete them; the ids of the entities changed."""
    params = {"user_id": user_id, "episode_id": episode_id}
    changed: set[str] = set()
    for row in list(tx.run(_EDITS, params)):
        revert = revert_edit(
            row["entity_id"],
            added=list(row["added"] or []),
            summary_set=row["summary_set"],
            replaced=row["replaced"],
            aliases=list(row["aliases"]),
            summary=row["summary"],
        )
        tx.run(_REVERT, params, row=revert.model_dump(), now=now).consume()
        changed.add(revert.entity_id)
    tx.run(_FORGET_EDITS, params).consume()
    return sorted(changed)


def drop_clusters(tx: ManagedTransaction, user_id: str, member_ids: list[str]) -> None:
    """Drop the user's topic clusters with any of ``member_ids`` among their members."""
    tx.run(_DROP_CLUSTERS, user_id=user_id, ids=member_ids).consume()
