"""The embedded graph store: one SQLite file that several worker processes write at once.

Concurrency model and connections: ``sqlite_connection``. Deletion: ``sqlite_deletion``; decay, clusters,
feedback and weights: ``sqlite_maintenance``. Ingest and reads are here.

Storage choices: datetimes are INTEGER microseconds since the epoch (exact round trip, and range
comparisons are plain integer comparisons); embeddings are float32 BLOBs; lists passed to a query travel
as one JSON parameter read with ``json_each`` so that no SQL text is ever built from values.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engram_api.models import (
    ApplyOutcome,
    ChunkRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    KeywordHit,
    WritePlan,
    utcnow,
)
from engram_api.storage.graph.contract import (
    ContextReads,
    ExtractionContext,
    GraphStep,
    GraphStepQuery,
    Link,
    SnapshotBuild,
    SnapshotChanges,
)
from engram_api.storage.graph.sqlite import edits as edits
from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite import sql as sql
from engram_api.storage.graph.sqlite.connection import SqliteConnection
from engram_api.storage.graph.sqlite.deletion import SqliteDeletion
from engram_api.storage.graph.sqlite.maintenance import SqliteMaintenance
from engram_api.storage.graph.sqlite.vectors import SqliteVectors, removed_since
from engram_api.storage.graph.validity import VALID_AT_SQL, instant
from engram_api.versions import Stamp

if TYPE_CHECKING:
    from engram_api.storage.snapshot.graph import UserSnapshot  # imports numpy: the CLI's light reads must not

__all__ = ["SqliteGraphStore"]


class SqliteGraphStore(SqliteDeletion, SqliteMaintenance, SqliteVectors, SqliteConnection):
    """The graph-store contract over one SQLite file (the default when no Neo4j is configured)."""

    # ------------------------------------------------------------------------------------ ingest
    def is_applied(self, user_id: str, message_id: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM episodes WHERE user_id = ? AND id = ?", (user_id, message_id))
            .fetchone()
        )
        return row is not None

    def get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
        rows = (
            self._conn()
            .execute(
                "SELECT * FROM entities WHERE user_id = ? AND id IN (SELECT value FROM json_each(?))"
                " ORDER BY norm_name, id",
                (user_id, db.json_ids(entity_ids)),
            )
            .fetchall()
        )
        return [db.entity_row(r) for r in rows]

    def lookup_entities(self, user_id: str, *, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        return self._entities(user_id, entity_ids, norm_names)

    def _entities(self, user_id: str, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        params = {"user_id": user_id, "ids": db.json_ids(entity_ids), "names": db.json_ids(norm_names)}
        return [db.entity_row(r) for r in self._conn().execute(sql.ENTITY_LOOKUP, params).fetchall()]

    def _extraction_context(self, user_id: str, reads: ContextReads) -> ExtractionContext:
        """The four reads one by one: an in-process store pays nothing per call (one store read for the
        caller, so not through the public methods)."""
        return ExtractionContext(
            entities=self._entities(user_id, reads.entity_ids, []) if reads.entity_ids else [],
            facts=self._facts(user_id, reads.fact_ids) if reads.fact_ids else [],
            slot_facts=self._slot_facts(user_id, reads.slots) if reads.slots else [],
            episodes=self._recent_episodes(user_id, before=reads.before, limit=reads.turns) if reads.turns else [],
        )

    def _recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        rows = (
            self._conn()
            .execute(
                "SELECT * FROM episodes WHERE user_id = ? AND event_time < ? ORDER BY event_time DESC, id DESC LIMIT ?",
                (user_id, db.to_us(before), limit),
            )
            .fetchall()
        )
        return [EpisodeRecord(**db.episode_fields(r)) for r in reversed(rows)]

    def _slot_facts(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"""{sql.FACT_SELECT} {sql.FACT_FROM}
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
        return [db.fact_row(r) for r in rows]

    def apply(self, plan: WritePlan) -> ApplyOutcome:
        user_id = plan.user_id
        with self._write() as conn:
            if db.episode_exists(conn, user_id, plan.episode.id):
                return ApplyOutcome(applied=False, version=db.read_version(conn, user_id))
            db.insert_episode(conn, plan.episode)
            episode_id = plan.episode.id
            episodes_sql.insert_chunks(conn, plan.chunks, db.to_us, db.to_blob, plan.chunk_context)
            for entity in plan.new_entities:
                db.insert_entity(conn, entity)
                db.link_episode(conn, user_id, entity.id, "entity", episode_id)
                edits.record_edit(conn, user_id, entity.id, episode_id, entity.aliases, entity.summary or None, None)
            for change in plan.entity_changes:
                changed = db.change_entity(conn, user_id, change.id, change.add_aliases, change.summary, change.label)
                if changed is not None:
                    edits.record_edit(conn, user_id, change.id, episode_id, changed[0], change.summary, changed[1])
            db.check_fact_entities(conn, plan)
            for fact in plan.new_facts:
                db.insert_fact(conn, fact, self._fact_due(fact))
                db.link_episode(conn, user_id, fact.id, "fact", episode_id)
            now = db.to_us(utcnow())
            # Changes, reinforcements and mentions of ids the user no longer has are skipped, not
            # errors: a forget may have removed them between consolidation and this write.
            for fact_change in plan.fact_changes:
                conn.execute(
                    "UPDATE facts SET valid_until = ?, superseded_by = ?, updated_at = ? WHERE user_id = ? AND id = ?",
                    (
                        db.to_us_opt(fact_change.valid_until),
                        fact_change.superseded_by,
                        now,
                        user_id,
                        fact_change.id,
                    ),
                )
            restated = db.to_us_opt(self.fading.due(1.0, db.from_us(now)))
            for fact_id in dict.fromkeys(plan.reinforced_fact_ids):
                # A restated fact is at full strength as of now (its reference instant, its new due).
                updated = conn.execute(
                    "UPDATE facts SET strength = 1.0, archived = 0, last_decay_at = ?, archive_due_at = ?,"
                    " updated_at = ? WHERE user_id = ? AND id = ?",
                    (now, restated, now, user_id, fact_id),
                ).rowcount
                if updated:
                    db.link_episode(conn, user_id, fact_id, "fact", episode_id)
            for entity_id in dict.fromkeys(plan.mentioned_entity_ids):
                if db.entity_exists(conn, user_id, entity_id):
                    db.link_episode(conn, user_id, entity_id, "entity", episode_id)
            for fact_id in dict.fromkeys(plan.linked_fact_ids):
                if conn.execute("SELECT 1 FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone():
                    db.link_episode(conn, user_id, fact_id, "fact", episode_id)
            touched = [
                *(f.id for f in plan.new_facts),
                *(c.id for c in plan.fact_changes),
                *plan.reinforced_fact_ids,
                *plan.linked_fact_ids,
            ]
            chunks = [c.id for c in plan.chunks]
            entities = [e.id for e in plan.new_entities]
            version = db.bump(
                conn, user_id, plan.usage, self._creation_epoch(), facts=touched, chunks=chunks, entities=entities
            )
        return ApplyOutcome(applied=True, version=version)

    # -------------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        return db.read_stamp(self._conn(), user_id)

    def get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        return self._facts(user_id, fact_ids)

    def _facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"{sql.FACTS_BY_ID} ORDER BY f.created_at, f.id",
                (user_id, db.json_ids(fact_ids)),
            )
            .fetchall()
        )
        return [db.fact_row(r) for r in rows]

    def graph_step(self, user_id: str, query: GraphStepQuery) -> GraphStep:
        """One read transaction (one snapshot): the chunks named, the expansion statement, then the
        records asked or reached that the caller does not know."""
        with self._read() as conn:
            named = [*query.chunk_ids, *query.chunk_facts, *(query.seed_chunks if query.expanding else ())]
            chunks = {
                c.id: c
                for c in episodes_sql.get_chunks(conn, user_id, chunk_ids=list(dict.fromkeys(named)), dt=db.from_us)
            }
            sourced, chunk_seeds = query.chunk_facts_of(lambda cid: chunks[cid].fact_ids if cid in chunks else None)
            hops, facts = self._step(conn, user_id, query, [*query.seed_facts, *chunk_seeds], [*sourced, *chunk_seeds])
        asked = set(query.chunk_ids)
        return GraphStep(facts=facts, hops=hops, chunks=[c for c in chunks.values() if c.id in asked])

    def _step(
        self, conn: sqlite3.Connection, user_id: str, query: GraphStepQuery, seed_facts: list[str], more: list[str]
    ) -> tuple[list[tuple[str, int]], list[FactRecord]]:
        params = {
            "user_id": user_id,
            "seeds": db.json_ids(query.seeds),
            "seed_facts": db.json_ids(seed_facts),
            "at": db.to_us(query.at),
            "since": db.to_us_opt(query.since),
            "until": db.to_us_opt(query.until),
            "max_hops": query.max_hops,
            "limit": query.limit,
            "per_seed": query.per_seed,
            "avoid": db.json_ids(query.avoid),
        }
        hops = [(r["fact_id"], r["hops"]) for r in conn.execute(sql.EXPAND, params)] if query.expanding else []
        known = set(query.known)
        wanted = [i for i in dict.fromkeys([*query.fact_ids, *more, *(fid for fid, _ in hops)]) if i not in known]
        rows = conn.execute(sql.FACTS_BY_ID, (user_id, db.json_ids(wanted))).fetchall()
        return hops, [db.fact_row(r) for r in rows]

    def _snapshot(self, user_id: str, max_records: int, build: SnapshotBuild) -> UserSnapshot | None:
        with self._read() as conn:
            stamp = db.read_stamp(conn, user_id)
            (size,) = conn.execute(
                """SELECT (SELECT COUNT(*) FROM facts WHERE user_id = :u) + (SELECT COUNT(*) FROM chunks WHERE user_id = :u)""",
                {"u": user_id},
            ).fetchone()
            if size > max_records:
                return None
            rows = conn.execute(f"{sql.FACT_SELECT} {sql.FACT_FROM} WHERE f.user_id = ?", (user_id,))
            chunks = episodes_sql.each_user_chunk(conn, user_id, dt=db.from_us)
            return build(stamp, (db.fact_row(r) for r in rows), chunks)

    def _snapshot_changes(self, user_id: str, since: int) -> SnapshotChanges:
        with self._read() as conn:
            stamp = db.read_stamp(conn, user_id)
            (size, removed, horizon) = conn.execute(
                """SELECT (SELECT COUNT(*) FROM facts WHERE user_id = :u) + (SELECT COUNT(*) FROM chunks WHERE user_id = :u),
                          COALESCE((SELECT removed FROM users WHERE user_id = :u), 0),
                          (SELECT vectors_from FROM users WHERE user_id = :u)""",
                {"u": user_id},
            ).fetchone()
            gone = removed_since(conn, user_id, since)
            rows = conn.execute(
                f"{sql.FACT_SELECT} {sql.FACT_FROM} WHERE f.user_id = ? AND f.changed > ?", (user_id, since)
            ).fetchall()
            chunks = episodes_sql.user_chunks(conn, user_id, dt=db.from_us, since=since)
        return SnapshotChanges(
            stamp=stamp, removed=removed, size=size, facts=[db.fact_row(r) for r in rows], chunks=chunks,
            gone=gone, horizon=None if horizon is None else int(horizon),
        )  # fmt: skip

    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        rows = (
            self._conn()
            .execute(
                f"""{sql.FACT_SELECT} {sql.FACT_FROM}
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
        return [db.fact_row(r) for r in rows]

    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        with self._read() as conn:
            total = conn.execute("SELECT COUNT(*) FROM facts WHERE user_id = ?", (user_id,)).fetchone()[0]
            fact_rows = conn.execute(
                f"""{sql.FACT_SELECT} {sql.FACT_FROM}
                WHERE f.user_id = ? ORDER BY f.created_at, f.id LIMIT ? OFFSET ?""",
                (user_id, limit, skip),
            ).fetchall()
            facts = [db.fact_row(r) for r in fact_rows]
            entity_rows = conn.execute(
                """SELECT e.* FROM entities e
                    WHERE e.user_id = ?
                      AND e.id IN (SELECT m.entity_id FROM mentions m
                                    WHERE m.user_id = e.user_id
                                      AND m.fact_id IN (SELECT value FROM json_each(?)))
                    ORDER BY e.norm_name, e.id""",
                (user_id, db.json_ids([f.id for f in facts])),
            ).fetchall()
        return total, facts, [db.entity_row(r) for r in entity_rows]

    def _stats(self, user_id: str, now: datetime) -> tuple[dict[str, int], dict[str, Any] | None]:
        with self._read() as conn:
            counts = dict(
                conn.execute(
                    f"""SELECT COUNT(*) AS facts,
                               COALESCE(SUM({VALID_AT_SQL}), 0) AS current_facts,
                               COALESCE(SUM(f.valid_until IS NOT NULL), 0) AS superseded_facts,
                               COALESCE(SUM(f.archived = 1), 0) AS archived_facts
                          FROM facts f WHERE f.user_id = :user_id""",
                    {"user_id": user_id, "at": db.to_us(now)},
                ).fetchone()
            )
            for table in ("entities", "episodes", "clusters"):
                row = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE user_id = ?", (user_id,)).fetchone()
                counts[table] = row[0]
            counts["episode_chunks"], counts["keyword_entries"] = episodes_sql.chunk_counts(conn, user_id)
            user = conn.execute(
                "SELECT version, prompt_tokens, completion_tokens, cost_usd, llm_calls FROM users WHERE user_id = ?",
                (user_id,),
            ).fetchone()
        return counts, None if user is None else dict(user)

    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float], bytes | None]], int]:
        with self._read() as conn:
            rows = conn.execute(
                """SELECT id, 'fact' AS kind, embedding, token_states FROM facts
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'entity' AS kind, embedding, NULL FROM entities
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'episode' AS kind, embedding, token_states FROM chunks
                    WHERE user_id = :user_id AND embedding IS NOT NULL""",
                {"user_id": user_id},
            ).fetchall()
            version = db.read_version(conn, user_id)
        return [(r["id"], r["kind"], db.from_blob(r["embedding"]), r["token_states"]) for r in rows], version

    def get_chunks(self, user_id: str, chunk_ids: list[str], *, episode_ids: list[str]) -> list[ChunkRecord]:
        return episodes_sql.get_chunks(
            self._conn(), user_id, chunk_ids=chunk_ids, episode_ids=episode_ids, dt=db.from_us
        )

    def add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        with self._write() as conn:
            added = episodes_sql.add_chunks(conn, user_id, chunks, db.to_us, db.to_blob)
            if added:
                db.bump(conn, user_id, None, chunks=[c.id for c in chunks])
        return added

    def remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        with self._write() as conn:
            removed = episodes_sql.delete_chunks(conn, user_id, chunk_ids)
            if removed:
                db.bump(conn, user_id, None, removed=True, gone=removed)
        return removed

    def neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        return episodes_sql.neighbour_chunks(self._conn(), user_id, chunk_ids, window, db.from_us)

    def keyword_search(
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
            self._conn(),
            user_id,
            terms,
            k,
            as_of=db.to_us_opt(as_of),
            since=db.to_us_opt(since),
            until=db.to_us_opt(until),
            at=db.to_us(instant(as_of)),
        )

    def list_users(self) -> list[str]:
        rows = self._conn().execute("SELECT user_id FROM users ORDER BY user_id").fetchall()
        return [r["user_id"] for r in rows]

    def _episodes(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM episodes WHERE user_id = ?", (user_id,)).fetchall()
            links = conn.execute(
                "SELECT episode_id, node_kind, node_id FROM provenance WHERE user_id = ?", (user_id,)
            ).fetchall()
        return [db.episode_fields(r) for r in rows], [(a, b, c) for a, b, c in links]
