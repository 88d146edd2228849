"""The Cypher of a write: apply's two statements (``Q_APPLY_LOCK``, ``Q_APPLY_WRITES``) and the write fence
every writer checks (``FENCE_LOCK``, ``Q_FENCE``), with the reads of the user's stamp.

Invariants: the package's (``neo4j.cypher``): every query filters on ``$user_id``, and model-provided text
is only ever a parameter.
"""

from __future__ import annotations

from engram_api.storage.graph.neo4j.cypher.schema import ENTITY_TIMES, EPISODE_TIMES, FACT_TIMES
from engram_api.storage.graph.neo4j.episodes import CHUNK_TIMES, set_times

__all__ = [
    "FENCE_LOCK",
    "Q_APPLY_LOCK",
    "Q_APPLY_WRITES",
    "Q_FENCE",
    "Q_STAMP",
    "Q_VERSION",
]

# The fence's check: take the user node's write lock first (the documented dummy-property idiom), so
# no other writer can move the stamp between this check and our commit. It opens ``Q_FENCE`` and the
# statements that check the fence themselves (``Neo4jConnection._write_locking``).
FENCE_LOCK = """
OPTIONAL MATCH (found:User {user_id: $user_id})
FOREACH (_ IN CASE WHEN found IS NULL THEN [] ELSE [1] END | SET found._lock = true REMOVE found._lock)
WITH coalesce(found.epoch, 0) AS found_epoch, coalesce(found.version, 0) AS found_version
"""
# Taking the user's write lock first serializes every writer of one user, so the episode check
# below cannot race with a concurrent apply of the same message.
# An apply's transaction is two statements (each statement is a round trip and ~1.3 ms of the server's
# CPU, measured): the fence's lock and check with the user's version, the idempotency and reference
# checks, then every write of the plan in one statement; the stamp it leaves is the first one's. Their
# lists are padded (``plan_rows``, ``plan_list``) into one of Neo4j's list-size planning buckets, with
# nulls and "" that the queries skip.
Q_APPLY_LOCK = (
    FENCE_LOCK
    + """
MERGE (u:User {user_id: $user_id})
ON CREATE SET u.version = 0, u.epoch = $epoch, u.prompt_tokens = 0, u.completion_tokens = 0, u.cost_usd = 0.0,
              u.llm_calls = 0, u.created_at = $now
SET u.vectors_from = coalesce(u.vectors_from, u.version)
SET u.version = u.version + 1,
    u.prompt_tokens = u.prompt_tokens + $usage.prompt_tokens,
    u.completion_tokens = u.completion_tokens + $usage.completion_tokens,
    u.cost_usd = u.cost_usd + $usage.cost_usd,
    u.llm_calls = u.llm_calls + $usage.llm_calls,
    u.updated_at = $now
RETURN found_epoch, found_version, coalesce(u.epoch, 0) AS epoch, u.version AS version,
       EXISTS { MATCH (:Episode {user_id: $user_id, id: $episode_id}) } AS applied,
       COLLECT { UNWIND $entity_ids AS rid
                 WITH rid WHERE rid <> "" AND NOT EXISTS { MATCH (:Entity {user_id: $user_id, id: rid}) }
                 RETURN rid } AS missing
"""
)
Q_APPLY_WRITES = f"""
CREATE (ep:Episode) SET ep = $episode, {set_times("ep", "$episode", EPISODE_TIMES)}
WITH ep
CALL (ep) {{
  UNWIND $chunks AS row
  WITH row WHERE row IS NOT NULL
  CREATE (c:Chunk) SET c = row, {set_times("c", "row", CHUNK_TIMES)}, c.changed = $version
  CREATE (c)-[:PART_OF]->(ep)
}}
CALL (ep) {{
  UNWIND $entities AS row
  WITH row WHERE row IS NOT NULL
  CREATE (e:Entity) SET e = row.props, {set_times("e", "row.props", ENTITY_TIMES)}, e.changed = $version
  CREATE (e)-[:FROM]->(ep)
  FOREACH (norm IN row.norms | CREATE (e)-[:HAS_ALIAS]->(:Alias {{user_id: $user_id, norm: norm}}))
  FOREACH (_ IN CASE WHEN size(row.props.aliases) > 0 OR row.props.summary <> '' THEN [1] ELSE [] END |
    CREATE (:EntityEdit {{user_id: $user_id, entity_id: e.id, episode_id: ep.id, seq: $version,
                         added: row.props.aliases,
                         summary_set: CASE WHEN row.props.summary = '' THEN null ELSE row.props.summary END}}))
}}
CALL () {{
  UNWIND $entity_changes AS c
  WITH c WHERE c IS NOT NULL
  MATCH (e:Entity {{user_id: $user_id, id: c.id}})
  WITH c, e, [a IN c.add_aliases WHERE NOT a IN coalesce(e.aliases, [])] AS added
  FOREACH (_ IN CASE WHEN size(added) > 0 OR c.summary IS NOT NULL THEN [1] ELSE [] END |
    CREATE (:EntityEdit {{user_id: $user_id, entity_id: e.id, episode_id: $episode.id, seq: $version,
                         added: added, summary_set: c.summary, replaced: e.summary}}))
  SET e.aliases = reduce(acc = coalesce(e.aliases, []), a IN c.add_aliases |
                         CASE WHEN a IN acc THEN acc ELSE acc + a END),
      e.summary = coalesce(c.summary, e.summary),
      e.label = coalesce(c.label, e.label),
      e.updated_at = $now
  FOREACH (norm IN c.norms | MERGE (e)-[:HAS_ALIAS]->(:Alias {{user_id: $user_id, norm: norm}}))
}}
CALL (ep) {{
  UNWIND $facts AS row
  WITH row WHERE row IS NOT NULL
  MATCH (s:Entity {{user_id: $user_id, id: row.props.subject_id}})
  CREATE (f:Fact) SET f = row.props, {set_times("f", "row.props", (*FACT_TIMES, "archive_due_at"))}, f.changed = $version
  CREATE (f)-[:SUBJECT]->(s)
  CREATE (f)-[:FROM]->(ep)
  WITH f, row
  OPTIONAL MATCH (o:Entity {{user_id: $user_id, id: row.props.object_id}})
  FOREACH (_ IN CASE WHEN o IS NULL THEN [] ELSE [1] END | CREATE (f)-[:OBJECT]->(o))
}}
CALL () {{
  UNWIND $fact_changes AS c
  WITH c WHERE c IS NOT NULL
  MATCH (f:Fact {{user_id: $user_id, id: c.id}})
  SET {set_times("f", "c", ["valid_until"])}, f.superseded_by = c.superseded_by, f.updated_at = $now,
      f.changed = $version
}}
CALL (ep) {{
  UNWIND $reinforced AS fid
  MATCH (f:Fact {{user_id: $user_id, id: fid}})
  SET f.strength = 1.0, f.archived = false, f.last_decay_at = $now, f.archive_due_at = $restated,
      f.updated_at = $now, f.changed = $version
  MERGE (f)-[:FROM]->(ep)
}}
CALL (ep) {{
  UNWIND $mentioned AS eid
  MATCH (e:Entity {{user_id: $user_id, id: eid}})
  MERGE (e)-[:FROM]->(ep)
}}
CALL (ep) {{
  UNWIND $linked AS fid
  MATCH (f:Fact {{user_id: $user_id, id: fid}})
  MERGE (f)-[:FROM]->(ep)
  SET f.changed = $version
}}
"""

# ---------------------------------------------------------------------------------------- stamp
Q_VERSION = "MATCH (u:User {user_id: $user_id}) RETURN u.version AS version"
Q_STAMP = "MATCH (u:User {user_id: $user_id}) RETURN coalesce(u.epoch, 0) AS epoch, u.version AS version"
Q_FENCE = FENCE_LOCK + "RETURN found_epoch AS epoch, found_version AS version"
