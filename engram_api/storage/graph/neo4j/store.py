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
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from neo4j import ManagedTransaction

from engram_api.models import (
    ApplyOutcome,
    ChunkRecord,
    EntityRecord,
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
from engram_api.storage.graph.episodes import user_key
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j import rows as shape
from engram_api.storage.graph.neo4j.connection import Neo4jConnection, bump
from engram_api.storage.graph.neo4j.deletion import Neo4jDeletion
from engram_api.storage.graph.neo4j.maintenance import Neo4jMaintenance
from engram_api.storage.graph.neo4j.vectors import Q_APPLY_WRITES_CHANGES, Neo4jVectors, user_changes_of
from engram_api.storage.graph.validity import instant
from engram_api.versions import ABSENT, Stamp

if TYPE_CHECKING:
    from engram_api.storage.faiss.sync import UserChanges
    from engram_api.storage.snapshot.graph import UserSnapshot  # imports numpy: the CLI's light reads must not

__all__ = ["Neo4jGraphStore"]

_PLANNING_ALLOWANCE_S = 120.0


class _AlreadyApplied(Exception):
    """Raised inside the apply transaction to roll it back when the episode is already stored."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


class Neo4jGraphStore(Neo4jDeletion, Neo4jMaintenance, Neo4jVectors, Neo4jConnection):
    """Graph store on a Neo4j 5 server over Bolt; safe to share between threads.

    Ingest and reads are here; the plumbing is ``Neo4jConnection`` (``neo4j_connection``), deletion
    ``Neo4jDeletion`` (``neo4j_deletion``), maintenance ``Neo4jMaintenance`` (``neo4j_maintenance``) and
    vector catch-up reads ``Neo4jVectors`` (``neo4j_vectors``).
    """

    # ------------------------------------------------------------------------------- ingest
    def is_applied(self, user_id: str, message_id: str) -> bool:
        # One auto-commit read (``_read_one``): apply asks this first for every message it is handed.
        (record,) = self._read_one(cy.Q_IS_APPLIED, {"user_id": user_id, "episode_id": message_id})
        return bool(record["applied"])

    def get_entities(self, user_id: str, entity_ids: list[str]) -> list[EntityRecord]:
        rows = self._rows(cy.Q_GET_ENTITIES, user_id=user_id, entity_ids=entity_ids)
        return [shape.entity_record(r) for r in rows]

    def lookup_entities(self, user_id: str, *, entity_ids: list[str], norm_names: list[str]) -> list[EntityRecord]:
        rows = self._rows(cy.Q_LOOKUP_ENTITIES, user_id=user_id, ids=entity_ids, names=norm_names)
        return [shape.entity_record(r) for r in rows]

    def _extraction_context(self, user_id: str, reads: ContextReads) -> ExtractionContext:
        params = {
            "user_id": user_id,
            "entity_ids": cy.plan_list(reads.entity_ids),
            "fact_ids": cy.plan_list(reads.fact_ids),
            "slots": [list(slot) for slot in reads.slots],
            "before": shape.utc(reads.before),
            "limit": int(reads.turns),
        }
        (record,) = self._read_one(cy.Q_EXTRACTION_CONTEXT, params)
        return ExtractionContext(
            entities=[shape.entity_record(r) for r in record["entities"]],
            facts=shape.live_facts(record["facts"]),
            slot_facts=[shape.fact_record(r) for r in record["slot_facts"]],
            episodes=[shape.episode_record(r) for r in reversed(record["episodes"])],
        )

    def apply(self, plan: WritePlan) -> ApplyOutcome:
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
        params["restated"] = self.fading.due(1.0, params["now"])  # a restated fact: full strength as of now
        episode_props = {
            "id": episode.id,
            "user_id": user_id,
            "content": episode.content,
            "role": episode.role,
            "event_time": shape.instant(episode.event_time),
            "metadata": json.dumps(episode.metadata, sort_keys=True),
            "created_at": shape.instant(episode.created_at),
            "updated_at": shape.instant(episode.updated_at),
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
        fact_rows = [{"props": shape.fact_props(f, user_id, self._fact_due(f))} for f in plan.new_facts]
        chunk_rows = [shape.chunk_props(c, user_id, episode.id, plan.chunk_context) for c in plan.chunks]
        fact_change_rows = [
            {"id": c.id, "valid_until": shape.instant(c.valid_until), "superseded_by": c.superseded_by}
            for c in plan.fact_changes
        ]

        fence = self._fence()
        since = fence.changes_since if fence is not None else None  # the feed's read, in the write statement

        def work(
            tx: ManagedTransaction, check: Callable[[Stamp], None]
        ) -> tuple[tuple[ApplyOutcome, UserChanges | None], Stamp]:
            locked = tx.run(
                cy.Q_APPLY_LOCK,
                params,
                usage=plan.usage.model_dump(),
                entity_ids=cy.plan_list(sorted(referenced - new_entity_ids)),
            ).single(strict=True)
            check(Stamp(int(locked["found_epoch"]), int(locked["found_version"])))
            version = int(locked["version"])
            if locked["applied"]:
                raise _AlreadyApplied(version - 1)
            if locked["missing"]:
                raise ValueError(
                    f"plan for episode {episode.id!r} references unknown entities of user "
                    f"{user_id!r}: {sorted(locked['missing'])}"
                )
            written = tx.run(
                cy.Q_APPLY_WRITES if since is None else Q_APPLY_WRITES_CHANGES,
                params,
                since=since,
                version=version,
                episode=episode_props,
                chunks=cy.plan_rows(chunk_rows),
                entities=cy.plan_rows(entity_rows),
                entity_changes=cy.plan_rows(change_rows),
                facts=cy.plan_rows(fact_rows),
                fact_changes=cy.plan_rows(fact_change_rows),
                reinforced=cy.plan_list(plan.reinforced_fact_ids),
                mentioned=cy.plan_list(plan.mentioned_entity_ids),
                linked=cy.plan_list(plan.linked_fact_ids),
            )
            changes = None if since is None else user_changes_of(written.single(strict=True))
            if since is None:
                written.consume()
            return (ApplyOutcome(applied=True, version=version), changes), Stamp(int(locked["epoch"]), version)

        try:
            outcome, changes = self._write_locking(work)
        except _AlreadyApplied as skipped:
            if self._batch_tx() is not None:
                raise  # the lock statement's writes are in the block's transaction: the block must roll back
            return ApplyOutcome(applied=False, version=skipped.version)
        if fence is not None:
            fence.changes = changes
        return outcome

    # --------------------------------------------------------------------------------- read
    def user_stamp(self, user_id: str) -> Stamp:
        records = self._read_one(cy.Q_STAMP, {"user_id": user_id})
        return ABSENT if not records else Stamp(int(records[0]["epoch"]), int(records[0]["version"]))

    def get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        return shape.live_facts(self._rows(cy.Q_GET_FACTS, user_id=user_id, fact_ids=fact_ids))

    def graph_step(self, user_id: str, query: GraphStepQuery) -> GraphStep:
        cypher, params = self.graph_step_statement(user_id, query)
        # The server counts planning against the timeout, and planning this query takes seconds on a loaded
        # machine. It plans again per length bound and per size bucket of each list parameter: the first
        # run of each such shape in this store gets an allowance.
        plan_shape = (query.max_hops, *(cy.plan_bucket(len(v)) for v in params.values() if isinstance(v, list)))
        timeout = self._query_timeout_s
        if timeout is not None and plan_shape not in self._planned:
            timeout += _PLANNING_ALLOWANCE_S

        # A variable-length match can explode on a dense graph: the server ends it at the timeout.
        (record,) = self._read_one(cypher, params, timeout=timeout)
        self._planned.add(plan_shape)
        return GraphStep(
            facts=shape.live_facts(record["facts"]),
            # A fact a concurrent forget deleted mid-read has a null id (see ``shape.live_facts``).
            hops=[(fid, int(hops)) for fid, hops in record["hops"] if fid is not None],
            chunks=shape.live_chunks(record["chunks"]),  # plain values: no driver types to convert
        )

    def graph_step_statement(self, user_id: str, query: GraphStepQuery) -> tuple[str, dict[str, Any]]:
        """The Cypher and parameters ``graph_step`` runs (tests PROFILE it)."""
        expanding = query.expanding
        cypher = cy.Q_GRAPH_STEP.replace("{max_len}", str(2 * int(query.max_hops) + 1))
        params = {
            "user_id": user_id,
            "fact_ids": cy.plan_list(query.fact_ids),
            "seeds": cy.plan_list(query.seeds if expanding else ()),
            "seed_facts": cy.plan_list(query.seed_facts if expanding else ()),
            "at": shape.utc(query.at),
            "since": shape.utc(query.since or cy.BEGINNING),
            "until": shape.utc(query.until or cy.END),
            "limit": int(query.limit),
            "per_seed": int(query.per_seed),
            "avoid": cy.plan_list(query.avoid),
            "known": cy.plan_list(query.known),
            "chunk_ids": cy.plan_list(query.chunk_ids),
            "chunk_facts": cy.plan_list(query.chunk_facts),
            "seed_chunks": cy.plan_list(query.seed_chunks if expanding else ()),
            "seed_chunk_count": int(query.seed_chunk_count),
        }
        return cypher, params

    def _snapshot(self, user_id: str, max_records: int, build: SnapshotBuild) -> UserSnapshot | None:
        def work(tx: ManagedTransaction) -> UserSnapshot | None:
            found = tx.run(cy.Q_STAMP, user_id=user_id).single()
            stamp = ABSENT if found is None else Stamp(int(found["epoch"]), int(found["version"]))
            if tx.run(cy.Q_USER_SIZE, user_id=user_id).single(strict=True)["n"] > max_records:
                return None

            def chunks() -> Iterator[ChunkRecord]:  # run once the facts are read: one result streams at a time
                yield from shape.each_live_chunk(
                    r["row"] for r in tx.run(episodes_cypher.Q_USER_CHUNKS, user_id=user_id)
                )

            return build(
                stamp, shape.each_live_fact(r["row"] for r in tx.run(cy.Q_USER_FACTS, user_id=user_id)), chunks()
            )

        return self._read(work)

    def _snapshot_changes(self, user_id: str, since: int) -> SnapshotChanges:
        def work(tx: ManagedTransaction) -> SnapshotChanges:
            found = tx.run(cy.Q_CHANGES_STAMP, user_id=user_id, since=since).single(strict=True)
            size = tx.run(cy.Q_USER_SIZE, user_id=user_id).single(strict=True)["n"]
            facts = shape.live_facts([r["row"] for r in tx.run(cy.Q_CHANGED_FACTS, user_id=user_id, since=since)])
            chunk_rows = [r["row"] for r in tx.run(episodes_cypher.Q_CHANGED_CHUNKS, user_id=user_id, since=since)]
            return SnapshotChanges(
                stamp=Stamp(int(found["epoch"]), int(found["version"])),
                removed=int(found["removed"]),
                size=int(size),
                facts=facts,
                chunks=shape.live_chunks(chunk_rows),
                gone=tuple(found["gone"]),
                horizon=None if found["horizon"] is None else int(found["horizon"]),
            )

        return self._read(work)

    def _history(self, user_id: str, norm: str, predicate: str | None, limit: int) -> list[FactRecord]:
        rows = self._rows(cy.Q_HISTORY, user_id=user_id, norm=norm, predicate=predicate, limit=int(limit))
        return [shape.fact_record(r) for r in rows]

    def _page(self, user_id: str, *, skip: int, limit: int) -> tuple[int, list[FactRecord], list[EntityRecord]]:
        def work(tx: ManagedTransaction) -> tuple[int, list[FactRecord], list[EntityRecord]]:
            total = tx.run(cy.Q_COUNT_FACTS, user_id=user_id).single(strict=True)["n"]
            facts = [
                shape.fact_record(r["row"]) for r in tx.run(cy.Q_PAGE_FACTS, user_id=user_id, skip=skip, limit=limit)
            ]
            entities = [
                shape.entity_record(r["row"])
                for r in tx.run(cy.Q_PAGE_ENTITIES, user_id=user_id, fact_ids=[f.id for f in facts])
            ]
            return total, facts, entities

        return self._read(work)

    def _stats(self, user_id: str, now: datetime) -> tuple[dict[str, int], dict[str, Any] | None]:
        def work(tx: ManagedTransaction) -> tuple[dict[str, int], dict[str, Any] | None]:
            counts = tx.run(cy.Q_STATS, user_id=user_id, at=shape.utc(now)).single(strict=True).data()
            user = counts.pop("user")
            lucene = f"ukey:{user_key(user_id)}"
            keyword = tx.run(episodes_cypher.Q_KEYWORD_COUNT, user_id=user_id, lucene=lucene).single(strict=True)
            return {**counts, "keyword_entries": keyword["n"]}, user

        return self._read(work)

    def _vectors(self, user_id: str) -> tuple[list[tuple[str, str, list[float], bytes | None]], int]:
        def work(tx: ManagedTransaction) -> tuple[list[tuple[str, str, list[float], bytes | None]], int]:
            rows = [
                (r["node_id"], r["kind"], r["embedding"], None if r["states"] is None else bytes(r["states"]))
                for r in tx.run(cy.Q_VECTORS, user_id=user_id)
            ]
            record = tx.run(cy.Q_VERSION, user_id=user_id).single()
            return rows, 0 if record is None else int(record["version"])

        return self._read(work)

    def get_chunks(self, user_id: str, chunk_ids: list[str], *, episode_ids: list[str]) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_CHUNKS, user_id=user_id, ids=chunk_ids, episodes=episode_ids)
        return shape.live_chunks(rows)

    def add_chunks(self, user_id: str, chunks: list[ChunkRecord]) -> int:
        by_episode: dict[str, list[dict[str, Any]]] = {}
        for c in chunks:
            by_episode.setdefault(c.episode_id, []).append(shape.chunk_props(c, user_id, c.episode_id, "none"))
        rows = [{"episode_id": e, "chunks": cs} for e, cs in by_episode.items()]

        def work(tx: ManagedTransaction) -> int:
            added = int(tx.run(episodes_cypher.Q_ADD_CHUNKS, user_id=user_id, episodes=rows).single(strict=True)["n"])
            if added:
                bump(tx, user_id, now=shape.utc(utcnow()), chunks=[c.id for c in chunks])
            return added

        return self._write(work)

    def remove_chunks(self, user_id: str, chunk_ids: list[str]) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            removed = [r["id"] for r in tx.run(episodes_cypher.Q_REMOVE_CHUNKS, user_id=user_id, ids=chunk_ids)]
            if removed:
                bump(tx, user_id, now=shape.utc(utcnow()), removed=True, gone=removed)
            return removed

        return self._write(work)

    def neighbour_chunks(self, user_id: str, chunk_ids: list[str], window: int) -> list[ChunkRecord]:
        rows = self._rows(episodes_cypher.Q_NEIGHBOURS, user_id=user_id, ids=chunk_ids, window=int(window))
        return shape.live_chunks(rows)

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
        ukey = user_key(user_id)
        params = {
            "user_id": user_id,
            "k": int(k),
            "as_of": shape.opt_utc(as_of),
            "at": shape.utc(instant(as_of)),
            "since": shape.opt_utc(since),
            "until": shape.opt_utc(until),
            "lucene_chunks": episodes_cypher.lucene_query(ukey, "body", terms),
            "lucene_facts": episodes_cypher.lucene_query(ukey, "statement", terms),
        }

        hits = [
            KeywordHit(node_id=r["node_id"], kind=r["kind"], score=float(r["score"]))
            for r in self._read_one(episodes_cypher.Q_KEYWORD, params)
        ]
        return sorted(hits, key=lambda h: (-h.score, h.node_id))

    def list_users(self) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            return [r["user_id"] for r in tx.run(cy.Q_USERS)]

        return self._read(work)

    def _episodes(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        return self._rows_and_links(cy.Q_EPISODES, cy.Q_EPISODE_LINKS, user_id, shape.episode_fields)
