"""Vector catch-up reads on SQLite: what changed in a user's vectors after a version, as a mixin of
``SqliteGraphStore`` (the contract and the invariants are ``vectorsync``'s).

Writes mark their facts, entities and chunks with ``changed`` and log the ids they delete in ``removals``
(``sqlite_rows.bump``); this reads both back through the ``(user_id, changed)`` and ``(user_id, version)``
indexes in one read transaction, which on SQLite is a snapshot (the stamp is read twice all the same, as
the contract says). ``user_changes`` reads, in the same transaction, the facts and chunks a reader's
snapshot lacks (``engram_api.reader.catchup``).
"""

from __future__ import annotations

import sqlite3

from engram_api.storage.faiss.sync import UserChanges, VectorChanges
from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite import sql
from engram_api.storage.graph.sqlite.connection import SqliteConnection

__all__ = ["SqliteVectors", "removed_since"]

_UPSERTS = """
SELECT id, 'fact' AS kind, embedding, token_states FROM facts
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
UNION ALL
SELECT id, 'entity' AS kind, embedding, NULL FROM entities
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
UNION ALL
SELECT id, 'episode' AS kind, embedding, token_states FROM chunks
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
"""


class SqliteVectors(SqliteConnection):
    """``vector_changes`` and ``user_changes`` of the graph-store contract on SQLite."""

    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        with self._read() as conn:
            return _vectors(conn, user_id, since)

    def user_changes(self, user_id: str, since: int) -> UserChanges:
        # One read transaction, a snapshot on SQLite: the order of the reads inside it does not matter.
        with self._read() as conn:
            vectors = _vectors(conn, user_id, since)
            (removed,) = conn.execute(
                "SELECT COALESCE((SELECT removed FROM users WHERE user_id = ?), 0)", (user_id,)
            ).fetchone()
            rows = conn.execute(
                f"{sql.FACT_SELECT} {sql.FACT_FROM} WHERE f.user_id = ? AND f.changed > ?", (user_id, since)
            ).fetchall()
            chunks = episodes_sql.user_chunks(conn, user_id, dt=db.from_us, since=since)
        return UserChanges(vectors=vectors, removed=int(removed), facts=[db.fact_row(r) for r in rows], chunks=chunks)


def removed_since(conn: sqlite3.Connection, user_id: str, since: int) -> tuple[str, ...]:
    """The ids the user's writes after version ``since`` removed (complete from the user's horizon)."""
    rows = conn.execute("SELECT DISTINCT node_id FROM removals WHERE user_id = ? AND version > ?", (user_id, since))
    return tuple(r[0] for r in rows)


def _vectors(conn: sqlite3.Connection, user_id: str, since: int) -> VectorChanges:
    import numpy as np  # here: a process that only reads counts and facts never imports numpy

    params = {"user_id": user_id, "since": since}
    before = db.read_stamp(conn, user_id)
    row = conn.execute("SELECT vectors_from FROM users WHERE user_id = ?", (user_id,)).fetchone()
    removed = removed_since(conn, user_id, since)
    rows = conn.execute(_UPSERTS, params).fetchall()
    upserts = [(r["id"], r["kind"], np.frombuffer(r["embedding"], dtype=np.float32)) for r in rows]
    states = {r["id"]: r["token_states"] for r in rows if r["token_states"] is not None}
    after = db.read_stamp(conn, user_id)
    horizon = None if row is None or row[0] is None else int(row[0])
    return VectorChanges(
        stamp=before,
        horizon=horizon,
        removed=removed,
        upserts=upserts,
        settled=after.epoch == before.epoch,
        states=states,
    )
