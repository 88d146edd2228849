"""SQLite side of episodes as memories: chunk rows, the FTS5 keyword index, and their queries.

Invariants:
- ``chunks`` rows belong to an episode (foreign key, ON DELETE CASCADE), so deleting an episode or a
  user deletes its chunks in the same transaction;
- the FTS5 tables ``chunks_fts`` and ``facts_fts`` share their rowids with ``chunks`` and ``facts`` and
  are kept in step by triggers, so no write path can forget them (forget, forget_user, cascades);
- every FTS row carries the user's token (``episodes.user_key``, computed by the ``engram_ukey`` SQL
  function each connection registers) and every MATCH requires it, so BM25's top-k is the user's own;
  the join on ``user_id`` repeats the scope as defence in depth.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from engram_api.models import ChunkRecord, KeywordHit
from engram_api.storage.graph.episodes import user_key
from engram_api.storage.graph.validity import VALID_AT_SQL

__all__ = [
    "FACT_VALID_AT",
    "FTS_TABLES",
    "SCHEMA",
    "add_chunks",
    "chunk_counts",
    "chunks_to_reembed",
    "delete_chunks",
    "get_chunks",
    "insert_chunks",
    "keyword_search",
    "neighbour_chunks",
    "reembed_chunks",
    "register_functions",
]

FTS_TABLES = ("chunks_fts", "facts_fts")

# The user's fact, valid at :at (``validity``).
FACT_VALID_AT = f"f.user_id = :user_id AND {VALID_AT_SQL}"

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    rowid      INTEGER PRIMARY KEY,
    id         TEXT    NOT NULL,
    user_id    TEXT    NOT NULL,
    episode_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    text       TEXT    NOT NULL,
    speaker    TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    event_time INTEGER NOT NULL,
    embedding  BLOB,
    created_at INTEGER NOT NULL,
    changed    INTEGER NOT NULL DEFAULT 0,  -- the version of the write that created it
    embedded_with TEXT,  -- the ENGRAM_CHUNK_EMBED_CONTEXT its vector was made with; NULL: not known
    token_states BLOB,  -- its own words' packed token states (embedding.states); NULL: none
    UNIQUE (user_id, id),
    FOREIGN KEY (user_id, episode_id) REFERENCES episodes (user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS ix_chunks_user_episode ON chunks (user_id, episode_id, seq);
CREATE INDEX IF NOT EXISTS ix_chunks_user_time ON chunks (user_id, event_time, episode_id, seq);

CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5 (ukey, body, tokenize = 'porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5 (ukey, body, tokenize = 'porter unicode61');

CREATE TRIGGER IF NOT EXISTS chunks_fts_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts (rowid, ukey, body)
    VALUES (new.rowid, engram_ukey(new.user_id),
            CASE WHEN new.speaker = new.role THEN new.text ELSE new.speaker || ': ' || new.text END);
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_delete AFTER DELETE ON chunks BEGIN
    DELETE FROM chunks_fts WHERE rowid = old.rowid;
END;
CREATE TRIGGER IF NOT EXISTS facts_fts_insert AFTER INSERT ON facts BEGIN
    INSERT INTO facts_fts (rowid, ukey, body) VALUES (new.rowid, engram_ukey(new.user_id), new.statement);
END;
CREATE TRIGGER IF NOT EXISTS facts_fts_delete AFTER DELETE ON facts BEGIN
    DELETE FROM facts_fts WHERE rowid = old.rowid;
END;

-- Facts stored before the keyword index existed join it once.
INSERT INTO facts_fts (rowid, ukey, body)
SELECT f.rowid, engram_ukey(f.user_id), f.statement FROM facts f
 WHERE NOT EXISTS (SELECT 1 FROM facts_fts x WHERE x.rowid = f.rowid);
"""

_CHUNK_COLUMNS = """
SELECT c.id, c.user_id, c.episode_id, c.seq, c.text, c.speaker, c.role, c.event_time, c.created_at,
       (SELECT json_group_array(p.node_id) FROM provenance p
         WHERE p.user_id = c.user_id AND p.episode_id = c.episode_id AND p.node_kind = 'fact') AS fact_ids
"""

_TIME_FILTER = """
    AND (:as_of IS NULL OR c.event_time <= :as_of)
    AND (:since IS NULL OR c.event_time >= :since)
    AND (:until IS NULL OR c.event_time < :until)
"""

# BM25's top :k of one table, each scoped to the user (the MATCH's ukey and the join's user_id).
_KEYWORD = {
    "chunks": f"""
    SELECT c.id AS node_id, 'episode' AS kind, -bm25(chunks_fts, 0.0, 1.0) AS score
      FROM chunks_fts CROSS JOIN chunks c ON c.rowid = chunks_fts.rowid
     WHERE chunks_fts MATCH :match AND c.user_id = :user_id {_TIME_FILTER}
     ORDER BY score DESC LIMIT :k""",
    "facts": f"""
    SELECT f.id AS node_id, 'fact' AS kind, -bm25(facts_fts, 0.0, 1.0) AS score
      FROM facts_fts CROSS JOIN facts f ON f.rowid = facts_fts.rowid
     WHERE facts_fts MATCH :match AND {FACT_VALID_AT}
     ORDER BY score DESC LIMIT :k""",
}

# The `window` chunks before or after one chunk in the user's conversation order: one index range
# scan on (user_id, event_time, episode_id, seq) each way.
_NEIGHBOURS = {
    direction: f"""
{_CHUNK_COLUMNS}
FROM chunks c
WHERE c.user_id = :user_id AND c.rowid IN (
    SELECT n.rowid FROM chunks x CROSS JOIN chunks n
     WHERE x.user_id = :user_id AND x.id = :id AND n.user_id = :user_id
       AND (n.event_time, n.episode_id, n.seq) {op} (x.event_time, x.episode_id, x.seq)
     ORDER BY n.event_time {order}, n.episode_id {order}, n.seq {order} LIMIT :window)
"""
    for direction, op, order in (("before", "<", "DESC"), ("after", ">", "ASC"))
}


def register_functions(conn: sqlite3.Connection) -> None:
    conn.create_function("engram_ukey", 1, user_key, deterministic=True)


def insert_chunks(
    conn: sqlite3.Connection, chunks: Sequence[ChunkRecord], us: Any, blob: Any, context: str | None
) -> None:
    """Insert chunks whose vectors were made under ``context`` (``WritePlan.chunk_context``)."""
    conn.executemany(
        """INSERT INTO chunks (id, user_id, episode_id, seq, text, speaker, role, event_time, embedding, created_at,
                               embedded_with, token_states)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        [
            (c.id, c.user_id, c.episode_id, c.seq, c.text, c.speaker, c.role, us(c.event_time), blob(c.embedding),
             us(c.created_at), context, c.token_states)
            for c in chunks
        ],
    )  # fmt: skip


def add_chunks(conn: sqlite3.Connection, user_id: str, chunks: Sequence[ChunkRecord], us: Any, blob: Any) -> int:
    """Insert the chunks of stored episodes of the user that have no chunk yet (see ``GraphStore.add_chunks``);
    their vectors are of the words alone (``none``)."""
    wanted = sorted({c.episode_id for c in chunks if c.user_id == user_id})
    open_ids = {
        r[0]
        for r in conn.execute(
            """SELECT e.id FROM episodes e WHERE e.user_id = :user_id AND e.id IN (SELECT value FROM json_each(:ids))
                  AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.user_id = e.user_id AND c.episode_id = e.id)""",
            {"user_id": user_id, "ids": json.dumps(wanted)},
        )
    }
    rows = [c for c in chunks if c.user_id == user_id and c.episode_id in open_ids]
    insert_chunks(conn, rows, us, blob, "none")
    return len(rows)


# The re-embedding pass (``GraphStore.chunks_to_reembed``): a user's chunks of another (or no) recorded
# policy, a page by id.
_TO_REEMBED = f"""{_CHUNK_COLUMNS} FROM chunks c
 WHERE c.user_id = :user_id AND c.id > :after AND c.embedded_with IS NOT :context
 ORDER BY c.id LIMIT :batch"""


def chunks_to_reembed(
    conn: sqlite3.Connection, user_id: str, context: str, after: str, batch: int, dt: Any
) -> list[ChunkRecord]:
    params = {"user_id": user_id, "context": context, "after": after, "batch": batch}
    return [_chunk(r, dt) for r in conn.execute(_TO_REEMBED, params)]


def reembed_chunks(
    conn: sqlite3.Connection,
    user_id: str,
    context: str,
    vectors: Sequence[tuple[str, bytes | None]],
    states: Mapping[str, bytes],
) -> list[str]:
    """Give each chunk still of another policy its vector, its token states (``states``; none when absent)
    and ``context``; the ids written, sorted."""
    written = []
    for chunk_id, blob in vectors:
        row = conn.execute(
            """UPDATE chunks SET embedding = ?, token_states = ?, embedded_with = ?
                WHERE user_id = ? AND id = ? AND embedded_with IS NOT ? RETURNING id""",
            (blob, states.get(chunk_id), context, user_id, chunk_id, context),
        ).fetchone()
        if row is not None:
            written.append(row[0])
    return sorted(written)


def delete_chunks(conn: sqlite3.Connection, user_id: str, chunk_ids: Sequence[str]) -> list[str]:
    """Delete chunks by id (the FTS trigger removes their keyword entries); the ids removed, sorted."""
    rows = conn.execute(
        """DELETE FROM chunks WHERE user_id = :user_id AND id IN (SELECT value FROM json_each(:ids)) RETURNING id""",
        {"user_id": user_id, "ids": json.dumps(list(chunk_ids))},
    ).fetchall()
    return sorted(r[0] for r in rows)


def _chunk(row: sqlite3.Row, dt: Any) -> ChunkRecord:
    return ChunkRecord(
        id=row["id"],
        user_id=row["user_id"],
        episode_id=row["episode_id"],
        seq=row["seq"],
        text=row["text"],
        speaker=row["speaker"],
        role=row["role"],
        event_time=dt(row["event_time"]),
        created_at=dt(row["created_at"]),
        updated_at=dt(row["created_at"]),
        fact_ids=sorted(json.loads(row["fact_ids"])),
    )


def get_chunks(
    conn: sqlite3.Connection,
    user_id: str,
    *,
    chunk_ids: Sequence[str] = (),
    episode_ids: Sequence[str] = (),
    dt: Any,
) -> list[ChunkRecord]:
    rows = conn.execute(
        f"""{_CHUNK_COLUMNS} FROM chunks c
            WHERE c.user_id = :user_id
              AND (c.id IN (SELECT value FROM json_each(:ids))
                   OR c.episode_id IN (SELECT value FROM json_each(:episodes)))
            ORDER BY c.event_time, c.episode_id, c.seq""",
        {"user_id": user_id, "ids": json.dumps(list(chunk_ids)), "episodes": json.dumps(list(episode_ids))},
    ).fetchall()
    return [_chunk(r, dt) for r in rows]


def user_chunks(conn: sqlite3.Connection, user_id: str, *, dt: Any, since: int = -1) -> list[ChunkRecord]:
    """Every chunk of the user marked after version ``since`` (all by default), in no particular order
    (``UserSnapshot.of`` orders them)."""
    return list(each_user_chunk(conn, user_id, dt=dt, since=since))


def each_user_chunk(conn: sqlite3.Connection, user_id: str, *, dt: Any, since: int = -1) -> Iterator[ChunkRecord]:
    """``user_chunks``, one at a time as the rows are read (run when first asked)."""
    for row in conn.execute(f"{_CHUNK_COLUMNS} FROM chunks c WHERE c.user_id = ? AND c.changed > ?", (user_id, since)):
        yield _chunk(row, dt)


def neighbour_chunks(
    conn: sqlite3.Connection, user_id: str, chunk_ids: Sequence[str], window: int, dt: Any
) -> list[ChunkRecord]:
    if window <= 0 or not chunk_ids:
        return []
    found: dict[str, ChunkRecord] = {}
    for chunk_id in dict.fromkeys(chunk_ids):
        for query in _NEIGHBOURS.values():
            for row in conn.execute(query, {"user_id": user_id, "id": chunk_id, "window": window}):
                found.setdefault(row["id"], _chunk(row, dt))
    return list(found.values())


def keyword_search(
    conn: sqlite3.Connection,
    user_id: str,
    terms: Sequence[str],
    k: int,
    *,
    as_of: int | None,
    since: int | None,
    until: int | None,
    at: int,
) -> list[KeywordHit]:
    """BM25's top ``k`` chunks and ``k`` facts of the user for any of ``terms``: chunks in the window
    (``as_of``, ``since``, ``until``), facts valid at ``at``.

    A term in at least half of a table's rows is left out of that table's first query: FTS5 floors its
    IDF at 1e-6 (``idf = log((N - n + 0.5) / (n + 0.5))``, ``1e-6`` when not positive), so it adds at most
    ~2e-6 to any score and only decides the order of rows that match nothing else, yet it makes FTS5
    score and join every row it matches (``ops/bench/recall_ab.py``'s 100K-fact user, 80 % of whose facts
    say "User": 79K rows; the facts query 177 -> 40 ms p50 over 40 queries). When a table thus cut returns
    fewer than ``k`` rows the query runs again with every term, so the rows it could have added are
    there; the answer is the full query's up to the floored terms' ~2e-6 of score."""
    if not terms or k <= 0:
        return []
    ukey = user_key(user_id)
    params = {"user_id": user_id, "k": k, "as_of": as_of, "since": since, "until": until, "at": at}
    rows: list[sqlite3.Row] = []
    for table, query in _KEYWORD.items():
        informative = _informative(conn, table, terms)
        found = conn.execute(query, {**params, "match": _match(ukey, informative)}).fetchall()
        if len(found) < k and len(informative) < len(terms):
            found = conn.execute(query, {**params, "match": _match(ukey, terms)}).fetchall()
        rows += found
    hits = [KeywordHit(node_id=r["node_id"], kind=r["kind"], score=float(r["score"])) for r in rows]
    return sorted(hits, key=lambda h: (-h.score, h.node_id))


def _match(ukey: str, terms: Sequence[str]) -> str:
    wanted = " OR ".join(f'body : "{t}"' for t in terms)
    return f"ukey : {ukey} AND ({wanted})"


def _informative(conn: sqlite3.Connection, table: str, terms: Sequence[str]) -> list[str]:
    """``terms`` minus those in at least half of the rows of ``table``'s keyword index (all of them if
    that leaves none). The index's rows are the table's (the triggers), and its largest rowid bounds
    their count from above, so a term is only dropped when its IDF is surely floored; counting a term's
    rows stops at that half."""
    largest = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
    half = (largest + 1) // 2
    kept = [
        t
        for t in terms
        if conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {table}_fts WHERE {table}_fts MATCH ? LIMIT ?)",
            (f'body : "{t}"', half),
        ).fetchone()[0]
        < half
    ]
    return kept or list(terms)


def chunk_counts(conn: sqlite3.Connection, user_id: str) -> tuple[int, int]:
    """(episode chunks, keyword entries) of the user, counted in the index itself."""
    ukey = user_key(user_id)
    chunks = conn.execute("SELECT COUNT(*) FROM chunks WHERE user_id = ?", (user_id,)).fetchone()[0]
    entries = sum(
        conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {table} MATCH ?", (f"ukey : {ukey}",)).fetchone()[0]
        for table in ("chunks_fts", "facts_fts")
    )
    return int(chunks), int(entries)
