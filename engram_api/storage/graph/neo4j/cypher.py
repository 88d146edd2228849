"""The Cypher of the Neo4j backend (``neo4j_store``): schema statements and every query, as constants.

Invariants: every query filters on ``$user_id`` (or a ``Weights`` scope); model-provided text is only
ever a parameter, never part of a query string; the only text formatted in is a constant of this
module (projections), ``validity``'s fragments or a validated int (``Q_GRAPH_STEP``'s length bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from engram_api.models import FeedbackRow
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j.episodes import CHUNK_TIMES, set_times
from engram_api.storage.graph.validity import overlaps_cypher, valid_at_cypher

__all__ = [
    "BEGINNING",
    "END",
    "ENTITY_TIMES",
    "EPISODE_TIMES",
    "FACT_TIMES",
    "FENCE_LOCK",
    "FORGET_USER_LABELS",
    "NO_ID",
    "PLAN_LIST_MIN",
    "Q_APPLY_LOCK",
    "Q_APPLY_WRITES",
    "Q_BUMP",
    "Q_CHANGED_FACTS",
    "Q_CHANGES_STAMP",
    "Q_CLUSTERS",
    "Q_CLUSTERS_CREATE",
    "Q_CLUSTERS_DELETE",
    "Q_CLUSTERS_LINK_ENTITIES",
    "Q_CLUSTERS_LINK_FACTS",
    "Q_CLUSTER_MEMBERS",
    "Q_COUNT_FACTS",
    "Q_DECAY_BATCH",
    "Q_DECAY_SET",
    "Q_EPISODES",
    "Q_EPISODE_LINKS",
    "Q_EXTRACTION_CONTEXT",
    "Q_FEEDBACK_ADD",
    "Q_FEEDBACK_ALL",
    "Q_FEEDBACK_USER",
    "Q_FENCE",
    "Q_FORGET_EPISODE",
    "Q_FORGET_FACTS",
    "Q_FORGET_FACT_PLAN",
    "Q_FORGET_LINKS",
    "Q_FORGET_ORPHANS",
    "Q_FORGET_PLAN",
    "Q_FORGET_RESTORE",
    "Q_FORGET_USER_SCAN",
    "Q_GET_ENTITIES",
    "Q_GET_FACTS",
    "Q_GRAPH_STEP",
    "Q_HISTORY",
    "Q_IS_APPLIED",
    "Q_LOOKUP_ENTITIES",
    "Q_PAGE_ENTITIES",
    "Q_PAGE_FACTS",
    "Q_REINFORCE",
    "Q_SCHEMA_VERSION",
    "Q_SET_SCHEMA_VERSION",
    "Q_STAMP",
    "Q_STATS",
    "Q_USERS",
    "Q_USER_FACTS",
    "Q_USER_SIZE",
    "Q_VECTORS",
    "Q_VERSION",
    "Q_WEIGHTS_LOAD",
    "Q_WEIGHTS_SAVE",
    "SCHEMA",
    "SCHEMA_RACE_CODES",
    "SCHEMA_VERSION",
    "plan_bucket",
    "plan_list",
    "plan_rows",
]

SCHEMA = (
    "CREATE CONSTRAINT engram_user_id IF NOT EXISTS FOR (n:User) REQUIRE n.user_id IS UNIQUE",
    # Message ids are only unique per user, so the episode key is (user_id, id).
    "CREATE CONSTRAINT engram_episode_key IF NOT EXISTS FOR (n:Episode) REQUIRE (n.user_id, n.id) IS UNIQUE",
    "CREATE CONSTRAINT engram_entity_id IF NOT EXISTS FOR (n:Entity) REQUIRE n.id IS UNIQUE",
    "CREATE CONSTRAINT engram_fact_id IF NOT EXISTS FOR (n:Fact) REQUIRE n.id IS UNIQUE",
    "CREATE CONSTRAINT engram_cluster_id IF NOT EXISTS FOR (n:Cluster) REQUIRE n.id IS UNIQUE",
    "CREATE CONSTRAINT engram_weights_scope IF NOT EXISTS FOR (n:Weights) REQUIRE n.scope IS UNIQUE",
    "CREATE INDEX engram_episode_user IF NOT EXISTS FOR (n:Episode) ON (n.user_id)",
    "CREATE INDEX engram_entity_user IF NOT EXISTS FOR (n:Entity) ON (n.user_id)",
    "CREATE INDEX engram_entity_norm_name IF NOT EXISTS FOR (n:Entity) ON (n.norm_name)",
    # entity lookups by name are always one user's (_BY_NAME in Q_FIND_ENTITIES and Q_LOOKUP_ENTITIES, Q_HISTORY)
    "CREATE INDEX engram_entity_user_norm IF NOT EXISTS FOR (n:Entity) ON (n.user_id, n.norm_name)",
    "CREATE INDEX engram_alias_norm IF NOT EXISTS FOR (n:Alias) ON (n.norm)",
    "CREATE INDEX engram_alias_user IF NOT EXISTS FOR (n:Alias) ON (n.user_id)",
    "CREATE INDEX engram_fact_user IF NOT EXISTS FOR (n:Fact) ON (n.user_id)",
    "CREATE INDEX engram_fact_slot IF NOT EXISTS FOR (n:Fact) ON (n.subject_id, n.predicate)",
    # recall's graph step reads an entity's facts in this order (Q_GRAPH_STEP: the early cut by hop)
    "CREATE INDEX engram_fact_subject_rank IF NOT EXISTS FOR (n:Fact) ON (n.subject_id, n.importance, n.id)",
    "CREATE INDEX engram_fact_object_rank IF NOT EXISTS FOR (n:Fact) ON (n.object_id, n.importance, n.id)",
    # a reader's snapshot refresh reads the records written since its stamp (Q_CHANGED_FACTS, Q_CHANGED_CHUNKS)
    "CREATE INDEX engram_fact_changed IF NOT EXISTS FOR (n:Fact) ON (n.user_id, n.changed)",
    "CREATE INDEX engram_chunk_changed IF NOT EXISTS FOR (n:Chunk) ON (n.user_id, n.changed)",
    # a FAISS copy's catch-up reads the vectors written and the ids removed since its version (``vectorsync``)
    "CREATE INDEX engram_entity_changed IF NOT EXISTS FOR (n:Entity) ON (n.user_id, n.changed)",
    "CREATE INDEX engram_removal_user IF NOT EXISTS FOR (n:Removal) ON (n.user_id, n.version)",
    "CREATE INDEX engram_cluster_user IF NOT EXISTS FOR (n:Cluster) ON (n.user_id)",
    "CREATE INDEX engram_entity_edit_episode IF NOT EXISTS FOR (n:EntityEdit) ON (n.user_id, n.episode_id)",
    "CREATE INDEX engram_entity_edit_entity IF NOT EXISTS FOR (n:EntityEdit) ON (n.user_id, n.entity_id)",
    "CREATE INDEX engram_feedback_user IF NOT EXISTS FOR (n:Feedback) ON (n.user_id)",
    "CREATE INDEX engram_feedback_created IF NOT EXISTS FOR (n:Feedback) ON (n.created_at)",
    *episodes_cypher.SCHEMA,
    "CREATE CONSTRAINT engram_schema_name IF NOT EXISTS FOR (n:EngramSchema) REQUIRE n.name IS UNIQUE",
)
# The schema's version: bumped with every change to SCHEMA or to the data migrations `engram migrate` runs
# (``Neo4jConnection.migrate``), which records it in the one :EngramSchema node. A process checks that node
# at its first query and refuses a database at another version (``SchemaNotMigratedError``).
SCHEMA_VERSION = 1
Q_SCHEMA_VERSION = "MATCH (s:EngramSchema {name: 'engram'}) RETURN s.version AS version"
Q_SET_SCHEMA_VERSION = """
MERGE (s:EngramSchema {name: 'engram'}) SET s.version = $version, s.migrated_at = datetime()
"""
# Concurrent start-ups race on IF NOT EXISTS; the loser's error means the rule is already there.
SCHEMA_RACE_CODES = frozenset(
    {
        "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists",
        "Neo.ClientError.Schema.ConstraintAlreadyExists",
        "Neo.ClientError.Schema.IndexAlreadyExists",
    }
)

_FACT_FIELDS = (
    "id", "user_id", "subject_id", "predicate", "object_id", "statement", "memory_type", "importance",
    "strength", "single_valued", "valid_from", "valid_until", "superseded_by", "archived",
    "last_decay_at", "created_at", "updated_at",
)  # fmt: skip
FACT_TIMES = ("valid_from", "valid_until", "last_decay_at", "created_at", "updated_at")
ENTITY_TIMES = ("created_at", "updated_at")
EPISODE_TIMES = ("event_time", "created_at", "updated_at")
_ENTITY_FIELDS = (
    "id", "user_id", "name", "norm_name", "label", "aliases", "summary", "created_at", "updated_at",
)  # fmt: skip


def _projection(var: str, fields: Sequence[str], extra: str, micros: Sequence[str] = ()) -> str:
    """A map projection of ``var``: ``fields`` as they are, ``micros`` as epoch microseconds."""
    props = [f".{name}" for name in fields if name not in micros]
    props += [f"{name}: {episodes_cypher.MICROS.format(t=f'{var}.{name}')}" for name in micros]
    return f"{var} {{{', '.join(props)}{extra}}}"


_FACT_JOINS = (
    ", subject_name: COLLECT { MATCH (f)-[:SUBJECT]->(x:Entity) WHERE x.user_id = $user_id "
    "RETURN x.name }[0]"
    ", object_name: COLLECT { MATCH (f)-[:OBJECT]->(x:Entity) WHERE x.user_id = $user_id "
    "RETURN x.name }[0]"
    ", source_ids: COLLECT { MATCH (f)-[:FROM]->(ep:Episode) WHERE ep.user_id = $user_id "
    "RETURN ep.id ORDER BY ep.id }"
)
# Cypher map projections of a fact `f` (never with its embedding) and an entity `e`. A fact's times come
# back as epoch microseconds (``neo4j_rows.fact_record`` turns them into datetimes): the driver's
# hydration of five temporal values per fact into neo4j.time objects was ~20 of a 100K-fact user's ~28 ms
# graph step on the client (cProfile: 254 hydrate_datetime calls per step), as it had been for chunks.
_FACT = _projection("f", _FACT_FIELDS, _FACT_JOINS, micros=FACT_TIMES)
# Entities' and episodes' times come back the same way (``neo4j_rows.entity_record``, ``episode_record``).
# With that, and no embeddings (``GraphStore.lookup_entities``), apply's lookup of nine entities costs
# 1.15 ms of client CPU instead of 2.9 (one process, interleaved, against one server).
_ENTITY = _projection("e", _ENTITY_FIELDS, "", micros=ENTITY_TIMES)
_ENTITY_EMB = _projection("e", _ENTITY_FIELDS, ", .embedding", micros=ENTITY_TIMES)

# --------------------------------------------------------------------------------------- apply
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
  CREATE (f:Fact) SET f = row.props, {set_times("f", "row.props", FACT_TIMES)}, f.changed = $version
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
  SET f.strength = 1.0, f.archived = false, f.updated_at = $now, f.changed = $version
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

# ---------------------------------------------------------------------------------------- read
Q_VERSION = "MATCH (u:User {user_id: $user_id}) RETURN u.version AS version"
Q_STAMP = "MATCH (u:User {user_id: $user_id}) RETURN coalesce(u.epoch, 0) AS epoch, u.version AS version"
Q_FENCE = FENCE_LOCK + "RETURN found_epoch AS epoch, found_version AS version"
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
Q_CHANGES_STAMP = """
OPTIONAL MATCH (u:User {user_id: $user_id})
RETURN coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version, coalesce(u.removed, 0) AS removed
"""
Q_EPISODES = "MATCH (ep:Episode {user_id: $user_id}) RETURN ep {.*} AS row"
# Links as (owner, kind, node id): the contract groups and sorts them (``base.Link``).
Q_EPISODE_LINKS = """
MATCH (n {user_id: $user_id})-[:FROM]->(ep:Episode {user_id: $user_id})
RETURN ep.id AS owner, CASE WHEN n:Fact THEN 'fact' ELSE 'entity' END AS kind, n.id AS node_id
"""
Q_IS_APPLIED = "RETURN EXISTS { MATCH (:Episode {user_id: $user_id, id: $episode_id}) } AS applied"
# The user's entities whose norm_name or a normalized alias is in $names, as `e` (inside CALL () { }).
_BY_NAME = """
  MATCH (e:Entity {user_id: $user_id}) WHERE e.norm_name IN $names RETURN e
  UNION
  MATCH (a:Alias {user_id: $user_id})<-[:HAS_ALIAS]-(e:Entity {user_id: $user_id})
  WHERE a.norm IN $names RETURN e
"""
# The reads by id below (consolidation's lookup, extract's context) seek the unique id index by hint: on
# statistics not yet caught up with a user's new nodes the planner scanned the user's index instead (5,000
# entities: 5,000 db hits against 17; docs/benchmarks/history.md "Stop 39").
# By id or by name in one round trip (UNION returns each entity once).
Q_LOOKUP_ENTITIES = f"""
CALL () {{
  MATCH (e:Entity) USING INDEX e:Entity(id) WHERE e.id IN $ids AND e.user_id = $user_id RETURN e
  UNION{_BY_NAME}}}
RETURN {_ENTITY} AS row ORDER BY e.norm_name, e.id
"""
# Each of the extract stage's reads as a match and its projection, the four together as COLLECT subqueries
# in one round trip (Q_EXTRACTION_CONTEXT); the reads by id are queries of their own too (``AS row``).
_ENTITIES_BY_ID = (
    "MATCH (e:Entity) USING INDEX e:Entity(id) WHERE e.id IN $entity_ids AND e.user_id = $user_id"
    " WITH e ORDER BY e.norm_name, e.id"
)
_FACTS_BY_ID = (
    "MATCH (f:Fact) USING INDEX f:Fact(id) WHERE f.id IN $fact_ids AND f.user_id = $user_id"
    " WITH f ORDER BY f.created_at, f.id"
)
_SLOT_FACTS = """UNWIND $slots AS slot
MATCH (f:Fact {subject_id: slot[0], predicate: slot[1]}) WHERE f.user_id = $user_id
WITH DISTINCT f ORDER BY f.valid_from, f.created_at, f.id"""
_RECENT_EPISODES = """MATCH (ep:Episode {user_id: $user_id}) WHERE ep.event_time < $before
WITH ep ORDER BY ep.event_time DESC, ep.id DESC LIMIT $limit"""
_EPISODE_FIELDS = ("id", "user_id", "content", "role", "metadata", *EPISODE_TIMES)
_EPISODE = _projection("ep", _EPISODE_FIELDS, "", micros=EPISODE_TIMES)
_EXTRACT_READS = {
    "entities": (_ENTITIES_BY_ID, _ENTITY),
    "facts": (_FACTS_BY_ID, _FACT),
    "slot_facts": (_SLOT_FACTS, _FACT),
    "episodes": (_RECENT_EPISODES, _EPISODE),
}
Q_GET_ENTITIES = f"{_ENTITIES_BY_ID}\nRETURN {_ENTITY_EMB} AS row"
Q_GET_FACTS = f"{_FACTS_BY_ID}\nRETURN {_FACT} AS row"
Q_EXTRACTION_CONTEXT = "RETURN " + ",\n  ".join(
    f"COLLECT {{ {match}\n  RETURN {projection} }} AS {name}" for name, (match, projection) in _EXTRACT_READS.items()
)
Q_HISTORY = f"""
CALL () {{
  MATCH (e:Entity {{user_id: $user_id, norm_name: $norm}}) RETURN e
  UNION
  MATCH (:Alias {{user_id: $user_id, norm: $norm}})<-[:HAS_ALIAS]-(e:Entity {{user_id: $user_id}})
  RETURN e
}}
MATCH (f:Fact {{user_id: $user_id}})-[:SUBJECT]->(e)
WHERE $predicate IS NULL OR f.predicate = $predicate
WITH DISTINCT f ORDER BY f.valid_from DESC, f.created_at DESC, f.id DESC LIMIT $limit
RETURN {_FACT} AS row
"""
# Recall's graph step in ONE query. Neo4j plans a query again for every new shape of its parameters (a
# null where there was a date, an empty list where there was a non-empty one), and planning this one takes
# seconds on a loaded machine, so parameters keep one shape where they can: dates are never null
# ($at is as_of, else now; $since and $until default to the ends of time, BEGINNING and END) and every list carries "",
# which is no id, padded to at least PLAN_LIST_MIN entries (``plan_list``: Neo4j 5 plans again when a
# list's size crosses a power of ten, measured: 1, 2-10, 11-100, 101-1000, ...). First the seeds: $seeds plus the subject and object of each seed fact that passes
# recall's window (``fusion.TimeWindow.fact_ok``: valid at $at, overlapping [$since, $until): ``validity``). Then the expansion: Neo4j plans `min(length(p))` per (start, end) pair
# as a pruning breadth-first expand that visits each node once, at its shallowest depth, and stops at
# the length bound; a path may only pass through the user's nodes and facts valid at $at, so that
# depth is the fact's hop count. The per-seed minimum is taken first because Neo4j 5.26 folds a minimum
# grouped by `f` alone into the per-seed search and returns one row per (seed, fact). The length bound
# must be a literal: it is formatted in from a validated int. Early cut by hop: a seed with at least
# $per_seed valid facts at hop 0 keeps only hop-0 facts (its nearest), so it is never walked further.
# Those are read in the order of the (subject_id | object_id, importance, id) indexes, backwards, and
# the read stops after $per_seed valid ones per side: an entity with thousands of facts costs ~2x
# $per_seed index entries, not its degree (PROFILE at 100K facts per user: 45K db hits -> 2K). The hints
# keep the planner from the (subject_id, predicate) slot index, which it takes on a small graph. So a
# seed's nearest facts are ordered by (depth, importance descending, id descending): the index order.
# Before the seeds, the chunks the caller lacks: the facts of the $chunk_facts chunks' episodes (hydrated) and
# of the first $seed_chunk_count of $seed_chunks that are the user's (seed facts). Last, the records asked or
# reached that the caller does not know, and the $chunk_ids chunks. Each part ends in an aggregation, so one
# row always comes back.
# One side of a seed's hop-0 facts, its nearest first, read in the side's rank index order and cut at
# $per_seed valid ones (see the early cut by hop above).
_NEAREST_SIDE = f"""MATCH (f:Fact) USING INDEX f:Fact({{side}}, importance, id)
      WHERE f.{{side}} = s.id AND f.importance IS NOT NULL AND f.id IS NOT NULL
        AND f.user_id = $user_id AND {valid_at_cypher("f")}
      WITH f ORDER BY f.{{side}} DESC, f.importance DESC, f.id DESC LIMIT $per_seed
      RETURN f"""
Q_GRAPH_STEP = f"""
CALL () {{
  OPTIONAL MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id IN $chunk_facts
  CALL (c) {{ OPTIONAL {episodes_cypher.EXTRACTED} RETURN collect(f.id) AS of_chunk }}
  RETURN reduce(ids = [], more IN collect(of_chunk) | ids + more) AS sourced
}}
CALL () {{
  UNWIND range(0, size($seed_chunks) - 1) AS i
  MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id = $seed_chunks[i]
  WITH c, i ORDER BY i LIMIT $seed_chunk_count
  CALL (c) {{ OPTIONAL {episodes_cypher.EXTRACTED} RETURN collect(f.id) AS of_chunk }}
  RETURN reduce(ids = [], more IN collect(of_chunk) | ids + more) AS chunk_seeds
}}
CALL (chunk_seeds) {{
  OPTIONAL MATCH (sf:Fact {{user_id: $user_id}})
  WHERE sf.id IN $seed_facts + chunk_seeds AND {valid_at_cypher("sf")} AND {overlaps_cypher("sf")}
  WITH collect(sf.subject_id) + collect(sf.object_id) AS from_facts
  RETURN [x IN $seeds + from_facts WHERE NOT x IN $avoid] AS seeds
}}
CALL (seeds) {{
  MATCH (s:Entity {{user_id: $user_id}}) WHERE s.id IN seeds
  CALL (s) {{
    CALL (s) {{
      {_NEAREST_SIDE.format(side="subject_id")}
      UNION
      {_NEAREST_SIDE.format(side="object_id")}
    }}
    WITH f ORDER BY f.importance DESC, f.id DESC LIMIT $per_seed
    RETURN collect(f) AS first
  }}
  CALL (s, first) {{
    WITH first WHERE size(first) >= $per_seed
    UNWIND first AS f
    RETURN f, 1 AS depth
    UNION
    WITH s, first WHERE size(first) < $per_seed
    MATCH p = (s)-[:SUBJECT|OBJECT*1..{{max_len}}]-(f:Fact)
    WHERE all(n IN nodes(p) WHERE n.user_id = $user_id AND (NOT n:Fact OR {valid_at_cypher("n")})
                                   AND (n:Fact OR NOT n.id IN $avoid))
    RETURN f, min(length(p)) AS depth
  }}
  WITH s, f, depth
  ORDER BY depth, f.importance DESC, f.id DESC
  WITH s, collect({{f: f, depth: depth}})[..$per_seed] AS nearest
  UNWIND nearest AS near
  WITH near.f AS f, (min(near.depth) - 1) / 2 AS hops
  ORDER BY hops, f.importance DESC, f.id
  LIMIT $limit
  RETURN collect([f.id, hops]) AS hops
}}
CALL (hops, sourced, chunk_seeds) {{
  WITH [x IN $fact_ids + sourced + chunk_seeds + [h IN hops | h[0]] WHERE NOT x IN $known] AS wanted
  MATCH (f:Fact {{user_id: $user_id}}) WHERE f.id IN wanted
  RETURN collect({_FACT}) AS facts
}}
CALL () {{
  MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id IN $chunk_ids
  RETURN collect({episodes_cypher.CHUNK_ROW}) AS chunks
}}
RETURN hops, facts, chunks
"""
NO_ID = ""  # in every list parameter of the graph step, so none is ever empty
PLAN_LIST_MIN = 11  # the smallest size of the 11-100 bucket, where a recall's lists fall


def plan_list(ids: Iterable[str]) -> list[str]:
    """A list parameter of the graph step: ``ids`` once each, after NO_ID, padded with NO_ID to the
    11-100 size bucket, so that the lists of ordinary recalls share one plan."""
    out = [NO_ID, *dict.fromkeys(ids)]
    return out + [NO_ID] * (PLAN_LIST_MIN - len(out))


def plan_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """A list of rows for UNWIND, padded with nulls (which the query skips) to the 11-100 size bucket."""
    return [*rows, *[None] * (PLAN_LIST_MIN - len(rows))]


def plan_bucket(size: int) -> int:
    """Which of Neo4j's list-size planning buckets ``size`` falls in (1, 2-10, 11-100, ...)."""
    return len(str(size - 1)) if size > 1 else 0


# The open ends of a recall window as dates (``Q_GRAPH_STEP`` takes no null date).
BEGINNING = datetime(1, 1, 1, tzinfo=UTC)
END = datetime(9999, 12, 31, tzinfo=UTC)
Q_PAGE_FACTS = f"""
MATCH (f:Fact {{user_id: $user_id}})
WITH f ORDER BY f.created_at, f.id SKIP $skip LIMIT $limit
RETURN {_FACT} AS row
"""
Q_PAGE_ENTITIES = f"""
UNWIND $fact_ids AS fid
MATCH (:Fact {{user_id: $user_id, id: fid}})-[:SUBJECT|OBJECT]->(e:Entity {{user_id: $user_id}})
WITH DISTINCT e ORDER BY e.norm_name, e.id
RETURN {_ENTITY} AS row
"""
Q_COUNT_FACTS = "MATCH (f:Fact {user_id: $user_id}) RETURN count(f) AS n"
Q_USER_SIZE = """
CALL () { MATCH (f:Fact {user_id: $user_id}) RETURN count(f) AS facts }
CALL () { MATCH (c:Chunk {user_id: $user_id}) RETURN count(c) AS chunks }
RETURN facts + chunks AS n
"""
Q_USER_FACTS = f"MATCH (f:Fact {{user_id: $user_id}}) RETURN {_FACT} AS row"
Q_CHANGED_FACTS = f"MATCH (f:Fact {{user_id: $user_id}}) WHERE f.changed > $since RETURN {_FACT} AS row"
Q_STATS = f"""
OPTIONAL MATCH (u:User {{user_id: $user_id}})
CALL () {{
  MATCH (f:Fact {{user_id: $user_id}})
  RETURN count(f) AS facts,
         count(CASE WHEN {valid_at_cypher("f")} THEN 1 END) AS current_facts,
         count(CASE WHEN f.valid_until IS NOT NULL THEN 1 END) AS superseded_facts,
         count(CASE WHEN f.archived THEN 1 END) AS archived_facts
}}
RETURN u {{.version, .prompt_tokens, .completion_tokens, .cost_usd, .llm_calls}} AS user,
       facts, current_facts, superseded_facts, archived_facts,
       COUNT {{ MATCH (e:Entity {{user_id: $user_id}}) }} AS entities,
       COUNT {{ MATCH (ep:Episode {{user_id: $user_id}}) }} AS episodes,
       COUNT {{ MATCH (c:Chunk {{user_id: $user_id}}) }} AS episode_chunks,
       COUNT {{ MATCH (c:Cluster {{user_id: $user_id}}) }} AS clusters
"""
Q_VECTORS = """
CALL () {
  MATCH (f:Fact {user_id: $user_id}) WHERE f.embedding IS NOT NULL
  RETURN f.id AS node_id, 'fact' AS kind, f.embedding AS embedding
  UNION ALL
  MATCH (e:Entity {user_id: $user_id}) WHERE e.embedding IS NOT NULL
  RETURN e.id AS node_id, 'entity' AS kind, e.embedding AS embedding
  UNION ALL
  MATCH (c:Chunk {user_id: $user_id}) WHERE c.embedding IS NOT NULL
  RETURN c.id AS node_id, 'episode' AS kind, c.embedding AS embedding
}
RETURN node_id, kind, embedding
"""
Q_USERS = "MATCH (u:User) RETURN u.user_id AS user_id ORDER BY user_id"

# -------------------------------------------------------------------------------------- forget
Q_FORGET_PLAN = """
MATCH (ep:Episode {user_id: $user_id, id: $episode_id})
WITH ep, COLLECT {
  MATCH (ep)<-[:FROM]-(f:Fact {user_id: $user_id})
  WHERE NOT EXISTS { MATCH (f)-[:FROM]->(other:Episode) WHERE other <> ep }
  RETURN f.id
} AS doomed
RETURN doomed, COLLECT {
  MATCH (ep)<-[:FROM]-(e:Entity {user_id: $user_id}) RETURN e.id AS id
  UNION
  MATCH (f:Fact {user_id: $user_id})-[:SUBJECT|OBJECT]->(e:Entity {user_id: $user_id})
  WHERE f.id IN doomed RETURN e.id AS id
} AS candidates, COLLECT { MATCH (c:Chunk {user_id: $user_id}) WHERE c.episode_id = ep.id RETURN c.id } AS chunks
"""
Q_FORGET_FACT_PLAN = """
MATCH (f:Fact {user_id: $user_id, id: $fact_id})
RETURN [f.id] AS doomed, COLLECT { MATCH (f)-[:SUBJECT|OBJECT]->(e:Entity {user_id: $user_id}) RETURN e.id } AS candidates,
       [] AS chunks
"""
Q_FORGET_LINKS = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) WHERE f.id IN $doomed AND f.superseded_by IS NOT NULL
                 RETURN [f.id, f.superseded_by] } AS doomed_links,
       COLLECT { MATCH (g:Fact {user_id: $user_id}) WHERE g.superseded_by IN $doomed AND NOT g.id IN $doomed
                 RETURN [g.id, g.superseded_by] } AS older,
       COLLECT { UNWIND $doomed AS fid MATCH (f:Fact {user_id: $user_id, id: fid})
                 WHERE f.embedding IS NOT NULL RETURN f.id }
       + COLLECT { UNWIND $candidates AS eid MATCH (e:Entity {user_id: $user_id, id: eid})
                   WHERE e.embedding IS NOT NULL RETURN e.id } AS vectored
"""
Q_FORGET_RESTORE = """
UNWIND $rows AS r
MATCH (g:Fact {user_id: $user_id, id: r.fact_id})
SET g.superseded_by = r.successor,
    g.valid_until = CASE WHEN r.successor IS NULL THEN null ELSE g.valid_until END,
    g.updated_at = $now
"""
Q_FORGET_FACTS = """
UNWIND $doomed AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
DETACH DELETE f
"""
Q_FORGET_EPISODE = "MATCH (ep:Episode {user_id: $user_id, id: $episode_id}) DETACH DELETE ep"
Q_FORGET_ORPHANS = """
UNWIND $candidates AS eid
MATCH (e:Entity {user_id: $user_id, id: eid})
WHERE NOT EXISTS { MATCH (e)-[:FROM]->(:Episode) } AND NOT EXISTS { MATCH (e)<-[:SUBJECT|OBJECT]-(:Fact) }
WITH e, e.id AS id, COLLECT { MATCH (e)-[:HAS_ALIAS]->(a:Alias) RETURN a } AS aliases
FOREACH (a IN aliases | DETACH DELETE a)
DETACH DELETE e
RETURN id
"""
Q_FORGET_USER_SCAN = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) RETURN f.id } AS facts,
       COLLECT { MATCH (e:Entity {user_id: $user_id}) RETURN e.id } AS entities,
       COLLECT { MATCH (f:Fact {user_id: $user_id}) WHERE f.embedding IS NOT NULL RETURN f.id }
       + COLLECT { MATCH (e:Entity {user_id: $user_id}) WHERE e.embedding IS NOT NULL RETURN e.id } AS vectored,
       COUNT { MATCH (ep:Episode {user_id: $user_id}) } AS episodes
"""
# Labels are constants of this module; one statement per label keeps each delete on an index.
FORGET_USER_LABELS = (
    "Fact",
    "Alias",
    "Entity",
    "EntityEdit",
    "Chunk",
    "Episode",
    "Cluster",
    "Feedback",
    "Removal",
    "User",
)

# --------------------------------------------------------------------------------- maintenance
Q_DECAY_BATCH = """
MATCH (f:Fact {user_id: $user_id})
WHERE f.archived = false AND coalesce(f.last_decay_at, f.created_at) < $now
WITH f ORDER BY f.id LIMIT $batch
RETURN f.id AS id, f.strength AS strength, coalesce(f.last_decay_at, f.created_at) AS since
"""
Q_DECAY_SET = """
UNWIND $rows AS r
MATCH (f:Fact {user_id: $user_id, id: r.id})
SET f.strength = r.strength, f.archived = r.archived, f.last_decay_at = $now, f.updated_at = $now
"""
Q_REINFORCE = """
UNWIND $ids AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
WITH DISTINCT f
WITH f, CASE WHEN f.strength + $amount > 1.0 THEN 1.0 ELSE f.strength + $amount END AS strength
WHERE strength <> f.strength OR f.archived
SET f.strength = strength, f.archived = false, f.updated_at = $now
RETURN count(f) AS changed
"""
Q_CLUSTERS_DELETE = "MATCH (c:Cluster {user_id: $user_id}) DETACH DELETE c"
Q_CLUSTERS_CREATE = "UNWIND $rows AS row CREATE (c:Cluster) SET c = row"
Q_CLUSTERS_LINK_FACTS = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (f:Fact {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(f)
"""
Q_CLUSTERS_LINK_ENTITIES = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (e:Entity {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(e)
"""
Q_CLUSTERS = "MATCH (c:Cluster {user_id: $user_id}) RETURN c {.*} AS row"
Q_CLUSTER_MEMBERS = """
MATCH (c:Cluster {user_id: $user_id})-[:HAS_MEMBER]->(n {user_id: $user_id})
RETURN c.id AS owner, CASE WHEN n:Fact THEN 'fact' ELSE 'entity' END AS kind, n.id AS node_id
"""
Q_FEEDBACK_ADD = "UNWIND $rows AS row CREATE (fb:Feedback) SET fb = row"
_FEEDBACK = _projection("fb", tuple(FeedbackRow.model_fields), "")
# `seq` (insertion order) breaks ties between rows stored with the same created_at: later first.
Q_FEEDBACK_USER = f"""
MATCH (fb:Feedback {{user_id: $user_id}})
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
Q_FEEDBACK_ALL = f"""
MATCH (fb:Feedback)
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
Q_WEIGHTS_SAVE = "MERGE (w:Weights {scope: $row.scope}) SET w = $row"
Q_WEIGHTS_LOAD = "MATCH (w:Weights {scope: $scope}) RETURN w {.*} AS row"
