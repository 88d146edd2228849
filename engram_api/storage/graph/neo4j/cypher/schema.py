"""What every Neo4j query shares: the schema it runs against (``SCHEMA``, its version, the races of its
statements), the projections records come back in (``FACT``, ``ENTITY``, ``EPISODE``: times as epoch
microseconds, never an embedding unless asked), and the padding of list parameters into Neo4j's list-size
planning buckets (``plan_list``, ``plan_rows``).

Invariants: the package's (``neo4j.cypher``): every query filters on ``$user_id``, and model-provided text
is only ever a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from engram_api.storage.graph.neo4j import episodes as episodes_cypher

__all__ = [
    "ENTITY",
    "ENTITY_EMB",
    "ENTITY_TIMES",
    "EPISODE",
    "EPISODE_TIMES",
    "FACT",
    "FACT_TIMES",
    "NO_ID",
    "PLAN_LIST_MIN",
    "Q_SCHEMA_VERSION",
    "Q_SET_SCHEMA_VERSION",
    "SCHEMA",
    "SCHEMA_RACE_CODES",
    "SCHEMA_VERSION",
    "plan_bucket",
    "plan_list",
    "plan_rows",
    "projection",
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
    # the decay job reads only the facts due for archival: which users have any, then each user's (Q_USERS_DUE,
    # Q_ARCHIVE_DUE); archived facts have no due, so neither index holds them
    "CREATE INDEX engram_fact_due IF NOT EXISTS FOR (n:Fact) ON (n.archive_due_at)",
    "CREATE INDEX engram_fact_user_due IF NOT EXISTS FOR (n:Fact) ON (n.user_id, n.archive_due_at)",
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
# 2: read-time decay (the due indexes; every unarchived fact's archive_due_at backfilled).
SCHEMA_VERSION = 2
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


def projection(var: str, fields: Sequence[str], extra: str, micros: Sequence[str] = ()) -> str:
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
FACT = projection("f", _FACT_FIELDS, _FACT_JOINS, micros=FACT_TIMES)
# Entities' and episodes' times come back the same way (``neo4j_rows.entity_record``, ``episode_record``).
# With that, and no embeddings (``GraphStore.lookup_entities``), apply's lookup of nine entities costs
# 1.15 ms of client CPU instead of 2.9 (one process, interleaved, against one server).
ENTITY = projection("e", _ENTITY_FIELDS, "", micros=ENTITY_TIMES)
ENTITY_EMB = projection("e", _ENTITY_FIELDS, ", .embedding", micros=ENTITY_TIMES)
_EPISODE_FIELDS = ("id", "user_id", "content", "role", "metadata", *EPISODE_TIMES)
EPISODE = projection("ep", _EPISODE_FIELDS, "", micros=EPISODE_TIMES)

# ------------------------------------------------------------------------------- list parameters
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
