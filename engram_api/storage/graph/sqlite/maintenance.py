"""Maintenance on the embedded SQLite backend: decay, reinforcement, chunk re-embedding, clusters, feedback
and learned weights, as a mixin of ``SqliteGraphStore``.

The decay formula and the input checks live in ``base``; here are queries and transactions only. A
maintenance write that changes what recall can return bumps the user's version in the same transaction.
Encodings as in ``sqlite_store``: datetimes are INTEGER microseconds, embeddings float32 BLOBs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from engram_api.models import SCORE_COMPONENTS, WEIGHT_FIELDS, ChunkRecord, ClusterRecord, FeedbackRow, LearnedWeights
from engram_api.storage.graph.contract import Link
from engram_api.storage.graph.fading import Fading
from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite.connection import SqliteConnection

__all__ = ["SqliteMaintenance"]


class SqliteMaintenance(SqliteConnection):
    """Decay, reinforce, clusters, feedback and weights hooks of the graph-store contract on SQLite."""

    def _archive_batch(self, user_id: str, *, now: datetime, batch: int) -> list[bool]:
        now_us = db.to_us(now)
        with self._write() as conn:
            rows = conn.execute(
                """SELECT id, strength, COALESCE(last_decay_at, created_at) AS since FROM facts
                    WHERE user_id = ? AND archive_due_at <= ? AND archived = 0
                    ORDER BY archive_due_at, id LIMIT ?""",
                (user_id, now_us, batch),
            ).fetchall()
            seen = [(r["id"], *self.fading.archival(r["strength"], db.from_us(r["since"]), now)) for r in rows]
            archived = [(strength, now_us, now_us, user_id, fid) for fid, strength, due in seen if strength is not None]
            conn.executemany(
                "UPDATE facts SET strength = ?, archived = 1, archive_due_at = NULL, last_decay_at = ?, updated_at = ?"
                " WHERE user_id = ? AND id = ?",
                archived,
            )
            # Not faded yet (a changed policy, rounding at the instant): only the due moves; recall reads
            # nothing new, so no version is bumped for it.
            conn.executemany(
                "UPDATE facts SET archive_due_at = ? WHERE user_id = ? AND id = ?",
                [(db.to_us_opt(due), user_id, fid) for fid, strength, due in seen if strength is None],
            )
            if archived:
                db.bump(conn, user_id, None, facts=[fid for *_, fid in archived])
        return [strength is not None for _, strength, _ in seen]

    def users_due(self, now: datetime) -> list[str]:
        rows = self._conn().execute(
            "SELECT DISTINCT user_id FROM facts WHERE archive_due_at <= ? ORDER BY user_id",
            (db.to_us(now),),
        )
        return [r[0] for r in rows]

    def _recorded_fading(self) -> Fading | None:
        row = self._conn().execute("SELECT value FROM meta WHERE name = 'fading'").fetchone()
        return None if row is None else Fading(**json.loads(row["value"]))

    def _record_fading(self, fading: Fading) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('fading', ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (json.dumps(dataclasses.asdict(fading)),),
            )

    def _redue_batch(self, after: str, batch: int) -> list[str]:
        with self._write() as conn:
            rows = conn.execute(
                "SELECT id, strength, COALESCE(last_decay_at, created_at) AS since FROM facts"
                " WHERE id > ? AND archived = 0 ORDER BY id LIMIT ?",
                (after, batch),
            ).fetchall()
            conn.executemany(
                "UPDATE facts SET archive_due_at = ? WHERE id = ?",
                [(db.to_us_opt(self.fading.due(r["strength"], db.from_us(r["since"]))), r["id"]) for r in rows],
            )
        return [r["id"] for r in rows]

    def recorded_chunk_context(self) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE name = 'chunk_context'").fetchone()
        return None if row is None else str(row["value"])

    def record_chunk_context(self, context: str) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('chunk_context', ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (context,),
            )

    def users_to_reembed(self, context: str) -> list[str]:
        rows = self._conn().execute(
            "SELECT DISTINCT user_id FROM chunks WHERE embedded_with IS NOT ? ORDER BY user_id", (context,)
        )
        return [r[0] for r in rows]

    def chunks_to_reembed(self, user_id: str, context: str, *, after: str, batch: int) -> list[ChunkRecord]:
        return episodes_sql.chunks_to_reembed(self._conn(), user_id, context, after, batch, db.from_us)

    def reembed_chunks(
        self,
        user_id: str,
        context: str,
        vectors: list[tuple[str, list[float]]],
        states: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        with self._write() as conn:
            written = episodes_sql.reembed_chunks(
                conn, user_id, context, [(c, db.to_blob(v)) for c, v in vectors], states or {}
            )
            if written:
                db.bump(conn, user_id, None, chunks=written)
        return written

    def reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        now_us = db.to_us(now)
        with self._write() as conn:
            rows = conn.execute(
                """SELECT id, strength, archived, COALESCE(last_decay_at, created_at) AS since FROM facts
                    WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))""",
                (user_id, db.json_ids(fact_ids)),
            ).fetchall()
            fade = self.fading
            after = {
                r["id"]: fade.reinforcement(r["strength"], db.from_us(r["since"]), bool(r["archived"]), now, amount)
                for r in rows
            }
            changed = [
                (strength, db.to_us_opt(fade.due(strength, now)), now_us, now_us, user_id, fid)
                for fid, strength in after.items()
                if strength is not None
            ]
            conn.executemany(
                "UPDATE facts SET strength = ?, archived = 0, archive_due_at = ?, last_decay_at = ?, updated_at = ?"
                " WHERE user_id = ? AND id = ?",
                changed,
            )
            if changed:
                db.bump(conn, user_id, None, facts=fact_ids)
        return len(changed)

    def replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None:
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
                        db.to_blob(cluster.centroid),
                        cluster.signature,
                        db.to_us(cluster.created_at),
                        db.to_us(cluster.updated_at),
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
                        (cluster.id, kind, user_id, db.json_ids(ids)),
                    )
            db.bump(conn, user_id, None)

    def _clusters(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM clusters WHERE user_id = ?", (user_id,)).fetchall()
            members = conn.execute(
                "SELECT cluster_id, member_kind, member_id FROM cluster_members WHERE user_id = ?", (user_id,)
            ).fetchall()
        fields = [
            {
                **dict(r),
                "created_at": db.from_us(r["created_at"]),
                "updated_at": db.from_us(r["updated_at"]),
                "centroid": db.from_blob(r["centroid"]),
            }
            for r in rows
        ]
        return fields, [(a, b, c) for a, b, c in members]

    def add_feedback(self, rows: list[FeedbackRow]) -> None:
        with self._write() as conn:
            conn.executemany(
                f"INSERT INTO feedback (user_id, recall_id, fact_id, useful, {', '.join(SCORE_COMPONENTS)},"
                f" created_at) VALUES ({', '.join('?' * (5 + len(SCORE_COMPONENTS)))})",
                [(r.user_id, r.recall_id, r.fact_id, int(r.useful), *r.values(), db.to_us(r.created_at)) for r in rows],
            )

    def feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
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
                **{c: r[c] for c in SCORE_COMPONENTS},
                created_at=db.from_us(r["created_at"]),
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
                    db.to_us(weights.fitted_at),
                ),
            )

    def load_weights(self, scope: str) -> LearnedWeights | None:
        row = self._conn().execute("SELECT * FROM weights WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return None
        return LearnedWeights(
            scope=row["scope"],
            **{w: row[w] for w in WEIGHT_FIELDS},
            samples=row["samples"],
            quality=row["quality"],
            fitted_at=db.from_us(row["fitted_at"]),
        )
