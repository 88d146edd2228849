"""The embedded graph store: one SQLite file that several worker processes write at once.

Concurrency model: WAL journal (readers never block the writer), every write runs in ``BEGIN IMMEDIATE``
(the write lock is taken before the first read, so a check-then-write such as apply's idempotency check
cannot race another process) and ``busy_timeout`` makes a blocked writer wait instead of failing.
sqlite3 connections must not be shared across threads or inherited across ``fork``, so each thread of
each process opens its own connection on first use.

Storage choices: datetimes are INTEGER microseconds since the epoch (exact round trip, and range
comparisons are plain integer comparisons); embeddings are float32 BLOBs; lists passed to a query travel
as one JSON parameter read with ``json_each`` so that no SQL text is ever built from values.
"""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from engram_api.errors import StoreUnavailableError
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
from engram_api.storage import sqlite_episodes as episodes_sql
from engram_api.storage.base import GraphStore, HopFact
from engram_api.storage.forgetting import ForgetPlan, ForgetScope
from engram_api.versions import ABSENT, Stamp, new_epoch

__all__ = ["SqliteGraphStore"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

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
    updated_at INTEGER NOT NULL
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
    embedding     BLOB,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_facts_user_slot ON facts (user_id, subject_id, predicate);
CREATE INDEX IF NOT EXISTS ix_facts_user_object ON facts (user_id, object_id);
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

{episodes}
COMMIT;
"""

_SCHEMA = _SCHEMA_TEMPLATE.replace("{episodes}", episodes_sql.SCHEMA)

# Every fact read goes through these columns so subject/object names and sources are filled alike.
# The entity joins repeat the user filter (defence in depth) and source ids come back as a JSON list.
_FACT_SELECT = """
SELECT f.id, f.user_id, f.created_at, f.updated_at, f.subject_id, s.name AS subject_name,
       f.predicate, f.object_id, o.name AS object_name, f.statement, f.memory_type, f.importance,
       f.strength, f.single_valued, f.valid_from, f.valid_until, f.superseded_by, f.archived,
       f.last_decay_at,
       (SELECT json_group_array(p.episode_id) FROM provenance p
         WHERE p.node_id = f.id AND p.user_id = f.user_id) AS source_ids
"""
_FACT_FROM = """
FROM facts f
JOIN entities s ON s.id = f.subject_id AND s.user_id = f.user_id
LEFT JOIN entities o ON o.id = f.object_id AND o.user_id = f.user_id
"""

# Valid at :as_of (current when :as_of is NULL) and not archived: the only facts expansion may use.
_VALID_AT = episodes_sql.FACT_VALID_AT

# ONE statement: `reach` walks entities level by level through valid facts (UNION removes repeated
# (entity, level) pairs, so the recursion is bounded by entities x (max_hops + 1)); every valid fact
# mentioning a reached entity is returned once, at the lowest level it was reached from.
# CROSS JOIN pins the join order (SQLite never reorders it): always from the reached entity outwards
# through the (user_id, entity_id) and primary-key indexes, never a scan of the user's facts.
_EXPAND = f"""
WITH RECURSIVE
reach(seed_id, entity_id, level) AS (
    SELECT e.id, e.id, 0
      FROM json_each(:seeds) seed
      CROSS JOIN entities e ON e.id = seed.value AND e.user_id = :user_id
     WHERE e.id NOT IN (SELECT value FROM json_each(:avoid))
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
    SELECT r.seed_id, m.fact_id, MIN(r.level), f.importance
      FROM reach r
      CROSS JOIN mentions m ON m.user_id = :user_id AND m.entity_id = r.entity_id
      CROSS JOIN facts f ON f.id = m.fact_id AND {_VALID_AT}
     GROUP BY r.seed_id, m.fact_id
),
kept(fact_id, level) AS (
    SELECT fact_id, level FROM (
        SELECT fact_id, level, ROW_NUMBER() OVER (
                   PARTITION BY seed_id ORDER BY level, importance DESC, fact_id) AS nth
          FROM seed_hop)
     WHERE nth <= :per_seed
),
hop(fact_id, hops) AS (
    SELECT fact_id, MIN(level) FROM kept GROUP BY fact_id
)
{_FACT_SELECT}, hop.hops AS hops
FROM hop
CROSS JOIN facts f ON f.id = hop.fact_id AND f.user_id = :user_id
JOIN entities s ON s.id = f.subject_id AND s.user_id = f.user_id
LEFT JOIN entities o ON o.id = f.object_id AND o.user_id = f.user_id
ORDER BY hop.hops, f.importance DESC, f.id
LIMIT :limit
"""


def _us(value: datetime) -> int:
    check_aware(value)  # a naive datetime would be read as local time: refuse it
    return (value - _EPOCH) // _MICROSECOND


def _us_opt(value: datetime | None) -> int | None:
    return None if value is None else _us(value)


def _dt(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _dt_opt(value: int | None) -> datetime | None:
    return None if value is None else _dt(value)


def _blob(vector: Sequence[float] | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def _vector(blob: bytes) -> list[float]:
    return np.frombuffer(blob, dtype=np.float32).astype(float).tolist()


def _ids(values: Sequence[str]) -> str:
    return json.dumps(list(values))


def _fact_fields(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "user_id": row["user_id"],
        "created_at": _dt(row["created_at"]),
        "updated_at": _dt(row["updated_at"]),
        "subject_id": row["subject_id"],
        "subject_name": row["subject_name"],
        "predicate": row["predicate"],
        "object_id": row["object_id"],
        "object_name": row["object_name"],
        "statement": row["statement"],
        "memory_type": row["memory_type"],
        "importance": row["importance"],
        "strength": row["strength"],
        "single_valued": bool(row["single_valued"]),
        "valid_from": _dt(row["valid_from"]),
        "valid_until": _dt_opt(row["valid_until"]),
        "superseded_by": row["superseded_by"],
        "archived": bool(row["archived"]),
        "last_decay_at": _dt_opt(row["last_decay_at"]),
        "source_ids": sorted(json.loads(row["source_ids"])),
    }


def _fact(row: sqlite3.Row) -> FactRecord:
    return FactRecord(**_fact_fields(row))


def _entity(row: sqlite3.Row) -> EntityRecord:
    return EntityRecord(
        id=row["id"],
        user_id=row["user_id"],
        created_at=_dt(row["created_at"]),
        updated_at=_dt(row["updated_at"]),
        name=row["name"],
        norm_name=row["norm_name"],
        label=row["label"],
        aliases=json.loads(row["aliases"]),
        summary=row["summary"],
        embedding=None if row["embedding"] is None else _vector(row["embedding"]),
    )


def _stamp(conn: sqlite3.Connection, user_id: str) -> Stamp:
    row = conn.execute("SELECT epoch, version FROM users WHERE user_id = ?", (user_id,)).fetchone()
    return ABSENT if row is None else Stamp(row["epoch"], row["version"])


def _version(conn: sqlite3.Connection, user_id: str) -> int:
    return _stamp(conn, user_id).version


def _bump(conn: sqlite3.Connection, user_id: str, usage: Usage | None, epoch: int | None = None) -> int:
    """Bump the version; creates the user (with ``epoch``, else a fresh one) when absent."""
    usage = usage or Usage()
    now = _us(utcnow())
    row = conn.execute(
        """INSERT INTO users (user_id, version, epoch, prompt_tokens, completion_tokens, cost_usd, llm_calls,
                              created_at, updated_at)
           VALUES (:user_id, 1, :epoch, :prompt, :completion, :cost, :calls, :now, :now)
           ON CONFLICT (user_id) DO UPDATE SET
               version = version + 1,
               prompt_tokens = prompt_tokens + :prompt,
               completion_tokens = completion_tokens + :completion,
               cost_usd = cost_usd + :cost,
               llm_calls = llm_calls + :calls,
               updated_at = :now
           RETURNING version""",
        {
            "user_id": user_id,
            "epoch": new_epoch() if epoch is None else epoch,
            "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens,
            "cost": usage.cost_usd,
            "calls": usage.llm_calls,
            "now": now,
        },
    ).fetchone()
    return int(row["version"])


def _episode_exists(conn: sqlite3.Connection, user_id: str, episode_id: str) -> bool:
    row = conn.execute("SELECT 1 FROM episodes WHERE user_id = ? AND id = ?", (user_id, episode_id)).fetchone()
    return row is not None


def _entity_exists(conn: sqlite3.Connection, user_id: str, entity_id: str) -> bool:
    row = conn.execute("SELECT 1 FROM entities WHERE user_id = ? AND id = ?", (user_id, entity_id)).fetchone()
    return row is not None


def _insert_episode(conn: sqlite3.Connection, episode: EpisodeRecord) -> None:
    conn.execute(
        "INSERT INTO episodes (user_id, id, content, role, event_time, metadata, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            episode.user_id,
            episode.id,
            episode.content,
            episode.role,
            _us(episode.event_time),
            json.dumps(episode.metadata, sort_keys=True),
            _us(episode.created_at),
            _us(episode.updated_at),
        ),
    )


def _insert_entity(conn: sqlite3.Connection, entity: EntityRecord) -> None:
    aliases = list(dict.fromkeys(entity.aliases))
    conn.execute(
        "INSERT INTO entities (id, user_id, name, norm_name, label, aliases, summary, embedding, created_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            entity.id,
            entity.user_id,
            entity.name,
            entity.norm_name,
            entity.label,
            json.dumps(aliases),
            entity.summary,
            _blob(entity.embedding),
            _us(entity.created_at),
            _us(entity.updated_at),
        ),
    )
    _index_aliases(conn, entity.user_id, entity.id, aliases)


def _index_aliases(conn: sqlite3.Connection, user_id: str, entity_id: str, aliases: Sequence[str]) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO entity_aliases (entity_id, user_id, norm_alias) VALUES (?, ?, ?)",
        [(entity_id, user_id, normalize_name(a)) for a in aliases if normalize_name(a)],
    )


def _change_entity(
    conn: sqlite3.Connection,
    user_id: str,
    entity_id: str,
    add_aliases: Sequence[str],
    summary: str | None,
    label: str | None,
) -> None:
    row = conn.execute(
        "SELECT aliases, summary, label FROM entities WHERE user_id = ? AND id = ?", (user_id, entity_id)
    ).fetchone()
    if row is None:
        return
    aliases = list(dict.fromkeys([*json.loads(row["aliases"]), *add_aliases]))
    conn.execute(
        "UPDATE entities SET aliases = ?, summary = ?, label = ?, updated_at = ? WHERE user_id = ? AND id = ?",
        (
            json.dumps(aliases),
            row["summary"] if summary is None else summary,
            row["label"] if label is None else label,
            _us(utcnow()),
            user_id,
            entity_id,
        ),
    )
    _index_aliases(conn, user_id, entity_id, aliases)


def _check_fact_entities(conn: sqlite3.Connection, plan: WritePlan) -> None:
    new_ids = {e.id for e in plan.new_entities}
    for fact in plan.new_facts:
        for role, entity_id in (("subject", fact.subject_id), ("object", fact.object_id)):
            if entity_id is None or entity_id in new_ids:
                continue
            if not _entity_exists(conn, plan.user_id, entity_id):
                raise ValueError(
                    f"fact {fact.id!r}: {role} entity {entity_id!r} is neither new in this plan "
                    f"nor stored for user {plan.user_id!r}"
                )


def _insert_fact(conn: sqlite3.Connection, fact: FactRecord) -> None:
    conn.execute(
        """INSERT INTO facts (id, user_id, subject_id, predicate, object_id, statement, memory_type,
                              importance, strength, single_valued, valid_from, valid_until, superseded_by,
                              archived, last_decay_at, embedding, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (
            fact.id,
            fact.user_id,
            fact.subject_id,
            fact.predicate,
            fact.object_id,
            fact.statement,
            fact.memory_type,
            fact.importance,
            fact.strength,
            int(fact.single_valued),
            _us(fact.valid_from),
            _us_opt(fact.valid_until),
            fact.superseded_by,
            int(fact.archived),
            _us_opt(fact.last_decay_at),
            _blob(fact.embedding),
            _us(fact.created_at),
            _us(fact.updated_at),
        ),
    )
    edges = [(fact.id, fact.subject_id, "subject", fact.user_id)]
    if fact.object_id is not None:
        edges.append((fact.id, fact.object_id, "object", fact.user_id))
    conn.executemany("INSERT INTO mentions (fact_id, entity_id, role, user_id) VALUES (?, ?, ?, ?)", edges)


def _link(conn: sqlite3.Connection, user_id: str, node_id: str, kind: str, episode_id: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO provenance (node_id, node_kind, episode_id, user_id) VALUES (?, ?, ?, ?)",
        (node_id, kind, episode_id, user_id),
    )


def _delete_nodes(conn: sqlite3.Connection, user_id: str, table: str, node_ids: Sequence[str]) -> int:
    """Delete facts or entities (``table``, a constant) with their FROM links and cluster memberships
    (a fact's mentions cascade); returns how many of them carried an embedding."""
    ids = _ids(node_ids)
    vectors = conn.execute(
        f"SELECT COUNT(*) FROM {table} WHERE user_id = ? AND embedding IS NOT NULL"
        " AND id IN (SELECT value FROM json_each(?))",
        (user_id, ids),
    ).fetchone()[0]
    for statement in (
        "DELETE FROM provenance WHERE user_id = ? AND node_id IN (SELECT value FROM json_each(?))",
        "DELETE FROM cluster_members WHERE user_id = ? AND member_id IN (SELECT value FROM json_each(?))",
        f"DELETE FROM {table} WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))",
    ):
        conn.execute(statement, (user_id, ids))
    return int(vectors)


def _chunk_ids(conn: sqlite3.Connection, user_id: str, episode_ids: Sequence[str] | None) -> list[str]:
    """The chunk ids of some episodes (of all of them when None)."""
    rows = conn.execute(
        """SELECT id FROM chunks WHERE user_id = :user_id
            AND (:episodes IS NULL OR episode_id IN (SELECT value FROM json_each(:episodes))) ORDER BY id""",
        {"user_id": user_id, "episodes": None if episode_ids is None else _ids(episode_ids)},
    ).fetchall()
    return [r[0] for r in rows]


class SqliteGraphStore(GraphStore):
    """The graph-store contract over one SQLite file (the default when no Neo4j is configured)."""

    def __init__(self, *, path: pathlib.Path) -> None:
        self._path = pathlib.Path(path)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        # Connections a forked child inherited: SQLite forbids touching them (not even to close), so
        # they are kept referenced here instead of being closed by the garbage collector.
        self._inherited: list[sqlite3.Connection] = []
        self._pid = os.getpid()

    # ------------------------------------------------------------------------------- connections
    def _conn(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:
            with self._lock:
                if os.getpid() != self._pid:
                    self._inherited.extend(self._connections)
                    self._connections = []
                    self._local = threading.local()
                    self._pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create {self._path.parent}: {exc}") from exc
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE for writes) instead of the
        # module's implicit ones; check_same_thread=False only so close() can close every thread's one.
        conn = sqlite3.connect(self._path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        episodes_sql.register_functions(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        fence = self._fence()
        try:
            # The fence check: BEGIN IMMEDIATE holds the database write lock, so nothing moves after it.
            if fence is not None:
                fence.check_before(_stamp(conn, fence.user_id))
            yield conn
            after = None if fence is None else _stamp(conn, fence.user_id)
        except BaseException:
            # SQLite may already have rolled back on its own (e.g. SQLITE_FULL); don't mask the cause.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if fence is not None and after is not None:
            fence.expected = after

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One snapshot for reads that combine several statements (e.g. vectors + version)."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    # --------------------------------------------------------------------------------- lifecycle
    def ensure_schema(self) -> None:
        conn = self._conn()
        try:
            conn.executescript(_SCHEMA)
        except BaseException:
            # executescript stops at the failing statement and would leave the script's BEGIN open.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        # Files created before user epochs existed: add the column (its users read as epoch 0).
        if "epoch" not in {r["name"] for r in conn.execute("PRAGMA table_info(users)")}:
            try:
                conn.execute("ALTER TABLE users ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another process added it first
                    raise

    def ping(self) -> None:
        try:
            self._conn().execute("SELECT 1").fetchone()
        except sqlite3.OperationalError as exc:
            message = str(exc).lower()
            if "unable to open" in message or "disk i/o" in message:
                raise StoreUnavailableError(f"SQLite store {self._path}: {exc}") from exc
            raise

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            self._local = threading.local()
        for conn in connections:
            conn.close()

    # ------------------------------------------------------------------------------------ ingest
    def is_applied(self, user_id: str, message_id: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM episodes WHERE user_id = ? AND id = ?", (user_id, message_id))
            .fetchone()
        )
        return row is not None

    def _find_entities(self, user_id: str, norm_names: list[str]) -> list[EntityRecord]:
        rows = (
            self._conn()
            .execute(
                """
                SELECT e.* FROM entities e
                 WHERE e.user_id = :user_id
                   AND (e.norm_name IN (SELECT value FROM json_each(:names))
                        OR e.id IN (SELECT a.entity_id FROM entity_aliases a
                                     WHERE a.user_id = :user_id
                                       AND a.norm_alias IN (SELECT value FROM json_each(:names))))
                 ORDER BY e.norm_name, e.id
                """,
                {"user_id": user_id, "names": _ids(norm_names)},
            )
            .fetchall()
        )
        return [_entity(r) for r in rows]

    def _get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
        rows = (
            self._conn()
            .execute(
                "SELECT * FROM entities WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))"
                " ORDER BY norm_name, id",
                (user_id, _ids(entity_ids)),
            )
            .fetchall()
        )
        return [_entity(r) for r in rows]

    def _recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        rows = (
            self._conn()
            .execute(
                "SELECT * FROM episodes WHERE user_id = ? AND event_time < ? ORDER BY event_time DESC, id DESC LIMIT ?",
                (user_id, _us(before), limit),
            )
            .fetchall()
        )
        return [
            EpisodeRecord(
                id=r["id"],
                user_id=r["user_id"],
                content=r["content"],
                role=r["role"],
                event_time=_dt(r["event_time"]),
                metadata=json.loads(r["metadata"]),
                created_at=_dt(r["created_at"]),
                updated_at=_dt(r["updated_at"]),
            )
            for r in reversed(rows)
        ]

    def _facts_for_slots(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"""{_FACT_SELECT} {_FACT_FROM}
                JOIN (SELECT json_extract(value, '$[0]') AS subject_id,
                             json_extract(value, '$[1]') AS predicate
                        FROM json_each(:slots)) slot
                  ON slot.subject_id = f.subject_id AND slot.predicate = f.predicate
                WHERE f.user_id = :user_id
                ORDER BY f.valid_from, f.created_at, f.id""",
                {"user_id": user_id, "slots": json.dumps([list(s) for s in slots])},
            )
            .fetchall()
        )
        return [_fact(r) for r in rows]

    def _apply(self, plan: WritePlan) -> ApplyOutcome:
        user_id = plan.user_id
        with self._write() as conn:
            if _episode_exists(conn, user_id, plan.episode.id):
                return ApplyOutcome(applied=False, version=_version(conn, user_id))
            _insert_episode(conn, plan.episode)
            episode_id = plan.episode.id
            episodes_sql.insert_chunks(conn, plan.chunks, _us, _blob)
            for entity in plan.new_entities:
                _insert_entity(conn, entity)
                _link(conn, user_id, entity.id, "entity", episode_id)
            for change in plan.entity_changes:
                _change_entity(conn, user_id, change.id, change.add_aliases, change.summary, change.label)
            _check_fact_entities(conn, plan)
            for fact in plan.new_facts:
                _insert_fact(conn, fact)
                _link(conn, user_id, fact.id, "fact", episode_id)
            now = _us(utcnow())
            # Changes, reinforcements and mentions of ids the user no longer has are skipped, not
            # errors: a forget may have removed them between consolidation and this write.
            for fact_change in plan.fact_changes:
                conn.execute(
                    "UPDATE facts SET valid_until = ?, superseded_by = ?, updated_at = ? WHERE user_id = ? AND id = ?",
                    (
                        _us_opt(fact_change.valid_until),
                        fact_change.superseded_by,
                        now,
                        user_id,
                        fact_change.id,
                    ),
                )
            for fact_id in dict.fromkeys(plan.reinforced_fact_ids):
                updated = conn.execute(
                    "UPDATE facts SET strength = 1.0, archived = 0, updated_at = ? WHERE user_id = ? AND id = ?",
                    (now, user_id, fact_id),
                ).rowcount
                if updated:
                    _link(conn, user_id, fact_id, "fact", episode_id)
            for entity_id in dict.fromkeys(plan.mentioned_entity_ids):
                if _entity_exists(conn, user_id, entity_id):
                    _link(conn, user_id, entity_id, "entity", episode_id)
            for fact_id in dict.fromkeys(plan.linked_fact_ids):
                if conn.execute("SELECT 1 FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone():
                    _link(conn, user_id, fact_id, "fact", episode_id)
            version = _bump(conn, user_id, plan.usage, self._creation_epoch())
        return ApplyOutcome(applied=True, version=version)

    # -------------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        return _stamp(self._conn(), user_id)

    def _get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"""{_FACT_SELECT} {_FACT_FROM}
                WHERE f.user_id = ? AND f.id IN (SELECT value FROM json_each(?))
                ORDER BY f.created_at, f.id""",
                (user_id, _ids(fact_ids)),
            )
            .fetchall()
        )
        return [_fact(r) for r in rows]

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
        rows = (
            self._conn()
            .execute(
                _EXPAND,
                {
                    "user_id": user_id,
                    "seeds": _ids(entity_ids),
                    "max_hops": max_hops,
                    "as_of": _us_opt(as_of),
                    "limit": limit,
                    "per_seed": per_seed,
                    "avoid": _ids(avoid),
                },
            )
            .fetchall()
        )
        return [HopFact(**_fact_fields(r), hops=r["hops"]) for r in rows]

    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"""{_FACT_SELECT} {_FACT_FROM}
                WHERE f.user_id = :user_id
                  AND (:predicate IS NULL OR f.predicate = :predicate)
                  AND f.subject_id IN (
                      SELECT e.id FROM entities e WHERE e.user_id = :user_id AND e.norm_name = :name
                      UNION
                      SELECT a.entity_id FROM entity_aliases a
                       WHERE a.user_id = :user_id AND a.norm_alias = :name)
                ORDER BY f.valid_from DESC, f.created_at DESC, f.id DESC LIMIT :limit""",
                {"user_id": user_id, "predicate": predicate, "name": norm, "limit": limit},
            )
            .fetchall()
        )
        return [_fact(r) for r in rows]

    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        with self._read() as conn:
            total = conn.execute("SELECT COUNT(*) FROM facts WHERE user_id = ?", (user_id,)).fetchone()[0]
            fact_rows = conn.execute(
                f"""{_FACT_SELECT} {_FACT_FROM}
                WHERE f.user_id = ? ORDER BY f.created_at, f.id LIMIT ? OFFSET ?""",
                (user_id, limit, skip),
            ).fetchall()
            facts = [_fact(r) for r in fact_rows]
            entity_rows = conn.execute(
                """SELECT e.* FROM entities e
                    WHERE e.user_id = ?
                      AND e.id IN (SELECT m.entity_id FROM mentions m
                                    WHERE m.user_id = e.user_id
                                      AND m.fact_id IN (SELECT value FROM json_each(?)))
                    ORDER BY e.norm_name, e.id""",
                (user_id, _ids([f.id for f in facts])),
            ).fetchall()
        return total, facts, [_entity(r) for r in entity_rows]

    def stats(self, user_id: str) -> UserStats:
        with self._read() as conn:
            facts = conn.execute(
                """SELECT COUNT(*),
                          COALESCE(SUM(valid_until IS NULL AND archived = 0), 0),
                          COALESCE(SUM(valid_until IS NOT NULL), 0),
                          COALESCE(SUM(archived = 1), 0)
                     FROM facts WHERE user_id = ?""",
                (user_id,),
            ).fetchone()
            counts = {
                table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE user_id = ?", (user_id,)).fetchone()[0]
                for table in ("entities", "episodes", "clusters")
            }
            user = conn.execute("SELECT * FROM users WHERE user_id = ?", (user_id,)).fetchone()
            chunks, keyword_entries = episodes_sql.chunk_counts(conn, user_id)
        usage = Usage()
        if user is not None:
            usage = Usage(
                prompt_tokens=user["prompt_tokens"],
                completion_tokens=user["completion_tokens"],
                cost_usd=user["cost_usd"],
                llm_calls=user["llm_calls"],
            )
        return UserStats(
            user_id=user_id,
            entities=counts["entities"],
            facts=facts[0],
            current_facts=facts[1],
            superseded_facts=facts[2],
            archived_facts=facts[3],
            episodes=counts["episodes"],
            episode_chunks=chunks,
            keyword_entries=keyword_entries,
            clusters=counts["clusters"],
            version=0 if user is None else user["version"],
            usage=usage,
        )

    def vectors(self, user_id: str) -> tuple[list[VectorItem], int]:
        with self._read() as conn:
            rows = conn.execute(
                """SELECT id, 'fact' AS kind, embedding FROM facts
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'entity' AS kind, embedding FROM entities
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'episode' AS kind, embedding FROM chunks
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   ORDER BY kind, id""",
                {"user_id": user_id},
            ).fetchall()
            version = _version(conn, user_id)
        items = [VectorItem(node_id=r["id"], kind=r["kind"], embedding=_vector(r["embedding"])) for r in rows]
        return items, version

    def _get_chunks(self, user_id: str, chunk_ids: list[str], episode_ids: list[str]) -> list[ChunkRecord]:
        return episodes_sql.get_chunks(self._conn(), user_id, chunk_ids=chunk_ids, episode_ids=episode_ids, dt=_dt)

    def _add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        with self._write() as conn:
            added = episodes_sql.add_chunks(conn, user_id, chunks, _us, _blob)
            if added:
                _bump(conn, user_id, None)
        return added

    def _remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        with self._write() as conn:
            removed = episodes_sql.delete_chunks(conn, user_id, chunk_ids)
            if removed:
                _bump(conn, user_id, None)
        return removed

    def _neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        return episodes_sql.neighbour_chunks(self._conn(), user_id, chunk_ids, window, _dt)

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
        return episodes_sql.keyword_search(
            self._conn(), user_id, terms, k, as_of=_us_opt(as_of), since=_us_opt(since), until=_us_opt(until)
        )

    def list_users(self) -> list[str]:
        rows = self._conn().execute("SELECT user_id FROM users ORDER BY user_id").fetchall()
        return [r["user_id"] for r in rows]

    def episodes(self, user_id: str) -> list[StoredEpisode]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM episodes WHERE user_id = ? ORDER BY event_time, id", (user_id,)
            ).fetchall()
            links = conn.execute(
                "SELECT episode_id, node_id, node_kind FROM provenance WHERE user_id = ? ORDER BY node_id",
                (user_id,),
            ).fetchall()
        linked: dict[tuple[str, str], list[str]] = {}
        for link in links:
            linked.setdefault((link["episode_id"], link["node_kind"]), []).append(link["node_id"])
        return [
            StoredEpisode(
                id=r["id"],
                user_id=user_id,
                content=r["content"],
                role=r["role"],
                event_time=_dt(r["event_time"]),
                metadata=json.loads(r["metadata"]),
                created_at=_dt(r["created_at"]),
                updated_at=_dt(r["updated_at"]),
                fact_ids=linked.get((r["id"], "fact"), []),
                entity_ids=linked.get((r["id"], "entity"), []),
            )
            for r in rows
        ]

    # ------------------------------------------------------------------------------------ delete
    def _forget_scope(
        self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None
    ) -> ForgetScope | None:
        with self._read() as conn:
            if episode_id is not None:
                if not _episode_exists(conn, user_id, episode_id):
                    return None
                sourced = conn.execute(
                    """SELECT p.node_id, p.node_kind,
                              (SELECT COUNT(*) FROM provenance q
                                WHERE q.user_id = p.user_id AND q.node_id = p.node_id) AS sources
                         FROM provenance p WHERE p.user_id = ? AND p.episode_id = ?""",
                    (user_id, episode_id),
                ).fetchall()
                doomed = [r["node_id"] for r in sourced if r["node_kind"] == "fact" and r["sources"] == 1]
                candidates = {r["node_id"] for r in sourced if r["node_kind"] == "entity"}
                chunk_ids = _chunk_ids(conn, user_id, [episode_id])
            else:
                if not conn.execute("SELECT 1 FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone():
                    return None
                doomed, candidates, chunk_ids = [str(fact_id)], set(), []
            params = {"user_id": user_id, "doomed": _ids(doomed)}
            candidates.update(
                r[0]
                for r in conn.execute(
                    "SELECT entity_id FROM mentions WHERE user_id = :user_id"
                    " AND fact_id IN (SELECT value FROM json_each(:doomed))",
                    params,
                )
            )
            params["candidates"] = _ids(sorted(candidates))
            links = conn.execute(
                """SELECT id, superseded_by, 1 AS doomed FROM facts
                    WHERE user_id = :user_id AND superseded_by IS NOT NULL
                      AND id IN (SELECT value FROM json_each(:doomed))
                   UNION ALL
                   SELECT id, superseded_by, 0 FROM facts
                    WHERE user_id = :user_id AND superseded_by IN (SELECT value FROM json_each(:doomed))""",
                params,
            ).fetchall()
            vectored = conn.execute(
                """SELECT id FROM facts WHERE user_id = :user_id AND embedding IS NOT NULL
                      AND id IN (SELECT value FROM json_each(:doomed))
                   UNION ALL
                   SELECT id FROM entities WHERE user_id = :user_id AND embedding IS NOT NULL
                      AND id IN (SELECT value FROM json_each(:candidates))""",
                params,
            ).fetchall()
        return ForgetScope(
            doomed_fact_ids=doomed,
            entity_candidates=sorted(candidates),
            chunk_ids=chunk_ids,
            vectored=[r[0] for r in vectored],
            successor_of={r["id"]: r["superseded_by"] for r in links if r["doomed"]},
            older=[(r["id"], r["superseded_by"]) for r in links if not r["doomed"]],
        )

    def _apply_forget(self, plan: ForgetPlan) -> list[str]:
        user_id = plan.user_id
        with self._write() as conn:
            if plan.episode_id is not None:
                # Cascades to every remaining FROM link to the episode and to its chunks (whose triggers
                # drop their keyword entries).
                conn.execute("DELETE FROM episodes WHERE user_id = ? AND id = ?", (user_id, plan.episode_id))
            now = _us(utcnow())
            conn.executemany(
                """UPDATE facts SET superseded_by = :successor, updated_at = :now,
                          valid_until = CASE WHEN :successor IS NULL THEN NULL ELSE valid_until END
                    WHERE user_id = :user_id AND id = :id""",
                [{"successor": r.successor, "now": now, "user_id": user_id, "id": r.fact_id} for r in plan.repairs],
            )
            _delete_nodes(conn, user_id, "facts", plan.fact_ids)
            orphans = [
                r[0]
                for r in conn.execute(
                    """SELECT e.id FROM entities e
                        WHERE e.user_id = :user_id AND e.id IN (SELECT value FROM json_each(:ids))
                          AND NOT EXISTS (SELECT 1 FROM provenance p
                                           WHERE p.user_id = :user_id AND p.node_id = e.id)
                          AND NOT EXISTS (SELECT 1 FROM mentions m
                                           WHERE m.user_id = :user_id AND m.entity_id = e.id)""",
                    {"user_id": user_id, "ids": _ids(plan.entity_candidates)},
                )
            ]
            _delete_nodes(conn, user_id, "entities", orphans)
            _bump(conn, user_id, None)
        return orphans

    def forget_user(self, user_id: str) -> ForgetResult:
        with self._write() as conn:
            fact_ids = [r[0] for r in conn.execute("SELECT id FROM facts WHERE user_id = ? ORDER BY id", (user_id,))]
            entity_ids = [
                r[0] for r in conn.execute("SELECT id FROM entities WHERE user_id = ? ORDER BY id", (user_id,))
            ]
            chunk_ids = _chunk_ids(conn, user_id, None)
            episodes = conn.execute("DELETE FROM episodes WHERE user_id = ?", (user_id,)).rowcount
            fact_vectors = _delete_nodes(conn, user_id, "facts", fact_ids)
            entity_vectors = _delete_nodes(conn, user_id, "entities", entity_ids)
            for table in ("provenance", "cluster_members", "clusters", "feedback", "users"):
                conn.execute(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM weights WHERE scope = ?", (user_id,))
        return ForgetResult(
            user_id=user_id,
            episodes=episodes,
            facts=len(fact_ids),
            entities=len(entity_ids),
            vectors=fact_vectors + entity_vectors + len(chunk_ids),
            removed_fact_ids=fact_ids,
            removed_entity_ids=entity_ids,
            removed_chunk_ids=chunk_ids,
        )

    # ------------------------------------------------------------------------------- maintenance
    def _decay_batch(
        self, user_id: str, *, now: datetime, batch: int, fade: Callable[[float, datetime], tuple[float, bool]]
    ) -> list[bool]:
        now_us = _us(now)
        with self._write() as conn:
            rows = conn.execute(
                """SELECT id, strength, COALESCE(last_decay_at, created_at) AS since FROM facts
                    WHERE user_id = ? AND archived = 0 AND COALESCE(last_decay_at, created_at) < ?
                    ORDER BY id LIMIT ?""",
                (user_id, now_us, batch),
            ).fetchall()
            faded = [(r["id"], *fade(r["strength"], _dt(r["since"]))) for r in rows]
            conn.executemany(
                "UPDATE facts SET strength = ?, archived = ?, last_decay_at = ?, updated_at = ?"
                " WHERE user_id = ? AND id = ?",
                [(strength, int(drop), now_us, now_us, user_id, fid) for fid, strength, drop in faded],
            )
            if faded:
                _bump(conn, user_id, None)
        return [drop for _, _, drop in faded]

    def _reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        with self._write() as conn:
            changed = conn.execute(
                """UPDATE facts SET strength = MIN(1.0, strength + :amount), archived = 0, updated_at = :now
                    WHERE user_id = :user_id AND id IN (SELECT value FROM json_each(:ids))
                      AND (archived = 1 OR MIN(1.0, strength + :amount) != strength)""",
                {"amount": amount, "now": _us(now), "user_id": user_id, "ids": _ids(fact_ids)},
            ).rowcount
            if changed:
                _bump(conn, user_id, None)
        return changed

    def _replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM clusters WHERE user_id = ?", (user_id,))
            for cluster in clusters:
                conn.execute(
                    "INSERT INTO clusters (id, user_id, label, summary, centroid, signature, created_at,"
                    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        cluster.id,
                        user_id,
                        cluster.label,
                        cluster.summary,
                        _blob(cluster.centroid),
                        cluster.signature,
                        _us(cluster.created_at),
                        _us(cluster.updated_at),
                    ),
                )
                # Like a graph relationship, a member link needs the member to exist for this user.
                for kind, table, ids in (
                    ("fact", "facts", cluster.member_fact_ids),
                    ("entity", "entities", cluster.member_entity_ids),
                ):
                    conn.execute(
                        f"""INSERT OR IGNORE INTO cluster_members
                                   (cluster_id, member_id, member_kind, user_id)
                            SELECT ?, n.id, ?, n.user_id FROM {table} n
                             WHERE n.user_id = ? AND n.id IN (SELECT value FROM json_each(?))""",
                        (cluster.id, kind, user_id, _ids(ids)),
                    )
            _bump(conn, user_id, None)

    def clusters(self, user_id: str) -> list[ClusterRecord]:
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM clusters WHERE user_id = ? ORDER BY id", (user_id,)).fetchall()
            members = conn.execute(
                "SELECT cluster_id, member_id, member_kind FROM cluster_members WHERE user_id = ? ORDER BY member_id",
                (user_id,),
            ).fetchall()
        by_cluster: dict[str, dict[str, list[str]]] = {r["id"]: {"fact": [], "entity": []} for r in rows}
        for m in members:
            by_cluster[m["cluster_id"]][m["member_kind"]].append(m["member_id"])
        return [
            ClusterRecord(
                id=r["id"],
                user_id=r["user_id"],
                created_at=_dt(r["created_at"]),
                updated_at=_dt(r["updated_at"]),
                label=r["label"],
                summary=r["summary"],
                member_fact_ids=by_cluster[r["id"]]["fact"],
                member_entity_ids=by_cluster[r["id"]]["entity"],
                centroid=_vector(r["centroid"]),
                signature=r["signature"],
            )
            for r in rows
        ]

    def _add_feedback(self, rows: list[FeedbackRow]) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO feedback (user_id, recall_id, fact_id, useful, similarity, graph, strength,"
                " recency, importance, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.user_id,
                        r.recall_id,
                        r.fact_id,
                        int(r.useful),
                        r.similarity,
                        r.graph,
                        r.strength,
                        r.recency,
                        r.importance,
                        _us(r.created_at),
                    )
                    for r in rows
                ],
            )

    def _feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        # Two statements rather than "user_id IS NULL OR ...", which would keep one user's read from
        # using the (user_id, created_at) index.
        conn = self._conn()
        if user_id is None:
            rows = conn.execute("SELECT * FROM feedback ORDER BY created_at DESC, seq DESC LIMIT ?", (limit,))
        else:
            rows = conn.execute(
                "SELECT * FROM feedback WHERE user_id = ? ORDER BY created_at DESC, seq DESC LIMIT ?",
                (user_id, limit),
            )
        return [
            FeedbackRow(
                user_id=r["user_id"],
                recall_id=r["recall_id"],
                fact_id=r["fact_id"],
                useful=bool(r["useful"]),
                similarity=r["similarity"],
                graph=r["graph"],
                strength=r["strength"],
                recency=r["recency"],
                importance=r["importance"],
                created_at=_dt(r["created_at"]),
            )
            for r in rows
        ]

    def save_weights(self, weights: LearnedWeights) -> None:
        with self._write() as conn:
            conn.execute(
                """INSERT INTO weights (scope, alpha, beta, gamma, recency_weight, importance_weight, samples,
                                        quality, fitted_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (scope) DO UPDATE SET
                       alpha = excluded.alpha, beta = excluded.beta, gamma = excluded.gamma,
                       recency_weight = excluded.recency_weight,
                       importance_weight = excluded.importance_weight,
                       samples = excluded.samples, quality = excluded.quality,
                       fitted_at = excluded.fitted_at""",
                (
                    weights.scope,
                    weights.alpha,
                    weights.beta,
                    weights.gamma,
                    weights.recency_weight,
                    weights.importance_weight,
                    weights.samples,
                    weights.quality,
                    _us(weights.fitted_at),
                ),
            )

    def load_weights(self, scope: str) -> LearnedWeights | None:
        row = self._conn().execute("SELECT * FROM weights WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return None
        return LearnedWeights(
            scope=row["scope"],
            alpha=row["alpha"],
            beta=row["beta"],
            gamma=row["gamma"],
            recency_weight=row["recency_weight"],
            importance_weight=row["importance_weight"],
            samples=row["samples"],
            quality=row["quality"],
            fitted_at=_dt(row["fitted_at"]),
        )
