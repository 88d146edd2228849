"""Plumbing of the embedded SQLite backend (``sqlite_store``): per-thread connections, read snapshots,
write transactions with the fence check, and the schema.

Concurrency model: WAL journal (readers never block the writer), every write runs in ``BEGIN IMMEDIATE``
(the write lock is taken before the first read, so a check-then-write such as apply's idempotency check
cannot race another process) and ``busy_timeout`` makes a blocked writer wait instead of failing.
sqlite3 connections must not be shared across threads or inherited across ``fork``, so each thread of
each process opens its own connection on first use.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from engram_api.errors import StoreUnavailableError
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.fading import Fading
from engram_api.storage.graph.sqlite import edits as edits_sql
from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.sqlite import rows as db
from engram_api.storage.graph.sqlite import sql as sql

__all__ = ["FTS_SECURE_DELETE", "SqliteConnection"]

# FTS5's secure-delete option exists from SQLite 3.42; older libraries purge by merging the index instead.
FTS_SECURE_DELETE = sqlite3.sqlite_version_info >= (3, 42, 0)


class SqliteConnection(GraphStore):
    """The connection plumbing ``SqliteGraphStore`` and its mixins share."""

    def __init__(self, *, path: pathlib.Path, fading: Fading | None = None) -> None:
        super().__init__(fading)
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
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Created 0600 before SQLite opens it: its WAL and shared-memory files take the same mode.
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create {self._path}: {exc}") from exc
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE for writes) instead of the
        # module's implicit ones; check_same_thread=False only so close() can close every thread's one.
        conn = sqlite3.connect(self._path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # Deleted rows and freed pages are overwritten with zeros, not left in the file (erasure is final
        # once the WAL is checkpointed: see SqliteDeletion.purge_erased).
        conn.execute("PRAGMA secure_delete = ON")
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
            conn.executescript(edits_sql.SCHEMA)
        except BaseException:
            # executescript stops at the failing statement and would leave the script's BEGIN open.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        # Files created before these columns existed: add them. Users read as epoch 0; records as
        # marked by no write (version 0), which every snapshot taken since holds already.
        # ``vectors_from`` stays NULL (no catch-up history) until this release's first write of the user;
        # ``embedded_with`` NULL: a chunk vector of a policy not known (the re-embedding pass redoes it);
        # ``token_states`` NULL: a chunk without token states (its cosine stands in, ``reader.rerank``).
        columns = (
            ("users", "epoch", "NOT NULL DEFAULT 0"), ("users", "removed", "NOT NULL DEFAULT 0"),
            ("users", "vectors_from", ""), ("facts", "changed", "NOT NULL DEFAULT 0"),
            ("chunks", "changed", "NOT NULL DEFAULT 0"), ("entities", "changed", "NOT NULL DEFAULT 0"),
            ("facts", "archive_due_at", ""), ("chunks", "embedded_with", "TEXT"), ("chunks", "token_states", "BLOB"),
            ("facts", "token_states", "BLOB"),
        )  # fmt: skip
        for table, column, constraint in columns:
            if column not in {r["name"] for r in conn.execute(f"PRAGMA table_info({table})")}:
                declared = constraint if constraint.startswith(("TEXT", "BLOB")) else f"INTEGER {constraint}"
                try:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declared}")
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):  # another process added it first
                        raise
        conn.executescript(sql.CHANGED_INDEXES)
        conn.executescript(sql.DUE_INDEXES)
        self._backfill_due(conn)
        if FTS_SECURE_DELETE:
            # Persistent in each table's config: a delete then removes the row's terms from the index
            # segments at once instead of adding a tombstone next to them.
            for table in episodes_sql.FTS_TABLES:
                conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 1)")

    def _backfill_due(self, conn: sqlite3.Connection) -> None:
        """Facts stored before ``archive_due_at`` existed (or by an older process) get theirs, from their
        stored strength and reference instant: the data migration of read-time decay. Finds them by the
        due index (NULL first), so a store with none reads a few index entries."""
        rows = conn.execute(
            "SELECT id, strength, COALESCE(last_decay_at, created_at) AS since FROM facts"
            " WHERE archive_due_at IS NULL AND archived = 0"
        ).fetchall()
        dues = [(db.to_us_opt(self.fading.due(r["strength"], db.from_us(r["since"]))), r["id"]) for r in rows]
        if any(due is not None for due, _ in dues):
            with self._write() as write:
                write.executemany(
                    "UPDATE facts SET archive_due_at = ? WHERE id = ? AND archive_due_at IS NULL AND archived = 0",
                    [(due, fid) for due, fid in dues if due is not None],
                )

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
