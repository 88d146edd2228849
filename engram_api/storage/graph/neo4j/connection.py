"""Plumbing of the Neo4j backend (``neo4j_store``): the driver's lifecycle, sessions, managed read and
write transactions, single-query auto-commit reads with their retry, the mapping of driver errors to our
typed errors, the fence check of a write, and the schema.

Invariants: the schema is checked once per store before its first read or write: one read of the
:EngramSchema node, which ``migrate`` (`engram migrate`, run once per database) writes after the schema
statements and data migrations; a database at another version raises ``SchemaNotMigratedError``. Managed transactions retry
transient errors (deadlocks, leader switches, a dropped connection) for ``MAX_RETRY_TIME_S``; a server that
stays down surfaces as ``StoreUnavailableError`` after it, and so does a query the server ends at its
transaction timeout. A single read query is an auto-commit transaction, retried here for as long as a
managed one would be (a read is idempotent). Inside ``GraphStore.fenced`` every write transaction first
checks the user's stamp against the fence and the fence follows the stamp the transaction leaves
(``base.Fence``): a statement of its own before and after the work, or, for the apply, in the work's own
first statement (``_write_locking``).

``batched()`` opens one explicit transaction that this thread's reads and writes then run in, so an
apply batch pays one commit, where most of a write's server CPU goes: measured on the test server, a
message's apply transaction cost ~35 ms of server CPU with the full-text index and ~19 ms without it
(Lucene's per-commit work). Inside it nothing is retried (an explicit transaction cannot be replayed
by the driver): the caller replays its work one transaction at a time instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from neo4j import (
    READ_ACCESS,
    Driver,
    GraphDatabase,
    ManagedTransaction,
    NotificationDisabledClassification,
    Query,
    Record,
    Transaction,
)
from neo4j.exceptions import (
    ClientError,
    ConfigurationError,
    ConnectionAcquisitionTimeoutError,
    DatabaseUnavailable,
    DriverError,
    Neo4jError,
    ServiceUnavailable,
    SessionExpired,
)

from engram_api.errors import ConfigError, SchemaNotMigratedError, StoreUnavailableError
from engram_api.storage.faiss.sync import REMOVAL_RETAIN
from engram_api.storage.graph.contract import Fence, GraphStore, Link
from engram_api.storage.graph.episodes import user_key
from engram_api.storage.graph.fading import Fading
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j import rows as shape
from engram_api.versions import ABSENT, Stamp

__all__ = ["Neo4jConnection", "bump"]

_T = TypeVar("_T")

CONNECTION_TIMEOUT_S = 5.0
# Managed transactions retry transient errors (deadlocks, leader switches, a dropped connection)
# for this long; a server that stays down surfaces as StoreUnavailableError after it.
MAX_RETRY_TIME_S = 10.0
SCHEMA_WAIT_S = 60
_BACKFILL_ROWS = 10_000  # archive_due_at values written per statement by `engram migrate`'s backfill


def _fenced(
    tx: ManagedTransaction | Transaction, fence: Fence, work: Callable[..., _T], *args: Any
) -> tuple[_T, Stamp]:
    """Run ``work`` only if the user's stamp is the fence's; return its result and the stamp after."""
    found = tx.run(cy.Q_FENCE, user_id=fence.user_id).single(strict=True)
    fence.check_before(Stamp(int(found["epoch"]), int(found["version"])))
    result = work(tx, *args)
    after = tx.run(cy.Q_STAMP, user_id=fence.user_id).single()
    stamp = ABSENT if after is None else Stamp(int(after["epoch"]), int(after["version"]))
    fence.check_after(stamp)
    return result, stamp


def bump(
    tx: ManagedTransaction | Transaction,
    user_id: str,
    *,
    now: Any,
    facts: Iterable[str] = (),
    chunks: Iterable[str] = (),
    removed: bool = False,
    gone: Iterable[str] = (),
) -> None:
    """Move the user's version, marking with it the ``facts`` and ``chunks`` the write created or changed,
    or the user when it ``removed`` any; the ids it deleted (``gone``) become a removal record of that
    version (``cy.Q_BUMP``, ``vectorsync``)."""
    tx.run(
        cy.Q_BUMP, user_id=user_id, now=now, facts=list(facts), chunks=list(chunks), removed=removed,
        gone=sorted(set(gone)), retain=REMOVAL_RETAIN,
    ).consume()  # fmt: skip


def _unfenced(_found: Stamp) -> None:
    """The check of a write outside any fence."""


class Neo4jConnection(GraphStore):
    """The connection plumbing ``Neo4jGraphStore`` and its mixins share; safe to share between threads."""

    def __init__(
        self,
        *,
        uri: str,
        user: str,
        password: str | None,
        database: str,
        query_timeout_s: float | None = None,
        pool: dict[str, float] | None = None,
        fading: Fading | None = None,
    ) -> None:
        """``pool``: the driver's ``max_connection_pool_size``, ``connection_acquisition_timeout`` and
        ``max_connection_lifetime`` (``Settings.neo4j_pool``); the driver's defaults when None."""
        super().__init__(fading)
        self._uri = uri
        self._pool = dict(pool or {})
        self._query_timeout_s = query_timeout_s
        self._auth = None if password is None else (user, password)
        self._database = database
        self._lock = threading.Lock()
        self._driver: Driver | None = None
        self._schema_ready = False
        self._planned: set[tuple[int, ...]] = set()  # graph-step query shapes this store has run once
        self._batch = threading.local()  # .tx: this thread's open ``batched`` transaction

    # ----------------------------------------------------------------------------- plumbing
    def _get_driver(self) -> Driver:
        driver = self._driver
        if driver is not None:
            return driver
        with self._lock:
            if self._driver is None:
                try:
                    self._driver = GraphDatabase.driver(
                        self._uri,
                        auth=self._auth,
                        connection_timeout=CONNECTION_TIMEOUT_S,
                        max_transaction_retry_time=MAX_RETRY_TIME_S,
                        user_agent="engram",
                        # Property keys a fresh database has not seen yet (e.g. last_decay_at)
                        # would make the server warn on every read.
                        notifications_disabled_classifications=[NotificationDisabledClassification.UNRECOGNIZED],
                        **self._pool,
                    )
                except (ConfigurationError, ValueError) as exc:
                    raise ConfigError("NEO4J_URI", f"cannot use {self._uri!r}: {exc}") from exc
            return self._driver

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        try:
            yield
        except (ServiceUnavailable, SessionExpired, DatabaseUnavailable) as exc:
            raise StoreUnavailableError(f"Neo4j at {self._uri} is unavailable: {exc}") from exc
        except ConnectionAcquisitionTimeoutError as exc:
            raise StoreUnavailableError(
                f"no free Neo4j connection in this process ({exc}): raise ENGRAM_NEO4J_MAX_POOL_SIZE or "
                "ENGRAM_NEO4J_POOL_ACQUISITION_TIMEOUT_S, or run fewer threads"
            ) from exc
        except ClientError as exc:
            if "TransactionTimedOut" not in (exc.code or ""):
                raise
            raise StoreUnavailableError(f"Neo4j ended a query at its transaction timeout: {exc.message}") from exc

    def _ready(self) -> Driver:
        driver = self._get_driver()
        if not self._schema_ready:
            self.ensure_schema()
        return driver

    def _batch_tx(self) -> Transaction | None:
        return getattr(self._batch, "tx", None)

    @contextmanager
    def batched(self) -> Iterator[bool]:
        if self._batch_tx() is not None:  # nested: the outer block's transaction
            yield True
            return
        driver = self._ready()
        fence = self._fence()
        found = fence.expected if fence is not None else ABSENT
        with self._mapped_errors(), driver.session(database=self._database) as session:
            tx = session.begin_transaction(timeout=self._query_timeout_s)
            self._batch.tx = tx
            try:
                yield True
                tx.commit()
            except BaseException:
                if fence is not None:
                    fence.expected = found  # nothing of the block committed
                    fence.changes = None  # nor what a statement of it read
                raise
            finally:
                self._batch.tx = None
                tx.close()  # rolls back unless committed

    def _write(self, work: Callable[..., _T], *args: Any) -> _T:
        fence = self._fence()
        if fence is None:
            return self._write_tx(work, *args)
        result, fence.expected = self._write_tx(_fenced, fence, work, *args)
        return result

    def _write_locking(self, work: Callable[..., tuple[_T, Stamp]], *args: Any) -> _T:
        """``_write`` for a ``work`` whose own first statement takes the user's write lock and reads the
        stamp it found (``cy.FENCE_LOCK``), saving the fence's two statements (their driver round trips
        were ~9 % of an apply worker's Python CPU): ``work(tx, check, *args)`` passes that stamp to
        ``check`` before anything else can fail, and returns its result and the stamp it leaves."""
        fence = self._fence()

        def checked(tx: ManagedTransaction | Transaction, *a: Any) -> tuple[_T, Stamp]:
            result, after = work(tx, fence.check_before if fence is not None else _unfenced, *a)
            if fence is not None:
                fence.check_after(after)
            return result, after

        result, after = self._write_tx(checked, *args)
        if fence is not None:
            fence.expected = after
        return result

    def _write_tx(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(tx, *args)`` in this thread's ``batched`` transaction, else in a managed write one."""
        return self._managed(work, args, write=True)

    def _read(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(tx, *args)`` in this thread's ``batched`` transaction, else in a managed read one."""
        return self._managed(work, args, write=False)

    def _managed(self, work: Callable[..., _T], args: tuple[Any, ...], *, write: bool) -> _T:
        driver = self._ready()
        tx = self._batch_tx()
        if tx is not None:
            with self._mapped_errors():
                return work(tx, *args)
        with self._mapped_errors(), driver.session(database=self._database) as session:
            return (session.execute_write if write else session.execute_read)(work, *args)

    def _read_one(self, query: str, params: dict[str, Any], *, timeout: float | None = None) -> list[Record]:
        """One read query as an auto-commit transaction: one round trip, where a managed one adds BEGIN
        and COMMIT (~1 ms per read on a local server, measured; a recall makes 2-3 reads). For a single
        query the two see the same data. A read is idempotent, so what the managed retry would retry (a
        dropped pooled connection, a transient error) is retried here, for as long."""
        driver = self._ready()
        tx = self._batch_tx()
        if tx is not None:
            with self._mapped_errors():
                return list(tx.run(query, params))  # type: ignore[arg-type]
        deadline = time.monotonic() + MAX_RETRY_TIME_S
        delay = 0.05
        with self._mapped_errors():  # what is still failing when the retries end is mapped once, here
            while True:
                try:
                    with driver.session(database=self._database, default_access_mode=READ_ACCESS) as session:
                        return list(session.run(Query(query, timeout=timeout), params))  # type: ignore[arg-type]
                except (Neo4jError, DriverError) as exc:
                    if not exc.is_retryable() or time.monotonic() + delay > deadline:
                        raise
                time.sleep(delay)
                delay = min(2 * delay, 1.0)

    def _rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        """Run one read query (auto-commit, ``_read_one``); returns the `row` column."""
        return [shape.from_db(r["row"]) for r in self._read_one(query, params)]

    def _rows_and_links(
        self, rows_query: str, links_query: str, user_id: str, fields: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[Link]]:
        """One read transaction: the rows of ``rows_query`` (through ``fields``) and the links of ``links_query``."""

        def work(tx: ManagedTransaction) -> tuple[list[dict[str, Any]], list[Link]]:
            rows = [fields(shape.from_db(r["row"])) for r in tx.run(rows_query, user_id=user_id)]
            links = [(r["owner"], r["kind"], r["node_id"]) for r in tx.run(links_query, user_id=user_id)]
            return rows, links

        return self._read(work)

    # ---------------------------------------------------------------------------- lifecycle
    def ensure_schema(self) -> None:
        """Check (one read) that ``migrate`` brought the database to ``cy.SCHEMA_VERSION``; runs no schema
        statement, so a process needs read and write rights only."""
        driver = self._get_driver()
        with self._lock:
            if self._schema_ready:
                return
            with self._mapped_errors(), driver.session(database=self._database) as session:
                found = session.run(cy.Q_SCHEMA_VERSION).single()
            version = None if found is None else int(found["version"])
            if version != cy.SCHEMA_VERSION:
                raise SchemaNotMigratedError(version, cy.SCHEMA_VERSION)
            self._schema_ready = True

    def migrate(self) -> tuple[int | None, int]:
        """`engram migrate`: the schema statements, the data migrations, then the version marker; needs
        schema-admin rights. A database already at ``cy.SCHEMA_VERSION`` is left untouched. Safe to run
        concurrently (``SCHEMA_RACE_CODES``) and again after a failure. Returns (version before, after)."""
        driver = self._get_driver()
        with self._lock, self._mapped_errors(), driver.session(database=self._database) as session:
            found = session.run(cy.Q_SCHEMA_VERSION).single()
            before = None if found is None else int(found["version"])
            if before == cy.SCHEMA_VERSION:
                self._schema_ready = True
                return before, before
            for statement in cy.SCHEMA:
                try:
                    session.run(statement).consume()
                except ClientError as exc:
                    if exc.code not in cy.SCHEMA_RACE_CODES:
                        raise
            session.run("CALL db.awaitIndexes($timeout)", timeout=SCHEMA_WAIT_S).consume()
            # Facts written before the keyword index existed get their user's token (a scan of every fact).
            for record in session.run(episodes_cypher.Q_UNKEYED_FACT_USERS).data():
                uid = record["user_id"]
                session.run(episodes_cypher.Q_SET_FACT_UKEY, user_id=uid, ukey=user_key(uid)).consume()
            # Facts stored before read-time decay get their archive_due_at (another scan of every fact).
            for record in session.run(cy.Q_UNDUE_FACT_USERS).data():
                uid = record["user_id"]
                rows = [
                    {"id": r["id"], "due": self.fading.due(float(r["strength"]), r["since"].to_native())}
                    for r in session.run(cy.Q_UNDUE_FACTS, user_id=uid)
                ]
                for start in range(0, len(rows), _BACKFILL_ROWS):
                    session.run(cy.Q_DUE_SET, user_id=uid, rows=rows[start : start + _BACKFILL_ROWS]).consume()
            session.run(cy.Q_SET_SCHEMA_VERSION, version=cy.SCHEMA_VERSION).consume()
            self._schema_ready = True
            return before, cy.SCHEMA_VERSION

    def ping(self) -> None:
        driver = self._get_driver()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            session.run("RETURN 1").consume()

    def close(self) -> None:
        with self._lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()
