"""The Cypher of the Neo4j backend: schema statements and every query, as constants.

Every query is imported from here (``from engram_api.storage.graph.neo4j import cypher as cy``); each lives
in the module of what it serves:
- ``schema``: the schema, its version, the record projections and the list-size planning buckets that every
  query shares;
- ``writes``: apply's statements, the write fence and the user's stamp;
- ``changes``: the bump that ends every other write and the reads that keep a snapshot or a FAISS copy;
- ``reads``: lookups, extract's context, history, recall's graph step, pages and stats;
- ``upkeep``: forgetting and the maintenance jobs.

Invariants: every query filters on ``$user_id`` (or a ``Weights`` scope); model-provided text is only
ever a parameter, never part of a query string; the only text formatted in is a constant of this
package (projections), ``validity``'s fragments or a validated int (``Q_GRAPH_STEP``'s length bound).
"""

from __future__ import annotations

from engram_api.storage.graph.neo4j.cypher.changes import (
    Q_BUMP,
    Q_CHANGED_FACTS,
    Q_CHANGES_STAMP,
    Q_USER_FACTS,
    Q_USER_SIZE,
    Q_VECTORS,
)
from engram_api.storage.graph.neo4j.cypher.reads import (
    BEGINNING,
    END,
    Q_COUNT_FACTS,
    Q_EPISODE_LINKS,
    Q_EPISODES,
    Q_EXTRACTION_CONTEXT,
    Q_GET_ENTITIES,
    Q_GET_FACTS,
    Q_GRAPH_STEP,
    Q_HISTORY,
    Q_IS_APPLIED,
    Q_LOOKUP_ENTITIES,
    Q_PAGE_ENTITIES,
    Q_PAGE_FACTS,
    Q_STATS,
    Q_USERS,
)
from engram_api.storage.graph.neo4j.cypher.schema import (
    ENTITY_TIMES,
    EPISODE_TIMES,
    FACT_TIMES,
    NO_ID,
    PLAN_LIST_MIN,
    Q_SCHEMA_VERSION,
    Q_SET_SCHEMA_VERSION,
    SCHEMA,
    SCHEMA_RACE_CODES,
    SCHEMA_VERSION,
    plan_bucket,
    plan_list,
    plan_rows,
)
from engram_api.storage.graph.neo4j.cypher.upkeep import (
    FORGET_USER_LABELS,
    Q_CLUSTER_MEMBERS,
    Q_CLUSTERS,
    Q_CLUSTERS_CREATE,
    Q_CLUSTERS_DELETE,
    Q_CLUSTERS_LINK_ENTITIES,
    Q_CLUSTERS_LINK_FACTS,
    Q_DECAY_BATCH,
    Q_DECAY_SET,
    Q_FEEDBACK_ADD,
    Q_FEEDBACK_ALL,
    Q_FEEDBACK_USER,
    Q_FORGET_EPISODE,
    Q_FORGET_FACT_PLAN,
    Q_FORGET_FACTS,
    Q_FORGET_LINKS,
    Q_FORGET_ORPHANS,
    Q_FORGET_PLAN,
    Q_FORGET_RESTORE,
    Q_FORGET_USER_SCAN,
    Q_REINFORCE,
    Q_WEIGHTS_LOAD,
    Q_WEIGHTS_SAVE,
)
from engram_api.storage.graph.neo4j.cypher.writes import (
    FENCE_LOCK,
    Q_APPLY_LOCK,
    Q_APPLY_WRITES,
    Q_FENCE,
    Q_STAMP,
    Q_VERSION,
)

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
