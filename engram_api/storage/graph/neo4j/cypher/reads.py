"""The Cypher of the reads: apply's entity lookup and extract's context (by id and by name, in one round
trip each), history, recall's graph step (``Q_GRAPH_STEP``: seeds, expansion and hydration in one query,
its parameters kept in one shape so ordinary recalls share one plan), pages, stats, episodes and users.

Invariants: the package's (``neo4j.cypher``): every query filters on ``$user_id``, and model-provided text
is only ever a parameter.
"""

from __future__ import annotations

from datetime import UTC, datetime

from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j.cypher.schema import ENTITY, ENTITY_EMB, EPISODE, FACT
from engram_api.storage.graph.validity import overlaps_cypher, valid_at_cypher

__all__ = [
    "BEGINNING",
    "END",
    "Q_COUNT_FACTS",
    "Q_EPISODES",
    "Q_EPISODE_LINKS",
    "Q_EXTRACTION_CONTEXT",
    "Q_GET_ENTITIES",
    "Q_GET_FACTS",
    "Q_GRAPH_STEP",
    "Q_HISTORY",
    "Q_IS_APPLIED",
    "Q_LOOKUP_ENTITIES",
    "Q_PAGE_ENTITIES",
    "Q_PAGE_FACTS",
    "Q_STATS",
    "Q_USERS",
]

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
RETURN {ENTITY} AS row ORDER BY e.norm_name, e.id
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
_EXTRACT_READS = {
    "entities": (_ENTITIES_BY_ID, ENTITY),
    "facts": (_FACTS_BY_ID, FACT),
    "slot_facts": (_SLOT_FACTS, FACT),
    "episodes": (_RECENT_EPISODES, EPISODE),
}
Q_GET_ENTITIES = f"{_ENTITIES_BY_ID}\nRETURN {ENTITY_EMB} AS row"
Q_GET_FACTS = f"{_FACTS_BY_ID}\nRETURN {FACT} AS row"
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
RETURN {FACT} AS row
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
  RETURN collect({FACT}) AS facts
}}
CALL () {{
  MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id IN $chunk_ids
  RETURN collect({episodes_cypher.CHUNK_ROW}) AS chunks
}}
RETURN hops, facts, chunks
"""
# The open ends of a recall window as dates (``Q_GRAPH_STEP`` takes no null date).
BEGINNING = datetime(1, 1, 1, tzinfo=UTC)
END = datetime(9999, 12, 31, tzinfo=UTC)
Q_PAGE_FACTS = f"""
MATCH (f:Fact {{user_id: $user_id}})
WITH f ORDER BY f.created_at, f.id SKIP $skip LIMIT $limit
RETURN {FACT} AS row
"""
Q_PAGE_ENTITIES = f"""
UNWIND $fact_ids AS fid
MATCH (:Fact {{user_id: $user_id, id: fid}})-[:SUBJECT|OBJECT]->(e:Entity {{user_id: $user_id}})
WITH DISTINCT e ORDER BY e.norm_name, e.id
RETURN {ENTITY} AS row
"""
Q_COUNT_FACTS = "MATCH (f:Fact {user_id: $user_id}) RETURN count(f) AS n"
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
Q_USERS = "MATCH (u:User) RETURN u.user_id AS user_id ORDER BY user_id"
