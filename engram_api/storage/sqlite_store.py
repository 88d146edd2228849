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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from engram_api.errors import StoreUnavailableError
from engram_api.models import (
    SCORE_COMPONENTS,
    WEIGHT_FIELDS,
    ApplyOutcome,
    ChunkRecord,
    ClusterRecord,
    EntityRecord,
    EpisodeRecord,
    FactRecord,
    FeedbackRow,
    KeywordHit,
    LearnedWeights,
    WritePlan,
    utcnow,
)
from engram_api.storage import sqlite_episodes as episodes_sql
from engram_api.storage import sqlite_rows as db
from engram_api.storage import sqlite_sql as sql
from engram_api.storage.base import GraphStep, GraphStepQuery, GraphStore, Link
from engram_api.storage.forgetting import ForgetPlan, ForgetScope, Removed
from engram_api.versions import Stamp

__all__ = ["SqliteGraphStore"]


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
                fence.check_before(db.read_stamp(conn, fence.user_id))
            yield conn
            after = None if fence is None else db.read_stamp(conn, fence.user_id)
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
            conn.executescript(sql.SCHEMA)
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
        return self._lookup_entities(user_id, [], norm_names)

    def _get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
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

    def _lookup_entities(self, user_id: str, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        params = {"user_id": user_id, "ids": db.json_ids(entity_ids), "names": db.json_ids(norm_names)}
        return [db.entity_row(r) for r in self._conn().execute(sql.ENTITY_LOOKUP, params).fetchall()]

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

    def _facts_for_slots(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
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

    def _apply(self, plan: WritePlan) -> ApplyOutcome:
        user_id = plan.user_id
        with self._write() as conn:
            if db.episode_exists(conn, user_id, plan.episode.id):
                return ApplyOutcome(applied=False, version=db.read_version(conn, user_id))
            db.insert_episode(conn, plan.episode)
            episode_id = plan.episode.id
            episodes_sql.insert_chunks(conn, plan.chunks, db.to_us, db.to_blob)
            for entity in plan.new_entities:
                db.insert_entity(conn, entity)
                db.link_episode(conn, user_id, entity.id, "entity", episode_id)
            for change in plan.entity_changes:
                db.change_entity(conn, user_id, change.id, change.add_aliases, change.summary, change.label)
            db.check_fact_entities(conn, plan)
            for fact in plan.new_facts:
                db.insert_fact(conn, fact)
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
            for fact_id in dict.fromkeys(plan.reinforced_fact_ids):
                updated = conn.execute(
                    "UPDATE facts SET strength = 1.0, archived = 0, updated_at = ? WHERE user_id = ? AND id = ?",
                    (now, user_id, fact_id),
                ).rowcount
                if updated:
                    db.link_episode(conn, user_id, fact_id, "fact", episode_id)
            for entity_id in dict.fromkeys(plan.mentioned_entity_ids):
                if db.entity_exists(conn, user_id, entity_id):
                    db.link_episode(conn, user_id, entity_id, "entity", episode_id)
            for fact_id in dict.fromkeys(plan.linked_fact_ids):
                if conn.execute("SELECT 1 FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone():
                    db.link_episode(conn, user_id, fact_id, "fact", episode_id)
            version = db.bump(conn, user_id, plan.usage, self._creation_epoch())
        return ApplyOutcome(applied=True, version=version)

    # -------------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        return db.read_stamp(self._conn(), user_id)

    def _get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
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
            seeding = (
                [cid for cid in query.seed_chunks if cid in chunks][: query.seed_chunk_count] if query.expanding else []
            )
            chunk_seeds = [f for cid in seeding for f in chunks[cid].fact_ids]
            sourced = [f for cid in query.chunk_facts if cid in chunks for f in chunks[cid].fact_ids]
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
            "as_of": db.to_us_opt(query.as_of),
            "since": db.to_us_opt(query.since),
            "until": db.to_us_opt(query.until),
            "now": db.to_us(query.now),
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

    def _stats(self, user_id: str) -> tuple[dict[str, int], dict[str, Any] | None]:
        with self._read() as conn:
            counts = dict(
                conn.execute(
                    """SELECT COUNT(*) AS facts,
                              COALESCE(SUM(valid_until IS NULL AND archived = 0), 0) AS current_facts,
                              COALESCE(SUM(valid_until IS NOT NULL), 0) AS superseded_facts,
                              COALESCE(SUM(archived = 1), 0) AS archived_facts
                         FROM facts WHERE user_id = ?""",
                    (user_id,),
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

    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float]]], int]:
        with self._read() as conn:
            rows = conn.execute(
                """SELECT id, 'fact' AS kind, embedding FROM facts
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'entity' AS kind, embedding FROM entities
                    WHERE user_id = :user_id AND embedding IS NOT NULL
                   UNION ALL
                   SELECT id, 'episode' AS kind, embedding FROM chunks
                    WHERE user_id = :user_id AND embedding IS NOT NULL""",
                {"user_id": user_id},
            ).fetchall()
            version = db.read_version(conn, user_id)
        return [(r["id"], r["kind"], db.from_blob(r["embedding"])) for r in rows], version

    def _get_chunks(self, user_id: str, chunk_ids: list[str], episode_ids: list[str]) -> list[ChunkRecord]:
        return episodes_sql.get_chunks(
            self._conn(), user_id, chunk_ids=chunk_ids, episode_ids=episode_ids, dt=db.from_us
        )

    def _add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        with self._write() as conn:
            added = episodes_sql.add_chunks(conn, user_id, chunks, db.to_us, db.to_blob)
            if added:
                db.bump(conn, user_id, None)
        return added

    def _remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        with self._write() as conn:
            removed = episodes_sql.delete_chunks(conn, user_id, chunk_ids)
            if removed:
                db.bump(conn, user_id, None)
        return removed

    def _neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        return episodes_sql.neighbour_chunks(self._conn(), user_id, chunk_ids, window, db.from_us)

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
            self._conn(),
            user_id,
            terms,
            k,
            as_of=db.to_us_opt(as_of),
            since=db.to_us_opt(since),
            until=db.to_us_opt(until),
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

    # ------------------------------------------------------------------------------------ delete
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
            if plan.episode_id is not None:
                # Cascades to every remaining FROM link to the episode and to its chunks (whose triggers
                # drop their keyword entries).
                conn.execute("DELETE FROM episodes WHERE user_id = ? AND id = ?", (user_id, plan.episode_id))
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
            db.bump(conn, user_id, None)
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
            for table in ("provenance", "cluster_members", "clusters", "feedback", "users"):
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

    # ------------------------------------------------------------------------------- maintenance
    def _decay_batch(
        self, user_id: str, *, now: datetime, batch: int, fade: Callable[[float, datetime], tuple[float, bool]]
    ) -> list[bool]:
        now_us = db.to_us(now)
        with self._write() as conn:
            rows = conn.execute(
                """SELECT id, strength, COALESCE(last_decay_at, created_at) AS since FROM facts
                    WHERE user_id = ? AND archived = 0 AND COALESCE(last_decay_at, created_at) < ?
                    ORDER BY id LIMIT ?""",
                (user_id, now_us, batch),
            ).fetchall()
            faded = [(r["id"], *fade(r["strength"], db.from_us(r["since"]))) for r in rows]
            conn.executemany(
                "UPDATE facts SET strength = ?, archived = ?, last_decay_at = ?, updated_at = ?"
                " WHERE user_id = ? AND id = ?",
                [(strength, int(drop), now_us, now_us, user_id, fid) for fid, strength, drop in faded],
            )
            if faded:
                db.bump(conn, user_id, None)
        return [drop for _, _, drop in faded]

    def _reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        with self._write() as conn:
            changed = conn.execute(
                """UPDATE facts SET strength = MIN(1.0, strength + :amount), archived = 0, updated_at = :now
                    WHERE user_id = :user_id AND id IN (SELECT value FROM json_each(:ids))
                      AND (archived = 1 OR MIN(1.0, strength + :amount) != strength)""",
                {"amount": amount, "now": db.to_us(now), "user_id": user_id, "ids": db.json_ids(fact_ids)},
            ).rowcount
            if changed:
                db.bump(conn, user_id, None)
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

    def _add_feedback(self, rows: list[FeedbackRow]) -> None:
        with self._write() as conn:
            conn.executemany(
                f"INSERT INTO feedback (user_id, recall_id, fact_id, useful, {', '.join(SCORE_COMPONENTS)},"
                f" created_at) VALUES ({', '.join('?' * (5 + len(SCORE_COMPONENTS)))})",
                [(r.user_id, r.recall_id, r.fact_id, int(r.useful), *r.values(), db.to_us(r.created_at)) for r in rows],
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
