"""Vector catch-up reads on SQLite: what changed in a user's vectors after a version, as a mixin of
``SqliteGraphStore`` (the contract and the invariants are ``vectorsync``'s).

Writes mark their facts, entities and chunks with ``changed`` and log the ids they delete in ``removals``
(``sqlite_rows.bump``); this reads both back through the ``(user_id, changed)`` and ``(user_id, version)``
indexes in one read transaction, which on SQLite is a snapshot (the stamp is read twice all the same, as
the contract says).
"""

from __future__ import annotations

from engram_api.storage.faiss.sync import VectorChanges
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite.connection import SqliteConnection

__all__ = ["SqliteVectors"]

_UPSERTS = """
SELECT id, 'fact' AS kind, embedding FROM facts
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
UNION ALL
SELECT id, 'entity' AS kind, embedding FROM entities
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
UNION ALL
SELECT id, 'episode' AS kind, embedding FROM chunks
 WHERE user_id = :user_id AND changed > :since AND embedding IS NOT NULL
"""


class SqliteVectors(SqliteConnection):
    """``vector_changes`` of the graph-store contract on SQLite."""

    def vector_changes(self, user_id: str, since: int) -> VectorChanges:
        import numpy as np  # here: a process that only reads counts and facts never imports numpy

        params = {"user_id": user_id, "since": since}
        with self._read() as conn:
            before = db.read_stamp(conn, user_id)
            row = conn.execute("SELECT vectors_from FROM users WHERE user_id = ?", (user_id,)).fetchone()
            removed = tuple(
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT node_id FROM removals WHERE user_id = :user_id AND version > :since", params
                )
            )
            upserts = [
                (r["id"], r["kind"], np.frombuffer(r["embedding"], dtype=np.float32))
                for r in conn.execute(_UPSERTS, params)
            ]
            after = db.read_stamp(conn, user_id)
        horizon = None if row is None or row[0] is None else int(row[0])
        return VectorChanges(
            stamp=before, horizon=horizon, removed=removed, upserts=upserts, settled=after.epoch == before.epoch
        )
