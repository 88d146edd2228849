"""Neo4j side of episodes as memories: chunk nodes, the Lucene full-text keyword index, their queries.

Graph shape: ``(:Chunk {id, user_id, ukey, episode_id, seq, text, body, speaker, role, event_time,
embedding, token_states, created_at, embedded_with})-[:PART_OF]->(:Episode)``; ``body`` is the indexed text (the speaker's name with
the words). Facts carry ``ukey`` too. Invariants:
- one full-text index ``engram_keyword`` over ``Chunk.body``, ``Fact.statement`` and both ``ukey``s,
  updated at commit (not eventually consistent), so a committed apply or forget is what search sees;
- every full-text query requires ``ukey:<the user's token>`` inside the Lucene query, so Lucene's
  ranking runs over that user's documents only; the ``user_id`` check after it is defence in depth;
- query terms are runs of letters and digits only (``episodes.keyword_terms``): no Lucene syntax from users.
"""

from __future__ import annotations

from collections.abc import Sequence

from engram_api.storage.graph.validity import valid_at_cypher

__all__ = [
    "CHUNK_ROW",
    "CHUNK_TIMES",
    "EXTRACTED",
    "FROM_INSTANT",
    "KEYWORD_INDEX",
    "MICROS",
    "Q_CHUNKS",
    "Q_CHUNKS_TO_REEMBED",
    "Q_CHUNK_CONTEXT",
    "Q_FORGET_CHUNKS",
    "Q_KEYWORD",
    "Q_KEYWORD_COUNT",
    "Q_NEIGHBOURS",
    "Q_REEMBED_SET",
    "Q_SET_CHUNK_CONTEXT",
    "Q_SET_FACT_UKEY",
    "Q_UNKEYED_FACT_USERS",
    "Q_USERS_TO_REEMBED",
    "SCHEMA",
    "lucene_query",
    "set_times",
]

KEYWORD_INDEX = "engram_keyword"

SCHEMA = (
    "CREATE CONSTRAINT engram_chunk_id IF NOT EXISTS FOR (n:Chunk) REQUIRE n.id IS UNIQUE",
    "CREATE INDEX engram_chunk_user_time IF NOT EXISTS FOR (n:Chunk) ON (n.user_id, n.event_time)",
    "CREATE INDEX engram_chunk_episode IF NOT EXISTS FOR (n:Chunk) ON (n.user_id, n.episode_id)",
    f"CREATE FULLTEXT INDEX {KEYWORD_INDEX} IF NOT EXISTS FOR (n:Chunk|Fact) ON EACH [n.body, n.statement, n.ukey]"
    " OPTIONS {indexConfig: {`fulltext.analyzer`: 'english', `fulltext.eventually_consistent`: false}}",
)

# A written node's times go in as [epoch seconds, nanoseconds] parameters (``neo4j_rows.instant``) that
# the query makes DateTimes. The driver's own conversion of a Python datetime (a pure-Python dehydration
# hook, ~50 us a value; a message's apply writes ~20) was ~10 % of the apply worker's Python CPU in an
# ingest burst (py-spy, ops/bench/profile_ingest.py). Two integers, floored, because fromepoch refuses
# negative nanoseconds (an instant before 1970 has a negative second and positive nanoseconds).
FROM_INSTANT = "CASE WHEN {v} IS NULL THEN null ELSE datetime.fromepoch({v}[0], {v}[1]) END"
CHUNK_TIMES = ("event_time", "created_at")  # the times of ``neo4j_rows.chunk_props``


def set_times(var: str, row: str, times: Sequence[str]) -> str:
    """SET items giving node ``var`` the ``times`` of map ``row`` (``FROM_INSTANT``) as DateTimes."""
    return ", ".join(f"{var}.{t} = {FROM_INSTANT.format(v=f'{row}.{t}')}" for t in times)


# Backfill: only episodes with no chunk get the given ones (episode ids are distinct in $episodes).
Q_ADD_CHUNKS = f"""
UNWIND $episodes AS e
OPTIONAL MATCH (ep:Episode {{user_id: $user_id, id: e.episode_id}})
WHERE NOT EXISTS {{ MATCH (:Chunk)-[:PART_OF]->(ep) }}
WITH ep, e WHERE ep IS NOT NULL
UNWIND e.chunks AS row
CREATE (c:Chunk) SET c = row, {set_times("c", "row", CHUNK_TIMES)}
CREATE (c)-[:PART_OF]->(ep)
RETURN count(c) AS n
"""

Q_REMOVE_CHUNKS = """
MATCH (c:Chunk {user_id: $user_id}) WHERE c.id IN $ids
WITH c, c.id AS id
DETACH DELETE c
RETURN id ORDER BY id
"""

# A chunk is never updated after it is written: updated_at is created_at (as SQLite reads it). Its times
# come back as epoch microseconds (exact for a Python datetime): a recall reads ~70 chunks, and the
# driver's hydration of three temporal values per chunk into neo4j.time objects was most of the Neo4j
# recall's CPU (neo4j_rows.live_chunks turns them back into datetimes).
# epochMillis, not epochSeconds: before 1970 the server truncates epochSeconds toward zero (an instant 1 us
# before the epoch has epochSeconds 0) but floors epochMillis.
MICROS = "{t}.epochMillis * 1000 + {t}.microsecond % 1000"  # null when {t} is null
# The facts extracted from chunk c's episode (``ChunkRecord.fact_ids``), as f.
EXTRACTED = "MATCH (c)-[:PART_OF]->(:Episode)<-[:FROM]-(f:Fact) WHERE f.user_id = $user_id"
CHUNK_ROW = f"""c {{.id, .user_id, .episode_id, .seq, .text, .speaker, .role,
   event_time: {MICROS.format(t="c.event_time")}, created_at: {MICROS.format(t="c.created_at")},
   updated_at: {MICROS.format(t="c.created_at")},
   fact_ids: COLLECT {{ {EXTRACTED} RETURN f.id ORDER BY f.id }}}}"""

Q_CHUNKS = f"""
MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id IN $ids OR c.episode_id IN $episodes
WITH c ORDER BY c.event_time, c.episode_id, c.seq
RETURN {CHUNK_ROW} AS row
"""

Q_USER_CHUNKS = f"MATCH (c:Chunk {{user_id: $user_id}}) RETURN {CHUNK_ROW} AS row"
Q_CHANGED_CHUNKS = f"MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.changed > $since RETURN {CHUNK_ROW} AS row"

_BEFORE = (
    "(n.event_time < x.event_time OR (n.event_time = x.event_time AND (n.episode_id < x.episode_id"
    " OR (n.episode_id = x.episode_id AND n.seq < x.seq))))"
)
_AFTER = _BEFORE.replace("n.", "@.").replace("x.", "n.").replace("@.", "x.")
Q_NEIGHBOURS = f"""
UNWIND $ids AS cid
MATCH (x:Chunk {{user_id: $user_id, id: cid}})
CALL (x) {{
  MATCH (n:Chunk {{user_id: $user_id}}) WHERE n.event_time <= x.event_time AND {_BEFORE}
  WITH n ORDER BY n.event_time DESC, n.episode_id DESC, n.seq DESC LIMIT $window RETURN n
  UNION
  MATCH (n:Chunk {{user_id: $user_id}}) WHERE n.event_time >= x.event_time AND {_AFTER}
  WITH n ORDER BY n.event_time, n.episode_id, n.seq LIMIT $window RETURN n
}}
WITH DISTINCT n AS c
RETURN {CHUNK_ROW} AS row
"""

# The re-embedding pass (``GraphStore.chunks_to_reembed``): chunks of another or no recorded policy
# (``embedded_with``, absent on chunks written before the record), a user's a page by id, every user's.
_OTHER_POLICY = "(c.embedded_with IS NULL OR c.embedded_with <> $context)"
Q_USERS_TO_REEMBED = f"MATCH (c:Chunk) WHERE {_OTHER_POLICY} RETURN DISTINCT c.user_id AS user_id ORDER BY user_id"
Q_CHUNKS_TO_REEMBED = f"""
MATCH (c:Chunk {{user_id: $user_id}}) WHERE c.id > $after AND {_OTHER_POLICY}
WITH c ORDER BY c.id LIMIT $batch
RETURN {CHUNK_ROW} AS row
"""
# Only a chunk still of another policy: one apply wrote meanwhile under $context keeps its own vector.
Q_REEMBED_SET = f"""
UNWIND $rows AS r
MATCH (c:Chunk {{user_id: $user_id, id: r.id}}) WHERE {_OTHER_POLICY}
SET c.embedding = r.embedding, c.token_states = r.token_states, c.embedded_with = $context
RETURN c.id AS id ORDER BY id
"""
# The policy every chunk vector was made with, on the schema marker (as the decay policy, ``Q_FADING``).
Q_CHUNK_CONTEXT = "MATCH (s:EngramSchema {name: 'engram'}) RETURN s.chunk_context AS context"
Q_SET_CHUNK_CONTEXT = "MATCH (s:EngramSchema {name: 'engram'}) SET s.chunk_context = $context"

# Chunks and facts in one query (one round trip): each branch keeps its own top k, as two queries did.
Q_KEYWORD = f"""
CALL () {{
  CALL db.index.fulltext.queryNodes('{KEYWORD_INDEX}', $lucene_chunks) YIELD node, score
  WHERE node:Chunk AND node.user_id = $user_id
    AND ($as_of IS NULL OR node.event_time <= $as_of)
    AND ($since IS NULL OR node.event_time >= $since)
    AND ($until IS NULL OR node.event_time < $until)
  RETURN node.id AS node_id, 'episode' AS kind, score LIMIT $k
  UNION ALL
  CALL db.index.fulltext.queryNodes('{KEYWORD_INDEX}', $lucene_facts) YIELD node, score
  WHERE node:Fact AND node.user_id = $user_id AND {valid_at_cypher("node")}
  RETURN node.id AS node_id, 'fact' AS kind, score LIMIT $k
}}
RETURN node_id, kind, score
"""

Q_KEYWORD_COUNT = f"""
CALL db.index.fulltext.queryNodes('{KEYWORD_INDEX}', $lucene) YIELD node
WHERE node.user_id = $user_id
RETURN count(node) AS n
"""

Q_FORGET_CHUNKS = """
MATCH (c:Chunk {user_id: $user_id}) WHERE $episode_id IS NULL OR c.episode_id = $episode_id
WITH c, c.id AS id
DETACH DELETE c
RETURN id ORDER BY id
"""

# Facts written before the keyword index existed get their user's token once (ensure_schema).
Q_UNKEYED_FACT_USERS = "MATCH (f:Fact) WHERE f.ukey IS NULL RETURN DISTINCT f.user_id AS user_id"
Q_SET_FACT_UKEY = "MATCH (f:Fact {user_id: $user_id}) WHERE f.ukey IS NULL SET f.ukey = $ukey"


def lucene_query(ukey: str, field: str, terms: Sequence[str]) -> str:
    """``ukey:<token> AND <field>:(t1 t2 ...)``: the user's documents matching any term."""
    return f"ukey:{ukey} AND {field}:({' '.join(terms)})"
