"""Neo4j backend of the graph-store contract (production).

Graph shape (every node carries ``user_id``; every query filters on it):

    (:User {user_id, epoch, version, prompt_tokens, completion_tokens, cost_usd, llm_calls})
    (:Episode {id, user_id, content, role, event_time, metadata})           id = message id
    (:Entity {id, user_id, name, norm_name, label, aliases, summary, embedding})
        -[:HAS_ALIAS]->(:Alias {user_id, norm})    one per normalized alias, so lookups hit an index
        -[:FROM]->(:Episode)
    (:Fact {id, user_id, subject_id, predicate, object_id, statement, ..., embedding})
        -[:SUBJECT]->(:Entity)  -[:OBJECT]->(:Entity)  -[:FROM]->(:Episode)
    (:Chunk {id, user_id, episode_id, seq, text, ...})-[:PART_OF]->(:Episode)   see neo4j_episodes
    (:Cluster {id, user_id, label, summary, centroid, signature})-[:HAS_MEMBER]->(:Fact|:Entity)
    (:Feedback {user_id, recall_id, fact_id, ..., seq})      (:Weights {scope, ...})

Datetimes are native Cypher ``DateTime`` values in UTC, so range predicates and ``duration`` work in
Cypher; they come back as aware UTC ``datetime``. Model-provided text (labels, predicates, names) is
only ever a parameter value, never part of a query string.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from neo4j import Driver, GraphDatabase, ManagedTransaction, NotificationDisabledClassification, unit_of_work
from neo4j import time as neo4j_time
from neo4j.exceptions import (
    ClientError,
    ConfigurationError,
    DatabaseUnavailable,
    ServiceUnavailable,
    SessionExpired,
)

from engram_api.errors import ConfigError, StoreUnavailableError
from engram_api.models import (
    ApplyOutcome,
    ChunkRecord,
    ClusterRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    FeedbackRow,
    ForgetResult,
    KeywordHit,
    LearnedWeights,
    StoredEpisode,
    Usage,
    UserStats,
    VectorItem,
    WritePlan,
    check_aware,
    utcnow,
)
from engram_api.naming import normalize_name
from engram_api.storage import neo4j_episodes as episodes_cypher
from engram_api.storage.base import Fence, GraphStore, HopFact
from engram_api.storage.episodes import user_key
from engram_api.storage.forgetting import ForgetPlan, ForgetScope
from engram_api.versions import ABSENT, Stamp

__all__ = ["Neo4jGraphStore"]

_T = TypeVar("_T")

CONNECTION_TIMEOUT_S = 5.0
# Managed transactions retry transient errors (deadlocks, leader switches, a dropped connection)
# for this long; a server that stays down surfaces as StoreUnavailableError after it.
MAX_RETRY_TIME_S = 10.0
SCHEMA_WAIT_S = 60

_SCHEMA = (
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
    "CREATE INDEX engram_alias_norm IF NOT EXISTS FOR (n:Alias) ON (n.norm)",
    "CREATE INDEX engram_alias_user IF NOT EXISTS FOR (n:Alias) ON (n.user_id)",
    "CREATE INDEX engram_fact_user IF NOT EXISTS FOR (n:Fact) ON (n.user_id)",
    "CREATE INDEX engram_fact_slot IF NOT EXISTS FOR (n:Fact) ON (n.subject_id, n.predicate)",
    "CREATE INDEX engram_cluster_user IF NOT EXISTS FOR (n:Cluster) ON (n.user_id)",
    "CREATE INDEX engram_feedback_user IF NOT EXISTS FOR (n:Feedback) ON (n.user_id)",
    "CREATE INDEX engram_feedback_created IF NOT EXISTS FOR (n:Feedback) ON (n.created_at)",
    *episodes_cypher.SCHEMA,
)
# Concurrent start-ups race on IF NOT EXISTS; the loser's error means the rule is already there.
_SCHEMA_RACE_CODES = frozenset(
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
_ENTITY_FIELDS = (
    "id", "user_id", "name", "norm_name", "label", "aliases", "summary", "created_at", "updated_at",
)  # fmt: skip


def _projection(var: str, fields: Sequence[str], extra: str) -> str:
    props = ", ".join(f".{name}" for name in fields)
    return f"{var} {{{props}{extra}}}"


_FACT_JOINS = (
    ", subject_name: COLLECT { MATCH (f)-[:SUBJECT]->(x:Entity) WHERE x.user_id = $user_id "
    "RETURN x.name }[0]"
    ", object_name: COLLECT { MATCH (f)-[:OBJECT]->(x:Entity) WHERE x.user_id = $user_id "
    "RETURN x.name }[0]"
    ", source_ids: COLLECT { MATCH (f)-[:FROM]->(ep:Episode) WHERE ep.user_id = $user_id "
    "RETURN ep.id ORDER BY ep.id }"
)
# Cypher map projections of a fact `f` (never with its embedding) and an entity `e`.
_FACT = _projection("f", _FACT_FIELDS, _FACT_JOINS)
_ENTITY = _projection("e", _ENTITY_FIELDS, "")
_ENTITY_EMB = _projection("e", _ENTITY_FIELDS, ", .embedding")

# A fact usable by recall at $as_of (the current state when $as_of is null), never an archived one.
_VALID_AT = (
    "({v}.archived = false AND CASE WHEN $as_of IS NULL THEN {v}.valid_until IS NULL "
    "ELSE {v}.valid_from <= $as_of AND ({v}.valid_until IS NULL OR $as_of < {v}.valid_until) END)"
)

# --------------------------------------------------------------------------------------- apply
# Taking the user's write lock first serializes every writer of one user, so the episode check
# below cannot race with a concurrent apply of the same message.
_Q_APPLY_LOCK = """
MERGE (u:User {user_id: $user_id})
ON CREATE SET u.version = 0, u.epoch = $epoch, u.prompt_tokens = 0, u.completion_tokens = 0, u.cost_usd = 0.0,
              u.llm_calls = 0, u.created_at = $now
SET u.version = u.version + 1,
    u.prompt_tokens = u.prompt_tokens + $usage.prompt_tokens,
    u.completion_tokens = u.completion_tokens + $usage.completion_tokens,
    u.cost_usd = u.cost_usd + $usage.cost_usd,
    u.llm_calls = u.llm_calls + $usage.llm_calls,
    u.updated_at = $now
RETURN u.version AS version
"""
_Q_APPLY_CHECK = """
RETURN EXISTS { MATCH (:Episode {user_id: $user_id, id: $episode_id}) } AS applied,
       COLLECT { UNWIND $entity_ids AS rid
                 WITH rid WHERE NOT EXISTS { MATCH (:Entity {user_id: $user_id, id: rid}) }
                 RETURN rid } AS missing
"""
_Q_APPLY_EPISODE = "CREATE (ep:Episode) SET ep = $episode"
_Q_APPLY_ENTITIES = """
MATCH (ep:Episode {user_id: $user_id, id: $episode_id})
UNWIND $rows AS row
CREATE (e:Entity) SET e = row.props
CREATE (e)-[:FROM]->(ep)
FOREACH (norm IN row.norms | CREATE (e)-[:HAS_ALIAS]->(:Alias {user_id: $user_id, norm: norm}))
"""
_Q_APPLY_ENTITY_CHANGES = """
UNWIND $rows AS c
MATCH (e:Entity {user_id: $user_id, id: c.id})
SET e.aliases = reduce(acc = coalesce(e.aliases, []), a IN c.add_aliases |
                       CASE WHEN a IN acc THEN acc ELSE acc + a END),
    e.summary = coalesce(c.summary, e.summary),
    e.label = coalesce(c.label, e.label),
    e.updated_at = $now
FOREACH (norm IN c.norms | MERGE (e)-[:HAS_ALIAS]->(:Alias {user_id: $user_id, norm: norm}))
"""
_Q_APPLY_FACTS = """
MATCH (ep:Episode {user_id: $user_id, id: $episode_id})
UNWIND $rows AS row
MATCH (s:Entity {user_id: $user_id, id: row.props.subject_id})
CREATE (f:Fact) SET f = row.props
CREATE (f)-[:SUBJECT]->(s)
CREATE (f)-[:FROM]->(ep)
WITH f, row
OPTIONAL MATCH (o:Entity {user_id: $user_id, id: row.props.object_id})
FOREACH (_ IN CASE WHEN o IS NULL THEN [] ELSE [1] END | CREATE (f)-[:OBJECT]->(o))
"""
_Q_APPLY_FACT_CHANGES = """
UNWIND $rows AS c
MATCH (f:Fact {user_id: $user_id, id: c.id})
SET f.valid_until = c.valid_until, f.superseded_by = c.superseded_by, f.updated_at = $now
"""
_Q_APPLY_LINKS = """
MATCH (ep:Episode {user_id: $user_id, id: $episode_id})
CALL (ep) {
  UNWIND $reinforced AS fid
  MATCH (f:Fact {user_id: $user_id, id: fid})
  SET f.strength = 1.0, f.archived = false, f.updated_at = $now
  MERGE (f)-[:FROM]->(ep)
}
CALL (ep) {
  UNWIND $mentioned AS eid
  MATCH (e:Entity {user_id: $user_id, id: eid})
  MERGE (e)-[:FROM]->(ep)
}
CALL (ep) {
  UNWIND $linked AS fid
  MATCH (f:Fact {user_id: $user_id, id: fid})
  MERGE (f)-[:FROM]->(ep)
}
"""

# ---------------------------------------------------------------------------------------- read
_Q_VERSION = "MATCH (u:User {user_id: $user_id}) RETURN u.version AS version"
_Q_STAMP = "MATCH (u:User {user_id: $user_id}) RETURN coalesce(u.epoch, 0) AS epoch, u.version AS version"
# The fence's check: take the user node's write lock first (the documented dummy-property idiom), so
# no other writer can move the stamp between this check and our commit.
_Q_FENCE = """
OPTIONAL MATCH (u:User {user_id: $user_id})
FOREACH (_ IN CASE WHEN u IS NULL THEN [] ELSE [1] END | SET u._lock = true REMOVE u._lock)
RETURN coalesce(u.epoch, 0) AS epoch, coalesce(u.version, 0) AS version
"""
_Q_BUMP = "MATCH (u:User {user_id: $user_id}) SET u.version = u.version + 1, u.updated_at = $now"
_Q_EPISODES = """
MATCH (ep:Episode {user_id: $user_id})
RETURN ep {.*, fact_ids: COLLECT { MATCH (f:Fact {user_id: $user_id})-[:FROM]->(ep) RETURN f.id ORDER BY f.id },
        entity_ids: COLLECT { MATCH (e:Entity {user_id: $user_id})-[:FROM]->(ep) RETURN e.id ORDER BY e.id }} AS row
ORDER BY ep.event_time, ep.id
"""
_Q_IS_APPLIED = "RETURN EXISTS { MATCH (:Episode {user_id: $user_id, id: $episode_id}) } AS applied"
_Q_FIND_ENTITIES = f"""
CALL () {{
  MATCH (e:Entity {{user_id: $user_id}}) WHERE e.norm_name IN $names RETURN e
  UNION
  MATCH (a:Alias {{user_id: $user_id}})<-[:HAS_ALIAS]-(e:Entity {{user_id: $user_id}})
  WHERE a.norm IN $names RETURN e
}}
RETURN {_ENTITY_EMB} AS row ORDER BY e.norm_name, e.id
"""
_Q_GET_ENTITIES = f"""
MATCH (e:Entity {{user_id: $user_id}}) WHERE e.id IN $ids
RETURN {_ENTITY_EMB} AS row ORDER BY e.norm_name, e.id
"""
_Q_RECENT_EPISODES = """
MATCH (ep:Episode {user_id: $user_id}) WHERE ep.event_time < $before
WITH ep ORDER BY ep.event_time DESC, ep.id DESC LIMIT $limit
RETURN ep {.id, .user_id, .content, .role, .event_time, .metadata, .created_at, .updated_at} AS row
"""
_Q_GET_FACTS = f"""
MATCH (f:Fact {{user_id: $user_id}}) WHERE f.id IN $ids
WITH f ORDER BY f.created_at, f.id
RETURN {_FACT} AS row
"""
_Q_SLOTS = f"""
UNWIND $slots AS slot
MATCH (f:Fact {{subject_id: slot[0], predicate: slot[1]}}) WHERE f.user_id = $user_id
WITH DISTINCT f ORDER BY f.valid_from, f.created_at, f.id
RETURN {_FACT} AS row
"""
_Q_HISTORY = f"""
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
# Neo4j plans `min(length(p))` per (start, end) pair as a pruning breadth-first expand that visits
# each node once, at its shallowest depth; a path may only pass through the user's nodes and facts
# valid at $as_of, so that depth is the fact's hop count. The per-seed minimum is taken first
# because Neo4j 5.26 folds a minimum grouped by `f` alone into the per-seed search and returns one
# row per (seed, fact). The length bound must be a literal: it is formatted in from a validated int.
_Q_EXPAND = f"""
MATCH (s:Entity {{user_id: $user_id}}) WHERE s.id IN $seeds
MATCH p = (s)-[:SUBJECT|OBJECT*1..{{max_len}}]-(f:Fact)
WHERE all(n IN nodes(p) WHERE n.user_id = $user_id AND (NOT n:Fact OR {_VALID_AT.format(v="n")})
                               AND (n:Fact OR NOT n.id IN $avoid))
WITH s, f, min(length(p)) AS depth
ORDER BY depth, f.importance DESC, f.id
WITH s, collect({{f: f, depth: depth}})[..$per_seed] AS nearest
UNWIND nearest AS near
WITH near.f AS f, (min(near.depth) - 1) / 2 AS hops
ORDER BY hops, f.importance DESC, f.id
LIMIT $limit
RETURN {_FACT} AS row, hops
"""
_Q_PAGE_FACTS = f"""
MATCH (f:Fact {{user_id: $user_id}})
WITH f ORDER BY f.created_at, f.id SKIP $skip LIMIT $limit
RETURN {_FACT} AS row
"""
_Q_PAGE_ENTITIES = f"""
UNWIND $fact_ids AS fid
MATCH (:Fact {{user_id: $user_id, id: fid}})-[:SUBJECT|OBJECT]->(e:Entity {{user_id: $user_id}})
WITH DISTINCT e ORDER BY e.norm_name, e.id
RETURN {_ENTITY} AS row
"""
_Q_COUNT_FACTS = "MATCH (f:Fact {user_id: $user_id}) RETURN count(f) AS n"
_Q_STATS = """
OPTIONAL MATCH (u:User {user_id: $user_id})
CALL () {
  MATCH (f:Fact {user_id: $user_id})
  RETURN count(f) AS facts,
         count(CASE WHEN f.valid_until IS NULL AND f.archived = false THEN 1 END) AS current_facts,
         count(CASE WHEN f.valid_until IS NOT NULL THEN 1 END) AS superseded_facts,
         count(CASE WHEN f.archived THEN 1 END) AS archived_facts
}
RETURN u {.version, .prompt_tokens, .completion_tokens, .cost_usd, .llm_calls} AS user,
       facts, current_facts, superseded_facts, archived_facts,
       COUNT { MATCH (e:Entity {user_id: $user_id}) } AS entities,
       COUNT { MATCH (ep:Episode {user_id: $user_id}) } AS episodes,
       COUNT { MATCH (c:Chunk {user_id: $user_id}) } AS episode_chunks,
       COUNT { MATCH (c:Cluster {user_id: $user_id}) } AS clusters
"""
_Q_VECTORS = """
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
RETURN node_id, kind, embedding ORDER BY kind, node_id
"""
_Q_USERS = "MATCH (u:User) RETURN u.user_id AS user_id ORDER BY user_id"

# -------------------------------------------------------------------------------------- forget
_Q_FORGET_PLAN = """
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
_Q_FORGET_FACT_PLAN = """
MATCH (f:Fact {user_id: $user_id, id: $fact_id})
RETURN [f.id] AS doomed, COLLECT { MATCH (f)-[:SUBJECT|OBJECT]->(e:Entity {user_id: $user_id}) RETURN e.id } AS candidates,
       [] AS chunks
"""
_Q_FORGET_LINKS = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) WHERE f.id IN $doomed AND f.superseded_by IS NOT NULL
                 RETURN [f.id, f.superseded_by] } AS doomed_links,
       COLLECT { MATCH (g:Fact {user_id: $user_id}) WHERE g.superseded_by IN $doomed AND NOT g.id IN $doomed
                 RETURN [g.id, g.superseded_by] } AS older,
       COLLECT { UNWIND $doomed AS fid MATCH (f:Fact {user_id: $user_id, id: fid})
                 WHERE f.embedding IS NOT NULL RETURN f.id }
       + COLLECT { UNWIND $candidates AS eid MATCH (e:Entity {user_id: $user_id, id: eid})
                   WHERE e.embedding IS NOT NULL RETURN e.id } AS vectored
"""
_Q_FORGET_RESTORE = """
UNWIND $rows AS r
MATCH (g:Fact {user_id: $user_id, id: r.fact_id})
SET g.superseded_by = r.successor,
    g.valid_until = CASE WHEN r.successor IS NULL THEN null ELSE g.valid_until END,
    g.updated_at = $now
"""
_Q_FORGET_FACTS = """
UNWIND $doomed AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
DETACH DELETE f
"""
_Q_FORGET_EPISODE = "MATCH (ep:Episode {user_id: $user_id, id: $episode_id}) DETACH DELETE ep"
_Q_FORGET_ORPHANS = """
UNWIND $candidates AS eid
MATCH (e:Entity {user_id: $user_id, id: eid})
WHERE NOT EXISTS { MATCH (e)-[:FROM]->(:Episode) } AND NOT EXISTS { MATCH (e)<-[:SUBJECT|OBJECT]-(:Fact) }
WITH e, e.id AS id, COLLECT { MATCH (e)-[:HAS_ALIAS]->(a:Alias) RETURN a } AS aliases
FOREACH (a IN aliases | DETACH DELETE a)
DETACH DELETE e
RETURN id
"""
_Q_FORGET_USER_SCAN = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) RETURN f.id ORDER BY f.id } AS facts,
       COLLECT { MATCH (e:Entity {user_id: $user_id}) RETURN e.id ORDER BY e.id } AS entities,
       COUNT { MATCH (f:Fact {user_id: $user_id}) WHERE f.embedding IS NOT NULL }
       + COUNT { MATCH (e:Entity {user_id: $user_id}) WHERE e.embedding IS NOT NULL } AS vectors,
       COUNT { MATCH (ep:Episode {user_id: $user_id}) } AS episodes
"""
# Labels are constants of this module; one statement per label keeps each delete on an index.
_FORGET_USER_LABELS = ("Fact", "Alias", "Entity", "Chunk", "Episode", "Cluster", "Feedback", "User")

# --------------------------------------------------------------------------------- maintenance
_Q_DECAY_BATCH = """
MATCH (f:Fact {user_id: $user_id})
WHERE f.archived = false AND coalesce(f.last_decay_at, f.created_at) < $now
WITH f ORDER BY f.id LIMIT $batch
RETURN f.id AS id, f.strength AS strength, coalesce(f.last_decay_at, f.created_at) AS since
"""
_Q_DECAY_SET = """
UNWIND $rows AS r
MATCH (f:Fact {user_id: $user_id, id: r.id})
SET f.strength = r.strength, f.archived = r.archived, f.last_decay_at = $now, f.updated_at = $now
"""
_Q_REINFORCE = """
UNWIND $ids AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
WITH DISTINCT f
WITH f, CASE WHEN f.strength + $amount > 1.0 THEN 1.0 ELSE f.strength + $amount END AS strength
WHERE strength <> f.strength OR f.archived
SET f.strength = strength, f.archived = false, f.updated_at = $now
RETURN count(f) AS changed
"""
_Q_CLUSTERS_DELETE = "MATCH (c:Cluster {user_id: $user_id}) DETACH DELETE c"
_Q_CLUSTERS_CREATE = "UNWIND $rows AS row CREATE (c:Cluster) SET c = row"
_Q_CLUSTERS_LINK_FACTS = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (f:Fact {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(f)
"""
_Q_CLUSTERS_LINK_ENTITIES = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (e:Entity {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(e)
"""
_Q_CLUSTERS = """
MATCH (c:Cluster {user_id: $user_id})
RETURN c {.*,
  member_fact_ids: COLLECT { MATCH (c)-[:HAS_MEMBER]->(f:Fact {user_id: $user_id}) RETURN f.id ORDER BY f.id },
  member_entity_ids: COLLECT { MATCH (c)-[:HAS_MEMBER]->(e:Entity {user_id: $user_id}) RETURN e.id ORDER BY e.id }
} AS row
ORDER BY c.id
"""
_Q_FEEDBACK_ADD = "UNWIND $rows AS row CREATE (fb:Feedback) SET fb = row"
_FEEDBACK_FIELDS = (
    "user_id", "recall_id", "fact_id", "useful", "similarity", "graph", "strength", "recency", "importance",
    "created_at",
)  # fmt: skip
_FEEDBACK = _projection("fb", _FEEDBACK_FIELDS, "")
# `seq` (insertion order) breaks ties between rows stored with the same created_at: later first.
_Q_FEEDBACK_USER = f"""
MATCH (fb:Feedback {{user_id: $user_id}})
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
_Q_FEEDBACK_ALL = f"""
MATCH (fb:Feedback)
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
_Q_WEIGHTS_SAVE = "MERGE (w:Weights {scope: $row.scope}) SET w = $row"
_Q_WEIGHTS_LOAD = "MATCH (w:Weights {scope: $scope}) RETURN w {.*} AS row"


class _AlreadyApplied(Exception):
    """Raised inside the apply transaction to roll it back when the episode is already stored."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def _fenced(tx: ManagedTransaction, fence: Fence, work: Callable[..., _T], *args: Any) -> tuple[_T, Stamp]:
    """Run ``work`` only if the user's stamp is the fence's; return its result and the stamp after."""
    found = tx.run(_Q_FENCE, user_id=fence.user_id).single(strict=True)
    fence.check_before(Stamp(int(found["epoch"]), int(found["version"])))
    result = work(tx, *args)
    after = tx.run(_Q_STAMP, user_id=fence.user_id).single()
    stamp = ABSENT if after is None else Stamp(int(after["epoch"]), int(after["version"]))
    fence.check_after(stamp)
    return result, stamp


def _utc(value: datetime) -> datetime:
    # A naive datetime would be stored as a LocalDateTime, which never compares with a DateTime.
    return cast(datetime, check_aware(value))


def _opt_utc(value: datetime | None) -> datetime | None:
    return check_aware(value)


def _from_db(row: dict[str, Any]) -> dict[str, Any]:
    """Driver values -> model input: temporal types become aware UTC datetimes; nulls are dropped
    so the model's defaults (empty aliases, no embedding, ...) apply."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if value is None:
            continue
        if isinstance(value, neo4j_time.DateTime):
            value = value.to_native().astimezone(UTC)
        out[key] = value
    return out


def _entity_props(entity: EntityRecord, user_id: str) -> dict[str, Any]:
    return {
        "id": entity.id,
        "user_id": user_id,
        "name": entity.name,
        "norm_name": entity.norm_name,
        "label": entity.label,
        "aliases": list(dict.fromkeys(entity.aliases)),
        "summary": entity.summary,
        "embedding": entity.embedding,
        "created_at": _utc(entity.created_at),
        "updated_at": _utc(entity.updated_at),
    }


def _fact_props(fact: FactRecord, user_id: str) -> dict[str, Any]:
    return {
        "id": fact.id,
        "user_id": user_id,
        "subject_id": fact.subject_id,
        "predicate": fact.predicate,
        "object_id": fact.object_id,
        "statement": fact.statement,
        "memory_type": fact.memory_type,
        "importance": float(fact.importance),
        "strength": float(fact.strength),
        "single_valued": fact.single_valued,
        "valid_from": _utc(fact.valid_from),
        "valid_until": _opt_utc(fact.valid_until),
        "superseded_by": fact.superseded_by,
        "archived": fact.archived,
        "last_decay_at": _opt_utc(fact.last_decay_at),
        "embedding": fact.embedding,
        "ukey": user_key(user_id),
        "created_at": _utc(fact.created_at),
        "updated_at": _utc(fact.updated_at),
    }


def _norms(names: Sequence[str]) -> list[str]:
    """Distinct, non-empty normalized forms, in first-seen order."""
    return list(dict.fromkeys(n for n in (normalize_name(a) for a in names) if n))


def _live_chunks(rows: Sequence[dict[str, Any]]) -> list[ChunkRecord]:
    """Chunk rows minus those a concurrent forget deleted mid-read: under read committed, a node matched
    before another transaction's delete committed reads back with null properties."""
    return [ChunkRecord.model_validate(r) for r in rows if r.get("text") is not None]


class Neo4jGraphStore(GraphStore):
    """Graph store on a Neo4j 5 server over Bolt; safe to share between threads."""

    def __init__(
        self, *, uri: str, user: str, password: str | None, database: str, query_timeout_s: float | None = None
    ) -> None:
        self._uri = uri
        self._query_timeout_s = query_timeout_s
        self._auth = None if password is None else (user, password)
        self._database = database
        self._lock = threading.Lock()
        self._driver: Driver | None = None
        self._schema_ready = False

    # ----------------------------------------------------------------------------- plumbing
    def _get_driver(self) -> Driver:
        driver = self._driver
        if driver is not None:
            return driver
        with self._lock:
            if self._driver is None:
                try:
                    self._driver = GraphDatabase.driver(
                        self._uri,
                        auth=self._auth,
                        connection_timeout=CONNECTION_TIMEOUT_S,
                        max_transaction_retry_time=MAX_RETRY_TIME_S,
                        user_agent="engram",
                        # Property keys a fresh database has not seen yet (e.g. last_decay_at)
                        # would make the server warn on every read.
                        notifications_disabled_classifications=[NotificationDisabledClassification.UNRECOGNIZED],
                    )
                except (ConfigurationError, ValueError) as exc:
                    raise ConfigError("NEO4J_URI", f"cannot use {self._uri!r}: {exc}") from exc
            return self._driver

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        try:
            yield
        except (ServiceUnavailable, SessionExpired, DatabaseUnavailable) as exc:
            raise StoreUnavailableError(f"Neo4j at {self._uri} is unavailable: {exc}") from exc
        except ClientError as exc:
            if "TransactionTimedOut" not in (exc.code or ""):
                raise
            raise StoreUnavailableError(f"Neo4j ended a query at its transaction timeout: {exc.message}") from exc

    def _ready(self) -> Driver:
        driver = self._get_driver()
        if not self._schema_ready:
            self.ensure_schema()
        return driver

    def _write(self, work: Callable[..., _T], *args: Any) -> _T:
        driver = self._ready()
        fence = self._fence()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            if fence is None:
                return session.execute_write(work, *args)
            result, fence.expected = session.execute_write(_fenced, fence, work, *args)
        return result

    def _read(self, work: Callable[..., _T], *args: Any) -> _T:
        driver = self._ready()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            return session.execute_read(work, *args)

    def _rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        """Run one read query in its own managed transaction; returns the `row` column."""

        def work(tx: ManagedTransaction) -> list[dict[str, Any]]:
            return [_from_db(r["row"]) for r in tx.run(query, params)]

        return self._read(work)

    # ---------------------------------------------------------------------------- lifecycle
    def ensure_schema(self) -> None:
        driver = self._get_driver()
        with self._lock:
            if self._schema_ready:
                return
            with self._mapped_errors(), driver.session(database=self._database) as session:
                for statement in _SCHEMA:
                    try:
                        session.run(statement).consume()
                    except ClientError as exc:
                        if exc.code not in _SCHEMA_RACE_CODES:
                            raise
                session.run("CALL db.awaitIndexes($timeout)", timeout=SCHEMA_WAIT_S).consume()
                for record in session.run(episodes_cypher.Q_UNKEYED_FACT_USERS).data():
                    uid = record["user_id"]
                    session.run(episodes_cypher.Q_SET_FACT_UKEY, user_id=uid, ukey=user_key(uid)).consume()
            self._schema_ready = True

    def ping(self) -> None:
        driver = self._get_driver()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            session.run("RETURN 1").consume()

    def close(self) -> None:
        with self._lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()

    # ------------------------------------------------------------------------------- ingest
    def is_applied(self, user_id: str, message_id: str) -> bool:
        def work(tx: ManagedTransaction) -> bool:
            record = tx.run(_Q_IS_APPLIED, user_id=user_id, episode_id=message_id).single(strict=True)
            return bool(record["applied"])

        return self._read(work)

    def _find_entities(self, user_id: str, norm_names: list[str]) -> list[EntityRecord]:
        rows = self._rows(_Q_FIND_ENTITIES, user_id=user_id, names=norm_names)
        return [EntityRecord.model_validate(r) for r in rows]

    def _get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
        rows = self._rows(_Q_GET_ENTITIES, user_id=user_id, ids=entity_ids)
        return [EntityRecord.model_validate(r) for r in rows]

    def _recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        rows = self._rows(_Q_RECENT_EPISODES, user_id=user_id, before=_utc(before), limit=limit)
        return [EpisodeRecord.model_validate({**r, "metadata": json.loads(r["metadata"])}) for r in reversed(rows)]

    def _facts_for_slots(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
        rows = self._rows(_Q_SLOTS, user_id=user_id, slots=[list(slot) for slot in slots])
        return [FactRecord.model_validate(r) for r in rows]

    def _apply(self, plan: WritePlan) -> ApplyOutcome:
        user_id = plan.user_id
        episode = plan.episode
        new_entity_ids = {e.id for e in plan.new_entities}
        referenced = {f.subject_id for f in plan.new_facts} | {
            f.object_id for f in plan.new_facts if f.object_id is not None
        }
        params: dict[str, Any] = {
            "user_id": user_id,
            "episode_id": episode.id,
            "epoch": self._creation_epoch(),
            "now": utcnow(),
        }
        episode_props = {
            "id": episode.id,
            "user_id": user_id,
            "content": episode.content,
            "role": episode.role,
            "event_time": _utc(episode.event_time),
            "metadata": json.dumps(episode.metadata, sort_keys=True),
            "created_at": _utc(episode.created_at),
            "updated_at": _utc(episode.updated_at),
        }
        entity_rows = [{"props": _entity_props(e, user_id), "norms": _norms(e.aliases)} for e in plan.new_entities]
        change_rows = [
            {
                "id": c.id,
                "add_aliases": list(dict.fromkeys(c.add_aliases)),
                "norms": _norms(c.add_aliases),
                "summary": c.summary,
                "label": c.label,
            }
            for c in plan.entity_changes
        ]
        fact_rows = [{"props": _fact_props(f, user_id)} for f in plan.new_facts]
        chunk_rows = [_chunk_row(c, user_id, episode.id) for c in plan.chunks]
        fact_change_rows = [
            {"id": c.id, "valid_until": _opt_utc(c.valid_until), "superseded_by": c.superseded_by}
            for c in plan.fact_changes
        ]

        def work(tx: ManagedTransaction) -> ApplyOutcome:
            locked = tx.run(_Q_APPLY_LOCK, params, usage=plan.usage.model_dump()).single(strict=True)
            version = int(locked["version"])
            check = tx.run(_Q_APPLY_CHECK, params, entity_ids=sorted(referenced - new_entity_ids)).single(strict=True)
            if check["applied"]:
                raise _AlreadyApplied(version - 1)
            if check["missing"]:
                raise ValueError(
                    f"plan for episode {episode.id!r} references unknown entities of user "
                    f"{user_id!r}: {sorted(check['missing'])}"
                )
            tx.run(_Q_APPLY_EPISODE, params, episode=episode_props).consume()
            if chunk_rows:
                tx.run(episodes_cypher.Q_APPLY_CHUNKS, params, chunks=chunk_rows).consume()
            for query, rows in (
                (_Q_APPLY_ENTITIES, entity_rows),
                (_Q_APPLY_ENTITY_CHANGES, change_rows),
                (_Q_APPLY_FACTS, fact_rows),
                (_Q_APPLY_FACT_CHANGES, fact_change_rows),
            ):
                if rows:
                    tx.run(query, params, rows=rows).consume()
            if plan.reinforced_fact_ids or plan.mentioned_entity_ids or plan.linked_fact_ids:
                tx.run(
                    _Q_APPLY_LINKS,
                    params,
                    reinforced=list(dict.fromkeys(plan.reinforced_fact_ids)),
                    mentioned=list(dict.fromkeys(plan.mentioned_entity_ids)),
                    linked=list(dict.fromkeys(plan.linked_fact_ids)),
                ).consume()
            return ApplyOutcome(applied=True, version=version)

        try:
            return self._write(work)
        except _AlreadyApplied as skipped:
            return ApplyOutcome(applied=False, version=skipped.version)

    # --------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        def work(tx: ManagedTransaction) -> Stamp:
            record = tx.run(_Q_STAMP, user_id=user_id).single()
            return ABSENT if record is None else Stamp(int(record["epoch"]), int(record["version"]))

        return self._read(work)

    def _get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        rows = self._rows(_Q_GET_FACTS, user_id=user_id, ids=fact_ids)
        return [FactRecord.model_validate(r) for r in rows]

    def _expand(
        self,
        user_id: str,
        entity_ids: list[str],
        *,
        max_hops: int,
        as_of: datetime | None,
        limit: int,
        per_seed: int,
        avoid: list[str],
    ) -> list[HopFact]:
        query = _Q_EXPAND.replace("{max_len}", str(2 * int(max_hops) + 1))
        params = {
            "user_id": user_id,
            "seeds": entity_ids,
            "as_of": _opt_utc(as_of),
            "limit": int(limit),
            "per_seed": int(per_seed),
            "avoid": avoid,
        }

        # A variable-length match can explode on a dense graph: the server ends it at the timeout.
        @unit_of_work(timeout=self._query_timeout_s)
        def work(tx: ManagedTransaction) -> list[HopFact]:
            return [HopFact.model_validate({**_from_db(r["row"]), "hops": r["hops"]}) for r in tx.run(query, params)]

        return self._read(work)

    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        rows = self._rows(_Q_HISTORY, user_id=user_id, norm=norm, predicate=predicate, limit=int(limit))
        return [FactRecord.model_validate(r) for r in rows]

    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        def work(tx: ManagedTransaction) -> tuple[int, list[FactRecord], list[EntityRecord]]:
            total = tx.run(_Q_COUNT_FACTS, user_id=user_id).single(strict=True)["n"]
            facts = [
                FactRecord.model_validate(_from_db(r["row"]))
                for r in tx.run(_Q_PAGE_FACTS, user_id=user_id, skip=skip, limit=limit)
            ]
            entities = [
                EntityRecord.model_validate(_from_db(r["row"]))
                for r in tx.run(_Q_PAGE_ENTITIES, user_id=user_id, fact_ids=[f.id for f in facts])
            ]
            return total, facts, entities

        return self._read(work)

    def stats(self, user_id: str) -> UserStats:
        def work(tx: ManagedTransaction) -> UserStats:
            record = tx.run(_Q_STATS, user_id=user_id).single(strict=True)
            user = record["user"] or {}
            return UserStats(
                user_id=user_id,
                entities=record["entities"],
                facts=record["facts"],
                current_facts=record["current_facts"],
                superseded_facts=record["superseded_facts"],
                archived_facts=record["archived_facts"],
                episodes=record["episodes"],
                episode_chunks=record["episode_chunks"],
                keyword_entries=tx.run(
                    episodes_cypher.Q_KEYWORD_COUNT, user_id=user_id, lucene=f"ukey:{user_key(user_id)}"
                ).single(strict=True)["n"],
                clusters=record["clusters"],
                version=user.get("version") or 0,
                usage=Usage.model_validate(_from_db({k: v for k, v in user.items() if k != "version"})),
            )

        return self._read(work)

    def vectors(self, user_id: str) -> tuple[list[VectorItem], int]:
        def work(tx: ManagedTransaction) -> tuple[list[VectorItem], int]:
            items = [
                VectorItem(node_id=r["node_id"], kind=r["kind"], embedding=r["embedding"])
                for r in tx.run(_Q_VECTORS, user_id=user_id)
            ]
            record = tx.run(_Q_VERSION, user_id=user_id).single()
            return items, 0 if record is None else int(record["version"])

        return self._read(work)

    def _get_chunks(self, user_id: str, chunk_ids: list[str], episode_ids: list[str]) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_CHUNKS, user_id=user_id, ids=chunk_ids, episodes=episode_ids)
        return _live_chunks(rows)

    def _add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        by_episode: dict[str, list[dict[str, Any]]] = {}
        for c in chunks:
            by_episode.setdefault(c.episode_id, []).append(_chunk_row(c, user_id, c.episode_id))
        rows = [{"episode_id": e, "chunks": cs} for e, cs in by_episode.items()]

        def work(tx: ManagedTransaction) -> int:
            added = int(tx.run(episodes_cypher.Q_ADD_CHUNKS, user_id=user_id, episodes=rows).single(strict=True)["n"])
            if added:
                tx.run(_Q_BUMP, user_id=user_id, now=_utc(utcnow())).consume()
            return added

        return self._write(work)

    def _remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            removed = [r["id"] for r in tx.run(episodes_cypher.Q_REMOVE_CHUNKS, user_id=user_id, ids=chunk_ids)]
            if removed:
                tx.run(_Q_BUMP, user_id=user_id, now=_utc(utcnow())).consume()
            return removed

        return self._write(work)

    def _neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_NEIGHBOURS, user_id=user_id, ids=chunk_ids, window=int(window))
        return _live_chunks(rows)

    def _keyword_search(
        self,
        user_id: str,
        terms: list[str],
        k: int,
        *,
        as_of: datetime | None,
        since: datetime | None,
        until: datetime | None,
    ) -> list[KeywordHit]:
        ukey = user_key(user_id)
        params = {"user_id": user_id, "k": int(k), "as_of": _opt_utc(as_of), "since": _opt_utc(since)}
        params["until"] = _opt_utc(until)
        fact_query = episodes_cypher.Q_KEYWORD_FACTS.replace("{valid_at}", _VALID_AT.format(v="node"))

        def work(tx: ManagedTransaction) -> list[KeywordHit]:
            hits = [
                KeywordHit(node_id=r["node_id"], kind="episode", score=float(r["score"]))
                for r in tx.run(
                    episodes_cypher.Q_KEYWORD_CHUNKS, params, lucene=episodes_cypher.lucene_query(ukey, "body", terms)
                )
            ]
            hits += [
                KeywordHit(node_id=r["node_id"], kind="fact", score=float(r["score"]))
                for r in tx.run(fact_query, params, lucene=episodes_cypher.lucene_query(ukey, "statement", terms))
            ]
            return sorted(hits, key=lambda h: (-h.score, h.node_id))

        return self._read(work)

    def list_users(self) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            return [r["user_id"] for r in tx.run(_Q_USERS)]

        return self._read(work)

    # ------------------------------------------------------------------------------- delete
    def episodes(self, user_id: str) -> list[StoredEpisode]:
        rows = self._rows(_Q_EPISODES, user_id=user_id)
        return [StoredEpisode(**{**r, "metadata": json.loads(r.get("metadata") or "{}")}) for r in rows]

    def _forget_scope(
        self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None
    ) -> ForgetScope | None:
        query = _Q_FORGET_PLAN if episode_id is not None else _Q_FORGET_FACT_PLAN
        params = {"user_id": user_id, "episode_id": episode_id, "fact_id": fact_id}

        def work(tx: ManagedTransaction) -> ForgetScope | None:
            found = tx.run(query, params).single()
            if found is None:
                return None
            doomed, candidates = list(found["doomed"]), list(found["candidates"])
            links = tx.run(_Q_FORGET_LINKS, params, doomed=doomed, candidates=candidates).single(strict=True)
            return ForgetScope(
                doomed_fact_ids=doomed,
                entity_candidates=candidates,
                chunk_ids=list(found["chunks"]),
                vectored=list(links["vectored"]),
                successor_of=dict(links["doomed_links"]),
                older=[tuple(pair) for pair in links["older"]],
            )

        return self._read(work)

    def _apply_forget(self, plan: ForgetPlan) -> list[str]:
        params = {"user_id": plan.user_id, "episode_id": plan.episode_id, "now": utcnow()}

        def work(tx: ManagedTransaction) -> list[str]:
            if plan.repairs:
                tx.run(_Q_FORGET_RESTORE, params, rows=[r.model_dump() for r in plan.repairs]).consume()
            tx.run(_Q_FORGET_FACTS, params, doomed=plan.fact_ids).consume()
            if plan.episode_id is not None:
                # Only a message's forget touches chunks: with no episode id the query would take them all.
                tx.run(episodes_cypher.Q_FORGET_CHUNKS, params).consume()
                tx.run(_Q_FORGET_EPISODE, params).consume()
            orphans = [r["id"] for r in tx.run(_Q_FORGET_ORPHANS, params, candidates=plan.entity_candidates)]
            tx.run(_Q_BUMP, params).consume()
            return orphans

        return self._write(work)

    def forget_user(self, user_id: str) -> ForgetResult:
        def work(tx: ManagedTransaction) -> ForgetResult:
            scan = tx.run(_Q_FORGET_USER_SCAN, user_id=user_id).single(strict=True)
            chunks = [r["id"] for r in tx.run(episodes_cypher.Q_FORGET_CHUNKS, user_id=user_id, episode_id=None)]
            for label in _FORGET_USER_LABELS:
                tx.run(f"MATCH (n:{label} {{user_id: $user_id}}) DETACH DELETE n", user_id=user_id).consume()
            tx.run("MATCH (w:Weights {scope: $user_id}) DELETE w", user_id=user_id).consume()
            return ForgetResult(
                user_id=user_id,
                episodes=scan["episodes"],
                facts=len(scan["facts"]),
                entities=len(scan["entities"]),
                vectors=scan["vectors"] + len(chunks),
                removed_fact_ids=list(scan["facts"]),
                removed_entity_ids=list(scan["entities"]),
                removed_chunk_ids=chunks,
            )

        return self._write(work)

    # -------------------------------------------------------------------------- maintenance
    def _decay_batch(
        self, user_id: str, *, now: datetime, batch: int, fade: Callable[[float, datetime], tuple[float, bool]]
    ) -> list[bool]:
        params = {"user_id": user_id, "now": _utc(now), "batch": int(batch)}

        def work(tx: ManagedTransaction) -> list[bool]:
            rows = []
            for r in tx.run(_Q_DECAY_BATCH, params):
                strength, archived = fade(float(r["strength"]), r["since"].to_native().astimezone(UTC))
                rows.append({"id": r["id"], "strength": strength, "archived": archived})
            if rows:
                tx.run(_Q_DECAY_SET, params, rows=rows).consume()
                tx.run(_Q_BUMP, params).consume()
            return [r["archived"] for r in rows]

        return self._write(work)

    def _reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        params = {
            "user_id": user_id,
            "ids": fact_ids,
            "amount": float(amount),
            "now": _utc(now),
        }

        def work(tx: ManagedTransaction) -> int:
            changed = int(tx.run(_Q_REINFORCE, params).single(strict=True)["changed"])
            if changed:
                tx.run(_Q_BUMP, params).consume()
            return changed

        return self._write(work)

    def _replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None:
        now = utcnow()
        rows = [
            {
                "id": c.id,
                "user_id": user_id,
                "label": c.label,
                "summary": c.summary,
                "centroid": [float(x) for x in c.centroid],
                "signature": c.signature,
                "created_at": _utc(c.created_at),
                "updated_at": _utc(c.updated_at),
            }
            for c in clusters
        ]
        fact_links = [
            {"cluster_id": c.id, "node_id": node_id} for c in clusters for node_id in dict.fromkeys(c.member_fact_ids)
        ]
        entity_links = [
            {"cluster_id": c.id, "node_id": node_id} for c in clusters for node_id in dict.fromkeys(c.member_entity_ids)
        ]

        def work(tx: ManagedTransaction) -> None:
            tx.run(_Q_CLUSTERS_DELETE, user_id=user_id).consume()
            if rows:
                tx.run(_Q_CLUSTERS_CREATE, rows=rows).consume()
            if fact_links:
                tx.run(_Q_CLUSTERS_LINK_FACTS, user_id=user_id, links=fact_links).consume()
            if entity_links:
                tx.run(_Q_CLUSTERS_LINK_ENTITIES, user_id=user_id, links=entity_links).consume()
            # A user with no User node yet has nothing recall could cache, so no bump is needed.
            tx.run(_Q_BUMP, user_id=user_id, now=now).consume()

        self._write(work)

    def clusters(self, user_id: str) -> list[ClusterRecord]:
        return [ClusterRecord.model_validate(r) for r in self._rows(_Q_CLUSTERS, user_id=user_id)]

    def _add_feedback(self, rows: list[FeedbackRow]) -> None:
        first = time.time_ns()
        props = [
            {**row.model_dump(), "created_at": _utc(row.created_at), "seq": first + i} for i, row in enumerate(rows)
        ]

        def work(tx: ManagedTransaction) -> None:
            tx.run(_Q_FEEDBACK_ADD, rows=props).consume()

        self._write(work)

    def _feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        if user_id is None:
            rows = self._rows(_Q_FEEDBACK_ALL, limit=int(limit))
        else:
            rows = self._rows(_Q_FEEDBACK_USER, user_id=user_id, limit=int(limit))
        return [FeedbackRow.model_validate(r) for r in rows]

    def save_weights(self, weights: LearnedWeights) -> None:
        row = {**weights.model_dump(), "fitted_at": _utc(weights.fitted_at)}

        def work(tx: ManagedTransaction) -> None:
            tx.run(_Q_WEIGHTS_SAVE, row=row).consume()

        self._write(work)

    def load_weights(self, scope: str) -> LearnedWeights | None:
        rows = self._rows(_Q_WEIGHTS_LOAD, scope=scope)
        return LearnedWeights.model_validate(rows[0]) if rows else None


def _chunk_row(c: ChunkRecord, user_id: str, episode_id: str) -> dict[str, Any]:
    """A chunk's node properties: ``body`` (speaker and words) and ``ukey`` feed the keyword index."""
    return {
        "id": c.id,
        "user_id": user_id,
        "ukey": user_key(user_id),
        "episode_id": episode_id,
        "seq": c.seq,
        "text": c.text,
        "body": c.indexed_text,
        "speaker": c.speaker,
        "role": c.role,
        "event_time": _utc(c.event_time),
        "embedding": c.embedding,
        "created_at": _utc(c.created_at),
    }
