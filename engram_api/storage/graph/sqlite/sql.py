"""The SQL of the embedded SQLite backend (``sqlite_store``): the schema script, the shared fact
reads and the entity lookup, as constants.

Invariants: every statement filters on the user (joins repeat it as defence in depth); values travel
as parameters (lists as one JSON parameter read with ``json_each``), never as SQL text.
"""

from __future__ import annotations

from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.validity import OVERLAPS_SQL, VALID_AT_SQL

__all__ = [
    "CHANGED_INDEXES",
    "DUE_INDEXES",
    "ENTITY_LOOKUP",
    "EXPAND",
    "FACTS_BY_ID",
    "FACT_FROM",
    "FACT_SELECT",
    "SCHEMA",
]

_SCHEMA_TEMPLATE = """
BEGIN IMMEDIATE;

CREATE TABLE IF NOT EXISTS users (
    user_id           TEXT PRIMARY KEY,
    version           INTEGER NOT NULL DEFAULT 0,
    epoch             INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd          REAL    NOT NULL DEFAULT 0,
    llm_calls         INTEGER NOT NULL DEFAULT 0,
    removed           INTEGER NOT NULL DEFAULT 0,  -- the version of the last write that removed a record
    vectors_from      INTEGER,  -- catch-up horizon (``vectorsync``); NULL until this release writes the user
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

-- Message ids are chosen by callers, so an episode is unique per user, not globally.
CREATE TABLE IF NOT EXISTS episodes (
    user_id    TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    content    TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    event_time INTEGER NOT NULL,
    metadata   TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, id)
);

CREATE TABLE IF NOT EXISTS entities (
    id         TEXT PRIMARY KEY,
    user_id    TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    norm_name  TEXT    NOT NULL,
    label      TEXT    NOT NULL,
    aliases    TEXT    NOT NULL,  -- JSON list, as given (display order)
    summary    TEXT    NOT NULL,
    embedding  BLOB,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    changed    INTEGER NOT NULL DEFAULT 0  -- the version of the write that created it
);
CREATE INDEX IF NOT EXISTS ix_entities_user_norm ON entities (user_id, norm_name);

-- Normalized aliases, so alias lookups use an index instead of scanning JSON.
CREATE TABLE IF NOT EXISTS entity_aliases (
    entity_id  TEXT NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    user_id    TEXT NOT NULL,
    norm_alias TEXT NOT NULL,
    PRIMARY KEY (entity_id, norm_alias)
);
CREATE INDEX IF NOT EXISTS ix_entity_aliases_user_norm ON entity_aliases (user_id, norm_alias);

CREATE TABLE IF NOT EXISTS facts (
    id            TEXT PRIMARY KEY,
    user_id       TEXT    NOT NULL,
    subject_id    TEXT    NOT NULL REFERENCES entities (id),
    predicate     TEXT    NOT NULL,
    object_id     TEXT REFERENCES entities (id),
    statement     TEXT    NOT NULL,
    memory_type   TEXT    NOT NULL,
    importance    REAL    NOT NULL,
    strength      REAL    NOT NULL,
    single_valued INTEGER NOT NULL,
    valid_from    INTEGER NOT NULL,
    valid_until   INTEGER,
    superseded_by TEXT,
    archived      INTEGER NOT NULL,
    last_decay_at INTEGER,
    archive_due_at INTEGER,  -- when its strength fades below the archive threshold (graph.fading); NULL: never
    embedding     BLOB,
    token_states  BLOB,  -- its statement's packed token states (embedding.states); NULL: none
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    changed       INTEGER NOT NULL DEFAULT 0  -- the version of the last write that created or changed it
);
CREATE INDEX IF NOT EXISTS ix_facts_user_slot ON facts (user_id, subject_id, predicate);
-- recall's graph step reads an entity's facts in this order (EXPAND: the early cut by hop)
CREATE INDEX IF NOT EXISTS ix_facts_user_subject_rank ON facts (user_id, subject_id, importance DESC, id DESC);
CREATE INDEX IF NOT EXISTS ix_facts_user_object_rank ON facts (user_id, object_id, importance DESC, id DESC);
DROP INDEX IF EXISTS ix_facts_user_object;  -- a prefix of ix_facts_user_object_rank
CREATE INDEX IF NOT EXISTS ix_facts_user_created ON facts (user_id, created_at, id);
CREATE INDEX IF NOT EXISTS ix_facts_user_superseded_by ON facts (user_id, superseded_by);
CREATE INDEX IF NOT EXISTS ix_facts_user_archived ON facts (user_id, archived);

-- The fact->entity edges (role 'subject' or 'object') that expansion walks in both directions.
CREATE TABLE IF NOT EXISTS mentions (
    fact_id   TEXT NOT NULL REFERENCES facts (id) ON DELETE CASCADE,
    entity_id TEXT NOT NULL REFERENCES entities (id),
    role      TEXT NOT NULL,
    user_id   TEXT NOT NULL,
    PRIMARY KEY (fact_id, entity_id, role)
);
CREATE INDEX IF NOT EXISTS ix_mentions_user_entity ON mentions (user_id, entity_id);
CREATE INDEX IF NOT EXISTS ix_mentions_user_fact ON mentions (user_id, fact_id);

-- FROM links: which episodes stated a fact or mentioned an entity.
CREATE TABLE IF NOT EXISTS provenance (
    node_id    TEXT NOT NULL,
    node_kind  TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    PRIMARY KEY (node_id, episode_id),
    FOREIGN KEY (user_id, episode_id) REFERENCES episodes (user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS ix_provenance_user_episode ON provenance (user_id, episode_id);
CREATE INDEX IF NOT EXISTS ix_provenance_user_node ON provenance (user_id, node_id);

CREATE TABLE IF NOT EXISTS clusters (
    id         TEXT PRIMARY KEY,
    user_id    TEXT    NOT NULL,
    label      TEXT    NOT NULL,
    summary    TEXT    NOT NULL,
    centroid   BLOB    NOT NULL,
    signature  TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_clusters_user ON clusters (user_id);

CREATE TABLE IF NOT EXISTS cluster_members (
    cluster_id  TEXT NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    member_id   TEXT NOT NULL,
    member_kind TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    PRIMARY KEY (cluster_id, member_id)
);
CREATE INDEX IF NOT EXISTS ix_cluster_members_user_member ON cluster_members (user_id, member_id);

CREATE TABLE IF NOT EXISTS feedback (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id    TEXT    NOT NULL,
    recall_id  TEXT    NOT NULL,
    fact_id    TEXT    NOT NULL,
    useful     INTEGER NOT NULL,
    similarity REAL    NOT NULL,
    graph      REAL    NOT NULL,
    strength   REAL    NOT NULL,
    recency    REAL    NOT NULL,
    importance REAL    NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_feedback_user_created ON feedback (user_id, created_at);
CREATE INDEX IF NOT EXISTS ix_feedback_created ON feedback (created_at);

CREATE TABLE IF NOT EXISTS weights (
    scope             TEXT PRIMARY KEY,
    alpha             REAL    NOT NULL,
    beta              REAL    NOT NULL,
    gamma             REAL    NOT NULL,
    recency_weight    REAL    NOT NULL,
    importance_weight REAL    NOT NULL,
    samples           INTEGER NOT NULL,
    quality           REAL    NOT NULL,
    fitted_at         INTEGER NOT NULL
);

-- Facts about the store itself, one row a name: 'fading' is the decay policy the stored archive_due_at
-- values were computed with (JSON; ``GraphStore.refresh_dues``).
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The ids each write deleted, by the version it committed: a FAISS copy catches up by them (``vectorsync``).
CREATE TABLE IF NOT EXISTS removals (
    user_id TEXT    NOT NULL,
    version INTEGER NOT NULL,
    node_id TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_removals_user_version ON removals (user_id, version);

{episodes}
COMMIT;
"""

SCHEMA = _SCHEMA_TEMPLATE.replace("{episodes}", episodes_sql.SCHEMA)
# After the columns' migration (``SqliteConnection.ensure_schema``): a reader's snapshot refresh reads the
# records written since its stamp.
CHANGED_INDEXES = """
CREATE INDEX IF NOT EXISTS ix_facts_user_changed ON facts (user_id, changed);
CREATE INDEX IF NOT EXISTS ix_chunks_user_changed ON chunks (user_id, changed);
CREATE INDEX IF NOT EXISTS ix_entities_user_changed ON entities (user_id, changed);
"""

# The decay job reads only the facts due for archival: which users have any (the fan-out's driver), then
# each user's (``SqliteMaintenance._archive_batch``). Archived facts hold NULL, so neither holds them.
DUE_INDEXES = """
CREATE INDEX IF NOT EXISTS ix_facts_due ON facts (archive_due_at, user_id);
CREATE INDEX IF NOT EXISTS ix_facts_user_due ON facts (user_id, archive_due_at);
"""

# Every fact read goes through these columns so subject/object names and sources are filled alike.
# The entity joins repeat the user filter (defence in depth) and source ids come back as a JSON list.
FACT_SELECT = """
SELECT f.id, f.user_id, f.created_at, f.updated_at, f.subject_id, s.name AS subject_name,
       f.predicate, f.object_id, o.name AS object_name, f.statement, f.memory_type, f.importance,
       f.strength, f.single_valued, f.valid_from, f.valid_until, f.superseded_by, f.archived,
       f.last_decay_at,
       (SELECT json_group_array(p.episode_id) FROM provenance p
         WHERE p.node_id = f.id AND p.user_id = f.user_id) AS source_ids
"""
FACT_FROM = """
FROM facts f
JOIN entities s ON s.id = f.subject_id AND s.user_id = f.user_id
LEFT JOIN entities o ON o.id = f.object_id AND o.user_id = f.user_id
"""

# The user's facts among the ids of a JSON list (parameters: user id, list). The unary + keeps the planner
# off the user_id indexes: it prefers them to the primary key, and they scan all the user's facts.
FACTS_BY_ID = f"""{FACT_SELECT} {FACT_FROM}
WHERE +f.user_id = ? AND f.id IN (SELECT value FROM json_each(?))"""

# The user's entities whose id is in :ids or whose norm_name or a normalized alias is in :names (both
# JSON lists; an empty one matches nothing), each once, without the embedding (its readers never use it).
_ENTITY_MATCH = """
 FROM entities e
 WHERE e.user_id = :user_id
   AND (e.id IN (SELECT value FROM json_each(:ids))
        OR e.norm_name IN (SELECT value FROM json_each(:names))
        OR e.id IN (SELECT a.entity_id FROM entity_aliases a
                     WHERE a.user_id = :user_id
                       AND a.norm_alias IN (SELECT value FROM json_each(:names))))
 ORDER BY e.norm_name, e.id
"""
ENTITY_LOOKUP = (
    "SELECT e.id, e.user_id, e.name, e.norm_name, e.label, e.aliases, e.summary, NULL AS embedding,"
    " e.created_at, e.updated_at" + _ENTITY_MATCH
)

# Valid at :at (``validity``): the only facts expansion may use.
_VALID_AT = episodes_sql.FACT_VALID_AT

# A seed fact passes recall's window (``fusion.TimeWindow.fact_ok``): valid at :at and overlapping
# [:since, :until) (``validity``). The unary +: as in FACTS_BY_ID.
_SEED_FACT_OK = f"""
    +f.user_id = :user_id AND f.id IN (SELECT value FROM json_each(:seed_facts))
    AND {VALID_AT_SQL} AND {OVERLAPS_SQL}
"""

# The expansion of recall's graph step, ONE statement: `reach` walks entities level by level through
# valid facts (UNION removes repeated (entity, level) pairs, so the recursion is bounded by entities x
# (max_hops + 1) and stops at :max_hops); every valid fact mentioning a reached entity counts once per
# seed, at the lowest level it was reached from. Early cut by hop: `first` holds each seed's nearest
# :per_seed valid level-0 facts, read in the order of the (subject_id | object_id, importance, id)
# indexes and cut at :per_seed per side, so an entity with thousands of facts costs ~2x :per_seed index
# entries, not its degree; a seed with :per_seed of them (`enough`) keeps those and is never walked
# (nor is an avoided id: the user's own node would reach every fact of the user). A seed's nearest
# facts are ordered by (level, importance descending, id descending): that index order. CROSS JOIN pins
# the join order (SQLite never reorders it): always from the reached entity outwards through the
# (user_id, entity_id) and primary-key indexes, never a scan of the user's facts.
_FIRST = """
    SELECT e.id, g.id, g.importance
      FROM seed
      CROSS JOIN entities e ON e.id = seed.id AND e.user_id = :user_id
      CROSS JOIN facts g ON g.rowid IN (
          SELECT f.rowid FROM facts f INDEXED BY ix_facts_user_{role}_rank
           WHERE f.user_id = :user_id AND f.{role}_id = e.id AND {valid}
           ORDER BY f.importance DESC, f.id DESC LIMIT :per_seed)
     WHERE e.id NOT IN (SELECT value FROM json_each(:avoid))
"""
EXPAND = f"""
WITH RECURSIVE
seed(id) AS (
    SELECT value FROM json_each(:seeds)
    UNION SELECT f.subject_id FROM facts f WHERE {_SEED_FACT_OK}
    UNION SELECT f.object_id FROM facts f WHERE {_SEED_FACT_OK} AND f.object_id IS NOT NULL
),
first(seed_id, fact_id, importance) AS (
    {_FIRST.format(role="subject", valid=_VALID_AT)}
    UNION
    {_FIRST.format(role="object", valid=_VALID_AT)}
),
enough(seed_id) AS (
    SELECT seed_id FROM first GROUP BY seed_id HAVING COUNT(*) >= :per_seed
),
reach(seed_id, entity_id, level) AS (
    SELECT e.id, e.id, 0
      FROM seed
      CROSS JOIN entities e ON e.id = seed.id AND e.user_id = :user_id
     WHERE e.id NOT IN (SELECT value FROM json_each(:avoid))
       AND e.id NOT IN (SELECT seed_id FROM enough)
    UNION
    SELECT r.seed_id, far.entity_id, r.level + 1
      FROM reach r
      CROSS JOIN mentions near ON near.user_id = :user_id AND near.entity_id = r.entity_id
      CROSS JOIN facts f ON f.id = near.fact_id AND {_VALID_AT}
      CROSS JOIN mentions far ON far.fact_id = near.fact_id AND far.user_id = :user_id
     WHERE r.level < :max_hops
       AND far.entity_id NOT IN (SELECT value FROM json_each(:avoid))
),
seed_hop(seed_id, fact_id, level, importance) AS (
    SELECT seed_id, fact_id, 0, importance FROM first WHERE seed_id IN (SELECT seed_id FROM enough)
    UNION ALL
    SELECT r.seed_id, m.fact_id, MIN(r.level), f.importance
      FROM reach r
      CROSS JOIN mentions m ON m.user_id = :user_id AND m.entity_id = r.entity_id
      CROSS JOIN facts f ON f.id = m.fact_id AND {_VALID_AT}
     GROUP BY r.seed_id, m.fact_id
),
kept(fact_id, level, importance) AS (
    SELECT fact_id, level, importance FROM (
        SELECT fact_id, level, importance, ROW_NUMBER() OVER (
                   PARTITION BY seed_id ORDER BY level, importance DESC, fact_id DESC) AS nth
          FROM seed_hop)
     WHERE nth <= :per_seed
)
SELECT fact_id, MIN(level) AS hops FROM kept
 GROUP BY fact_id
 ORDER BY hops, MAX(importance) DESC, fact_id
 LIMIT :limit
"""
