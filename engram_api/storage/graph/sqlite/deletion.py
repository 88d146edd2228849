"""The forget hooks of the SQLite store, mixed into ``SqliteGraphStore``: what one forget would take
(``ForgetScope``, read in one snapshot), applying a ``ForgetPlan``, and removing a user, each write in one
``BEGIN IMMEDIATE`` transaction.

Deleting an episode cascades to its remaining provenance links and its chunks (whose triggers drop their
keyword entries); entities that no provenance or mention keeps go with it.

Deleted bytes leave the files too: every connection runs with ``secure_delete`` (deleted rows and freed
pages are zeroed), and ``purge_erased`` (the last step of every erasure) takes the deleted terms and the
user's token out of the FTS5 index segments and checkpoints the WAL, whose frames still held the rows.
"""

from __future__ import annotations

from engram_api.errors import StoreUnavailableError
from engram_api.models import utcnow
from engram_api.storage.graph.forgetting import ForgetPlan, ForgetScope, Removed
from engram_api.storage.graph.sqlite import edits as edits
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite.connection import FTS_SECURE_DELETE, SqliteConnection
from engram_api.storage.graph.sqlite.episodes import FTS_TABLES

__all__ = ["SqliteDeletion"]


class SqliteDeletion(SqliteConnection):
    """Deletion over the SQLite file: scope, plan and whole-user removal."""

    def _forget_scope(
        self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None
    ) -> ForgetScope | None:
        with self._read() as conn:
            if episode_id is not None:
                if not db.episode_exists(conn, user_id, episode_id):
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
                chunk_ids = db.chunk_ids(conn, user_id, [episode_id])
            else:
                if not conn.execute("SELECT 1 FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone():
                    return None
                doomed, candidates, chunk_ids = [str(fact_id)], set(), []
            params = {"user_id": user_id, "doomed": db.json_ids(doomed)}
            candidates.update(
                r[0]
                for r in conn.execute(
                    "SELECT entity_id FROM mentions WHERE user_id = :user_id"
                    " AND fact_id IN (SELECT value FROM json_each(:doomed))",
                    params,
                )
            )
            params["candidates"] = db.json_ids(sorted(candidates))
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
            reverted, kept = [], []
            if plan.episode_id is not None:
                # Facts the episode stated that another episode keeps: their sources change (marked below).
                kept = [
                    r[0]
                    for r in conn.execute(
                        "SELECT node_id FROM provenance WHERE user_id = ? AND episode_id = ? AND node_kind = 'fact'",
                        (user_id, plan.episode_id),
                    )
                    if r[0] not in plan.fact_ids
                ]
                # What the message did to entities it does not take with it (aliases, summaries): undone.
                reverted = edits.revert_edits(conn, user_id, plan.episode_id)
                # Cascades to every remaining FROM link to the episode, its edits and its chunks (whose
                # triggers drop their keyword entries).
                conn.execute("DELETE FROM episodes WHERE user_id = ? AND id = ?", (user_id, plan.episode_id))
            edits.drop_clusters(conn, user_id, [*plan.fact_ids, *plan.entity_candidates, *reverted])
            now = db.to_us(utcnow())
            conn.executemany(
                """UPDATE facts SET superseded_by = :successor, updated_at = :now,
                          valid_until = CASE WHEN :successor IS NULL THEN NULL ELSE valid_until END
                    WHERE user_id = :user_id AND id = :id""",
                [{"successor": r.successor, "now": now, "user_id": user_id, "id": r.fact_id} for r in plan.repairs],
            )
            db.delete_nodes(conn, user_id, "facts", plan.fact_ids)
            orphans = [
                r[0]
                for r in conn.execute(
                    """SELECT e.id FROM entities e
                        WHERE e.user_id = :user_id AND e.id IN (SELECT value FROM json_each(:ids))
                          AND NOT EXISTS (SELECT 1 FROM provenance p
                                           WHERE p.user_id = :user_id AND p.node_id = e.id)
                          AND NOT EXISTS (SELECT 1 FROM mentions m
                                           WHERE m.user_id = :user_id AND m.entity_id = e.id)""",
                    {"user_id": user_id, "ids": db.json_ids(plan.entity_candidates)},
                )
            ]
            db.delete_nodes(conn, user_id, "entities", orphans)
            # The repaired facts and those that lost a source are marked: a reader's snapshot takes them in with
            # the removed ids (``feed``), never loading the user whole for a forget.
            changed = [*(r.fact_id for r in plan.repairs), *kept]
            db.bump(conn, user_id, None, facts=changed, removed=True, gone=[*plan.fact_ids, *plan.chunk_ids, *orphans])
        return orphans

    def _forget_user(self, user_id: str) -> Removed:
        with self._write() as conn:
            nodes = conn.execute(
                """SELECT id, 'facts' AS tbl, embedding IS NOT NULL AS vectored FROM facts WHERE user_id = :user_id
                   UNION ALL
                   SELECT id, 'entities', embedding IS NOT NULL FROM entities WHERE user_id = :user_id""",
                {"user_id": user_id},
            ).fetchall()
            ids = {table: [r["id"] for r in nodes if r["tbl"] == table] for table in ("facts", "entities")}
            # Read before the episodes go: deleting an episode cascades to its chunks.
            chunk_ids = db.chunk_ids(conn, user_id, None)
            episodes = conn.execute("DELETE FROM episodes WHERE user_id = ?", (user_id,)).rowcount
            for table, node_ids in ids.items():
                db.delete_nodes(conn, user_id, table, node_ids)
            for table in ("provenance", "entity_edits", "cluster_members", "clusters", "feedback", "removals", "users"):
                conn.execute(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
            conn.execute("DELETE FROM weights WHERE scope = ?", (user_id,))
        return Removed(
            user_id=user_id,
            episodes=episodes,
            fact_ids=ids["facts"],
            entity_ids=ids["entities"],
            chunk_ids=chunk_ids,
            vectored=frozenset(r["id"] for r in nodes if r["vectored"]),
        )

    def purge_erased(self) -> None:
        """After deletes committed: no copy of the deleted rows is left in the database file or its WAL.

        Without FTS5's secure-delete (SQLite < 3.42) a delete only adds a tombstone segment and the old
        segments keep the row's terms and user token, so the index is merged into one segment ('optimize':
        it rewrites the whole keyword index, all users'). The TRUNCATE checkpoint copies the WAL into the
        file and empties it; it waits (busy_timeout) for readers of older snapshots to finish.
        """
        if not FTS_SECURE_DELETE:
            with self._write() as conn:
                for table in FTS_TABLES:
                    conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")
        busy, _, _ = self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise StoreUnavailableError(
                f"SQLite store {self._path}: the WAL could not be checkpointed (a reader held it past the busy "
                "timeout); it still holds erased rows until the next checkpoint: run the erasure again"
            )
