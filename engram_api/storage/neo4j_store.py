"""Neo4j backend of the graph-store contract (production).

Graph shape (every node carries ``user_id``; every query filters on it):

    (:User {user_id, epoch, version, prompt_tokens, completion_tokens, cost_usd, llm_calls})
    (:Episode {id, user_id, content, role, event_time, metadata})           id = message id
    (:Entity {id, user_id, name, norm_name, label, aliases, summary, embedding})
        -[:HAS_ALIAS]->(:Alias {user_id, norm})    one per normalized alias, so lookups hit an index
        -[:FROM]->(:Episode)
    (:Fact {id, user_id, subject_id, predicate, object_id, statement, ..., embedding})
        -[:SUBJECT]->(:Entity)  -[:OBJECT]->(:Entity)  -[:FROM]->(:Episode)
    (:Chunk {id, user_id, episode_id, seq, text, ...})-[:PART_OF]->(:Episode)   see neo4j_episodes
    (:Cluster {id, user_id, label, summary, centroid, signature})-[:HAS_MEMBER]->(:Fact|:Entity)
    (:Feedback {user_id, recall_id, fact_id, ..., seq})      (:Weights {scope, ...})

Datetimes are native Cypher ``DateTime`` values in UTC, so range predicates and ``duration`` work in
Cypher; they come back as aware UTC ``datetime``. Model-provided text (labels, predicates, names) is
only ever a parameter value, never part of a query string.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from neo4j import (
    READ_ACCESS,
    Driver,
    GraphDatabase,
    ManagedTransaction,
    NotificationDisabledClassification,
    Query,
    Record,
)
from neo4j.exceptions import (
    ClientError,
    ConfigurationError,
    DatabaseUnavailable,
    DriverError,
    Neo4jError,
    ServiceUnavailable,
    SessionExpired,
)

from engram_api.errors import ConfigError, StoreUnavailableError
from engram_api.models import (
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
from engram_api.storage import neo4j_cypher as cy
from engram_api.storage import neo4j_episodes as episodes_cypher
from engram_api.storage import neo4j_rows as shape
from engram_api.storage.base import Fence, GraphStep, GraphStepQuery, GraphStore, Link
from engram_api.storage.episodes import user_key
from engram_api.storage.forgetting import ForgetPlan, ForgetScope, Removed
from engram_api.versions import ABSENT, Stamp

__all__ = ["Neo4jGraphStore"]

_T = TypeVar("_T")
_PLANNING_ALLOWANCE_S = 120.0

CONNECTION_TIMEOUT_S = 5.0
# Managed transactions retry transient errors (deadlocks, leader switches, a dropped connection)
# for this long; a server that stays down surfaces as StoreUnavailableError after it.
MAX_RETRY_TIME_S = 10.0
SCHEMA_WAIT_S = 60


class _AlreadyApplied(Exception):
    """Raised inside the apply transaction to roll it back when the episode is already stored."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def _fenced(tx: ManagedTransaction, fence: Fence, work: Callable[..., _T], *args: Any) -> tuple[_T, Stamp]:
    """Run ``work`` only if the user's stamp is the fence's; return its result and the stamp after."""
    found = tx.run(cy.Q_FENCE, user_id=fence.user_id).single(strict=True)
    fence.check_before(Stamp(int(found["epoch"]), int(found["version"])))
    result = work(tx, *args)
    after = tx.run(cy.Q_STAMP, user_id=fence.user_id).single()
    stamp = ABSENT if after is None else Stamp(int(after["epoch"]), int(after["version"]))
    fence.check_after(stamp)
    return result, stamp


class Neo4jGraphStore(GraphStore):
    """Graph store on a Neo4j 5 server over Bolt; safe to share between threads."""

    def __init__(
        self, *, uri: str, user: str, password: str | None, database: str, query_timeout_s: float | None = None
    ) -> None:
        self._uri = uri
        self._query_timeout_s = query_timeout_s
        self._auth = None if password is None else (user, password)
        self._database = database
        self._lock = threading.Lock()
        self._driver: Driver | None = None
        self._schema_ready = False
        self._planned: set[tuple[int, ...]] = set()  # graph-step query shapes this store has run once

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
        except ClientError as exc:
            if "TransactionTimedOut" not in (exc.code or ""):
                raise
            raise StoreUnavailableError(f"Neo4j ended a query at its transaction timeout: {exc.message}") from exc

    def _ready(self) -> Driver:
        driver = self._get_driver()
        if not self._schema_ready:
            self.ensure_schema()
        return driver

    def _write(self, work: Callable[..., _T], *args: Any) -> _T:
        driver = self._ready()
        fence = self._fence()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            if fence is None:
                return session.execute_write(work, *args)
            result, fence.expected = session.execute_write(_fenced, fence, work, *args)
        return result

    def _read(self, work: Callable[..., _T], *args: Any) -> _T:
        driver = self._ready()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            return session.execute_read(work, *args)

    def _read_one(self, query: str, params: dict[str, Any], *, timeout: float | None = None) -> list[Record]:
        """One read query as an auto-commit transaction: one round trip, where a managed one adds BEGIN
        and COMMIT (~1 ms per read on a local server, measured; a recall makes 2-3 reads). For a single
        query the two see the same data. A read is idempotent, so what the managed retry would retry (a
        dropped pooled connection, a transient error) is retried here, for as long."""
        driver = self._ready()
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

    # ---------------------------------------------------------------------------- lifecycle
    def ensure_schema(self) -> None:
        driver = self._get_driver()
        with self._lock:
            if self._schema_ready:
                return
            with self._mapped_errors(), driver.session(database=self._database) as session:
                for statement in cy.SCHEMA:
                    try:
                        session.run(statement).consume()
                    except ClientError as exc:
                        if exc.code not in cy.SCHEMA_RACE_CODES:
                            raise
                session.run("CALL db.awaitIndexes($timeout)", timeout=SCHEMA_WAIT_S).consume()
                for record in session.run(episodes_cypher.Q_UNKEYED_FACT_USERS).data():
                    uid = record["user_id"]
                    session.run(episodes_cypher.Q_SET_FACT_UKEY, user_id=uid, ukey=user_key(uid)).consume()
            self._schema_ready = True

    def ping(self) -> None:
        driver = self._get_driver()
        with self._mapped_errors(), driver.session(database=self._database) as session:
            session.run("RETURN 1").consume()

    def close(self) -> None:
        with self._lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()

    # ------------------------------------------------------------------------------- ingest
    def is_applied(self, user_id: str, message_id: str) -> bool:
        def work(tx: ManagedTransaction) -> bool:
            record = tx.run(cy.Q_IS_APPLIED, user_id=user_id, episode_id=message_id).single(strict=True)
            return bool(record["applied"])

        return self._read(work)

    def _find_entities(self, user_id: str, norm_names: list[str]) -> list[EntityRecord]:
        rows = self._rows(cy.Q_FIND_ENTITIES, user_id=user_id, names=norm_names)
        return [EntityRecord.model_validate(r) for r in rows]

    def _get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
        rows = self._rows(cy.Q_GET_ENTITIES, user_id=user_id, ids=entity_ids)
        return [EntityRecord.model_validate(r) for r in rows]

    def _lookup_entities(self, user_id: str, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        rows = self._rows(cy.Q_LOOKUP_ENTITIES, user_id=user_id, ids=entity_ids, names=norm_names)
        return [EntityRecord.model_validate(r) for r in rows]

    def _recent_episodes(self, user_id: str, *, before: datetime, limit: int) -> list[EpisodeRecord]:
        rows = self._rows(cy.Q_RECENT_EPISODES, user_id=user_id, before=shape.utc(before), limit=limit)
        return [EpisodeRecord.model_validate(shape.episode_fields(r)) for r in reversed(rows)]

    def _facts_for_slots(self, user_id: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
        rows = self._rows(cy.Q_SLOTS, user_id=user_id, slots=[list(slot) for slot in slots])
        return [FactRecord.model_validate(r) for r in rows]

    def _apply(self, plan: WritePlan) -> ApplyOutcome:
        user_id = plan.user_id
        episode = plan.episode
        new_entity_ids = {e.id for e in plan.new_entities}
        referenced = {f.subject_id for f in plan.new_facts} | {
            f.object_id for f in plan.new_facts if f.object_id is not None
        }
        params: dict[str, Any] = {
            "user_id": user_id,
            "episode_id": episode.id,
            "epoch": self._creation_epoch(),
            "now": utcnow(),
        }
        episode_props = {
            "id": episode.id,
            "user_id": user_id,
            "content": episode.content,
            "role": episode.role,
            "event_time": shape.utc(episode.event_time),
            "metadata": json.dumps(episode.metadata, sort_keys=True),
            "created_at": shape.utc(episode.created_at),
            "updated_at": shape.utc(episode.updated_at),
        }
        entity_rows = [
            {"props": shape.entity_props(e, user_id), "norms": shape.norms(e.aliases)} for e in plan.new_entities
        ]
        change_rows = [
            {
                "id": c.id,
                "add_aliases": list(dict.fromkeys(c.add_aliases)),
                "norms": shape.norms(c.add_aliases),
                "summary": c.summary,
                "label": c.label,
            }
            for c in plan.entity_changes
        ]
        fact_rows = [{"props": shape.fact_props(f, user_id)} for f in plan.new_facts]
        chunk_rows = [shape.chunk_props(c, user_id, episode.id) for c in plan.chunks]
        fact_change_rows = [
            {"id": c.id, "valid_until": shape.opt_utc(c.valid_until), "superseded_by": c.superseded_by}
            for c in plan.fact_changes
        ]

        def work(tx: ManagedTransaction) -> ApplyOutcome:
            locked = tx.run(cy.Q_APPLY_LOCK, params, usage=plan.usage.model_dump()).single(strict=True)
            version = int(locked["version"])
            check = tx.run(cy.Q_APPLY_CHECK, params, entity_ids=sorted(referenced - new_entity_ids)).single(strict=True)
            if check["applied"]:
                raise _AlreadyApplied(version - 1)
            if check["missing"]:
                raise ValueError(
                    f"plan for episode {episode.id!r} references unknown entities of user "
                    f"{user_id!r}: {sorted(check['missing'])}"
                )
            tx.run(cy.Q_APPLY_EPISODE, params, episode=episode_props).consume()
            if chunk_rows:
                tx.run(episodes_cypher.Q_APPLY_CHUNKS, params, chunks=chunk_rows).consume()
            for query, rows in (
                (cy.Q_APPLY_ENTITIES, entity_rows),
                (cy.Q_APPLY_ENTITY_CHANGES, change_rows),
                (cy.Q_APPLY_FACTS, fact_rows),
                (cy.Q_APPLY_FACT_CHANGES, fact_change_rows),
            ):
                if rows:
                    tx.run(query, params, rows=rows).consume()
            if plan.reinforced_fact_ids or plan.mentioned_entity_ids or plan.linked_fact_ids:
                tx.run(
                    cy.Q_APPLY_LINKS,
                    params,
                    reinforced=list(dict.fromkeys(plan.reinforced_fact_ids)),
                    mentioned=list(dict.fromkeys(plan.mentioned_entity_ids)),
                    linked=list(dict.fromkeys(plan.linked_fact_ids)),
                ).consume()
            return ApplyOutcome(applied=True, version=version)

        try:
            return self._write(work)
        except _AlreadyApplied as skipped:
            return ApplyOutcome(applied=False, version=skipped.version)

    # --------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        records = self._read_one(cy.Q_STAMP, {"user_id": user_id})
        return ABSENT if not records else Stamp(int(records[0]["epoch"]), int(records[0]["version"]))

    def _get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        rows = self._rows(cy.Q_GET_FACTS, user_id=user_id, ids=fact_ids)
        return [FactRecord.model_validate(r) for r in rows]

    def graph_step(self, user_id: str, query: GraphStepQuery) -> GraphStep:
        expanding = query.expanding
        max_len = 2 * int(query.max_hops) + 1
        cypher = cy.Q_GRAPH_STEP.replace("{max_len}", str(max_len))
        params = {
            "user_id": user_id,
            "fact_ids": cy.plan_list(query.fact_ids),
            "seeds": cy.plan_list(query.seeds if expanding else ()),
            "seed_facts": cy.plan_list(query.seed_facts if expanding else ()),
            "current": query.as_of is None,
            "as_of": shape.utc(query.as_of or query.now),
            "since": shape.utc(query.since or cy.BEGINNING),
            "until": shape.utc(query.until or cy.END),
            "now": shape.utc(query.now),
            "limit": int(query.limit),
            "per_seed": int(query.per_seed),
            "avoid": cy.plan_list(query.avoid),
            "known": cy.plan_list(query.known),
            "chunk_ids": cy.plan_list(query.chunk_ids),
            "chunk_facts": cy.plan_list(query.chunk_facts),
            "seed_chunks": cy.plan_list(query.seed_chunks if expanding else ()),
            "seed_chunk_count": int(query.seed_chunk_count),
        }
        # The server counts planning against the timeout, and planning this query takes seconds on a loaded
        # machine. It plans again per length bound and per size bucket of each list parameter: the first
        # run of each such shape in this store gets an allowance.
        plan_shape = (max_len, *(cy.plan_bucket(len(v)) for v in params.values() if isinstance(v, list)))
        timeout = self._query_timeout_s
        if timeout is not None and plan_shape not in self._planned:
            timeout += _PLANNING_ALLOWANCE_S

        # A variable-length match can explode on a dense graph: the server ends it at the timeout.
        (record,) = self._read_one(cypher, params, timeout=timeout)
        self._planned.add(plan_shape)
        return GraphStep(
            facts=[FactRecord.model_validate(shape.from_db(row)) for row in record["facts"]],
            hops=[(fid, int(hops)) for fid, hops in record["hops"]],
            chunks=shape.live_chunks([shape.from_db(row) for row in record["chunks"]]),
        )

    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        rows = self._rows(cy.Q_HISTORY, user_id=user_id, norm=norm, predicate=predicate, limit=int(limit))
        return [FactRecord.model_validate(r) for r in rows]

    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        def work(tx: ManagedTransaction) -> tuple[int, list[FactRecord], list[EntityRecord]]:
            total = tx.run(cy.Q_COUNT_FACTS, user_id=user_id).single(strict=True)["n"]
            facts = [
                FactRecord.model_validate(shape.from_db(r["row"]))
                for r in tx.run(cy.Q_PAGE_FACTS, user_id=user_id, skip=skip, limit=limit)
            ]
            entities = [
                EntityRecord.model_validate(shape.from_db(r["row"]))
                for r in tx.run(cy.Q_PAGE_ENTITIES, user_id=user_id, fact_ids=[f.id for f in facts])
            ]
            return total, facts, entities

        return self._read(work)

    def _stats(self, user_id: str) -> tuple[dict[str, int], dict[str, Any] | None]:
        def work(tx: ManagedTransaction) -> tuple[dict[str, int], dict[str, Any] | None]:
            counts = tx.run(cy.Q_STATS, user_id=user_id).single(strict=True).data()
            user = counts.pop("user")
            lucene = f"ukey:{user_key(user_id)}"
            keyword = tx.run(episodes_cypher.Q_KEYWORD_COUNT, user_id=user_id, lucene=lucene).single(strict=True)
            return {**counts, "keyword_entries": keyword["n"]}, user

        return self._read(work)

    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float]]], int]:
        def work(tx: ManagedTransaction) -> tuple[list[tuple[str, str, list[float]]], int]:
            rows = [(r["node_id"], r["kind"], r["embedding"]) for r in tx.run(cy.Q_VECTORS, user_id=user_id)]
            record = tx.run(cy.Q_VERSION, user_id=user_id).single()
            return rows, 0 if record is None else int(record["version"])

        return self._read(work)

    def _get_chunks(self, user_id: str, chunk_ids: list[str], episode_ids: list[str]) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_CHUNKS, user_id=user_id, ids=chunk_ids, episodes=episode_ids)
        return shape.live_chunks(rows)

    def _add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        by_episode: dict[str, list[dict[str, Any]]] = {}
        for c in chunks:
            by_episode.setdefault(c.episode_id, []).append(shape.chunk_props(c, user_id, c.episode_id))
        rows = [{"episode_id": e, "chunks": cs} for e, cs in by_episode.items()]

        def work(tx: ManagedTransaction) -> int:
            added = int(tx.run(episodes_cypher.Q_ADD_CHUNKS, user_id=user_id, episodes=rows).single(strict=True)["n"])
            if added:
                tx.run(cy.Q_BUMP, user_id=user_id, now=shape.utc(utcnow())).consume()
            return added

        return self._write(work)

    def _remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            removed = [r["id"] for r in tx.run(episodes_cypher.Q_REMOVE_CHUNKS, user_id=user_id, ids=chunk_ids)]
            if removed:
                tx.run(cy.Q_BUMP, user_id=user_id, now=shape.utc(utcnow())).consume()
            return removed

        return self._write(work)

    def _neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_NEIGHBOURS, user_id=user_id, ids=chunk_ids, window=int(window))
        return shape.live_chunks(rows)

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
        ukey = user_key(user_id)
        query = episodes_cypher.Q_KEYWORD.replace("{valid_at}", cy.VALID_AT.format(v="node"))
        params = {
            "user_id": user_id,
            "k": int(k),
            "as_of": shape.opt_utc(as_of),
            "since": shape.opt_utc(since),
            "until": shape.opt_utc(until),
            "lucene_chunks": episodes_cypher.lucene_query(ukey, "body", terms),
            "lucene_facts": episodes_cypher.lucene_query(ukey, "statement", terms),
        }

        hits = [
            KeywordHit(node_id=r["node_id"], kind=r["kind"], score=float(r["score"]))
            for r in self._read_one(query, params)
        ]
        return sorted(hits, key=lambda h: (-h.score, h.node_id))

    def list_users(self) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            return [r["user_id"] for r in tx.run(cy.Q_USERS)]

        return self._read(work)

    # ------------------------------------------------------------------------------- delete
    def _episodes(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        return self._rows_and_links(cy.Q_EPISODES, cy.Q_EPISODE_LINKS, user_id, shape.episode_fields)

    def _rows_and_links(
        self, rows_query: str, links_query: str, user_id: str, fields: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[Link]]:
        """One read transaction: the rows of ``rows_query`` (through ``fields``) and the links of ``links_query``."""

        def work(tx: ManagedTransaction) -> tuple[list[dict[str, Any]], list[Link]]:
            rows = [fields(shape.from_db(r["row"])) for r in tx.run(rows_query, user_id=user_id)]
            links = [(r["owner"], r["kind"], r["node_id"]) for r in tx.run(links_query, user_id=user_id)]
            return rows, links

        return self._read(work)

    def _forget_scope(
        self, user_id: str, *, episode_id: str | None = None, fact_id: str | None = None
    ) -> ForgetScope | None:
        query = cy.Q_FORGET_PLAN if episode_id is not None else cy.Q_FORGET_FACT_PLAN
        params = {"user_id": user_id, "episode_id": episode_id, "fact_id": fact_id}

        def work(tx: ManagedTransaction) -> ForgetScope | None:
            found = tx.run(query, params).single()
            if found is None:
                return None
            doomed, candidates = list(found["doomed"]), list(found["candidates"])
            links = tx.run(cy.Q_FORGET_LINKS, params, doomed=doomed, candidates=candidates).single(strict=True)
            return ForgetScope(
                doomed_fact_ids=doomed,
                entity_candidates=candidates,
                chunk_ids=list(found["chunks"]),
                vectored=list(links["vectored"]),
                successor_of=dict(links["doomed_links"]),
                older=[tuple(pair) for pair in links["older"]],
            )

        return self._read(work)

    def _apply_forget(self, plan: ForgetPlan) -> list[str]:
        params = {"user_id": plan.user_id, "episode_id": plan.episode_id, "now": utcnow()}

        def work(tx: ManagedTransaction) -> list[str]:
            if plan.repairs:
                tx.run(cy.Q_FORGET_RESTORE, params, rows=[r.model_dump() for r in plan.repairs]).consume()
            tx.run(cy.Q_FORGET_FACTS, params, doomed=plan.fact_ids).consume()
            if plan.episode_id is not None:
                # Only a message's forget touches chunks: with no episode id the query would take them all.
                tx.run(episodes_cypher.Q_FORGET_CHUNKS, params).consume()
                tx.run(cy.Q_FORGET_EPISODE, params).consume()
            orphans = [r["id"] for r in tx.run(cy.Q_FORGET_ORPHANS, params, candidates=plan.entity_candidates)]
            tx.run(cy.Q_BUMP, params).consume()
            return orphans

        return self._write(work)

    def _forget_user(self, user_id: str) -> Removed:
        def work(tx: ManagedTransaction) -> Removed:
            scan = tx.run(cy.Q_FORGET_USER_SCAN, user_id=user_id).single(strict=True)
            chunks = [r["id"] for r in tx.run(episodes_cypher.Q_FORGET_CHUNKS, user_id=user_id, episode_id=None)]
            for label in cy.FORGET_USER_LABELS:
                tx.run(f"MATCH (n:{label} {{user_id: $user_id}}) DETACH DELETE n", user_id=user_id).consume()
            tx.run("MATCH (w:Weights {scope: $user_id}) DELETE w", user_id=user_id).consume()
            return Removed(
                user_id=user_id,
                episodes=scan["episodes"],
                fact_ids=scan["facts"],
                entity_ids=scan["entities"],
                chunk_ids=chunks,
                vectored=frozenset(scan["vectored"]),
            )

        return self._write(work)

    # -------------------------------------------------------------------------- maintenance
    def _decay_batch(
        self, user_id: str, *, now: datetime, batch: int, fade: Callable[[float, datetime], tuple[float, bool]]
    ) -> list[bool]:
        params = {"user_id": user_id, "now": shape.utc(now), "batch": int(batch)}

        def work(tx: ManagedTransaction) -> list[bool]:
            rows = []
            for r in tx.run(cy.Q_DECAY_BATCH, params):
                strength, archived = fade(float(r["strength"]), r["since"].to_native().astimezone(UTC))
                rows.append({"id": r["id"], "strength": strength, "archived": archived})
            if rows:
                tx.run(cy.Q_DECAY_SET, params, rows=rows).consume()
                tx.run(cy.Q_BUMP, params).consume()
            return [r["archived"] for r in rows]

        return self._write(work)

    def _reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        params = {
            "user_id": user_id,
            "ids": fact_ids,
            "amount": float(amount),
            "now": shape.utc(now),
        }

        def work(tx: ManagedTransaction) -> int:
            changed = int(tx.run(cy.Q_REINFORCE, params).single(strict=True)["changed"])
            if changed:
                tx.run(cy.Q_BUMP, params).consume()
            return changed

        return self._write(work)

    def _replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None:
        now = utcnow()
        rows = [
            {
                "id": c.id,
                "user_id": user_id,
                "label": c.label,
                "summary": c.summary,
                "centroid": [float(x) for x in c.centroid],
                "signature": c.signature,
                "created_at": shape.utc(c.created_at),
                "updated_at": shape.utc(c.updated_at),
            }
            for c in clusters
        ]
        fact_links = [
            {"cluster_id": c.id, "node_id": node_id} for c in clusters for node_id in dict.fromkeys(c.member_fact_ids)
        ]
        entity_links = [
            {"cluster_id": c.id, "node_id": node_id} for c in clusters for node_id in dict.fromkeys(c.member_entity_ids)
        ]

        def work(tx: ManagedTransaction) -> None:
            tx.run(cy.Q_CLUSTERS_DELETE, user_id=user_id).consume()
            if rows:
                tx.run(cy.Q_CLUSTERS_CREATE, rows=rows).consume()
            if fact_links:
                tx.run(cy.Q_CLUSTERS_LINK_FACTS, user_id=user_id, links=fact_links).consume()
            if entity_links:
                tx.run(cy.Q_CLUSTERS_LINK_ENTITIES, user_id=user_id, links=entity_links).consume()
            # A user with no User node yet has nothing recall could cache, so no bump is needed.
            tx.run(cy.Q_BUMP, user_id=user_id, now=now).consume()

        self._write(work)

    def _clusters(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        return self._rows_and_links(cy.Q_CLUSTERS, cy.Q_CLUSTER_MEMBERS, user_id, dict)

    def _add_feedback(self, rows: list[FeedbackRow]) -> None:
        first = time.time_ns()
        props = [
            {**row.model_dump(), "created_at": shape.utc(row.created_at), "seq": first + i}
            for i, row in enumerate(rows)
        ]

        def work(tx: ManagedTransaction) -> None:
            tx.run(cy.Q_FEEDBACK_ADD, rows=props).consume()

        self._write(work)

    def _feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
        if user_id is None:
            rows = self._rows(cy.Q_FEEDBACK_ALL, limit=int(limit))
        else:
            rows = self._rows(cy.Q_FEEDBACK_USER, user_id=user_id, limit=int(limit))
        return [FeedbackRow.model_validate(r) for r in rows]

    def save_weights(self, weights: LearnedWeights) -> None:
        row = {**weights.model_dump(), "fitted_at": shape.utc(weights.fitted_at)}

        def work(tx: ManagedTransaction) -> None:
            tx.run(cy.Q_WEIGHTS_SAVE, row=row).consume()

        self._write(work)

    def load_weights(self, scope: str) -> LearnedWeights | None:
        rows = self._rows(cy.Q_WEIGHTS_LOAD, scope=scope)
        return LearnedWeights.model_validate(rows[0]) if rows else None
