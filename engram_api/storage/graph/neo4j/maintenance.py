"""Maintenance on the Neo4j backend: decay, reinforcement, chunk re-embedding, clusters, feedback and
learned weights, as a mixin of ``Neo4jGraphStore``.

The decay formula and the input checks live in ``base``; here are queries and transactions only. A
maintenance write that changes what recall can return bumps the user's version in the same transaction.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from neo4j import ManagedTransaction

from engram_api.models import ChunkRecord, ClusterRecord, FeedbackRow, LearnedWeights, utcnow
from engram_api.storage.graph.contract import Link
from engram_api.storage.graph.fading import Fading
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j import rows as shape
from engram_api.storage.graph.neo4j.connection import Neo4jConnection, bump

__all__ = ["Neo4jMaintenance"]


def _native(value: Any) -> datetime:
    """A stored DateTime as an aware Python datetime (microseconds: the stores' resolution)."""
    return cast(datetime, value.to_native().astimezone(UTC))


class Neo4jMaintenance(Neo4jConnection):
    """Decay, reinforce, clusters, feedback and weights hooks of the graph-store contract on Neo4j."""

    def _archive_batch(self, user_id: str, *, now: datetime, batch: int) -> list[bool]:
        params = {"user_id": user_id, "now": shape.utc(now), "batch": int(batch)}

        def work(tx: ManagedTransaction) -> list[bool]:
            archived, moved = [], []
            for r in tx.run(cy.Q_ARCHIVE_DUE, params):
                strength, due = self.fading.archival(float(r["strength"]), _native(r["since"]), now)
                if strength is None:
                    moved.append({"id": r["id"], "due": due})
                else:
                    archived.append({"id": r["id"], "strength": strength})
            if archived:
                tx.run(cy.Q_ARCHIVE_SET, params, rows=archived).consume()
                bump(tx, user_id, now=params["now"], facts=[r["id"] for r in archived])
            if moved:  # not faded yet (a changed policy): only the due moves, recall reads nothing new
                tx.run(cy.Q_DUE_SET, params, rows=moved).consume()
            return [True] * len(archived) + [False] * len(moved)

        return self._write(work)

    def users_due(self, now: datetime) -> list[str]:
        return [r["user_id"] for r in self._read_one(cy.Q_USERS_DUE, {"now": shape.utc(now)})]

    def _recorded_fading(self) -> Fading | None:
        found = self._read_one(cy.Q_FADING, {})
        return Fading(float(found[0]["per_day"]), float(found[0]["threshold"])) if found else None

    def _record_fading(self, fading: Fading) -> None:
        self._write(lambda tx: tx.run(cy.Q_SET_FADING, dataclasses.asdict(fading)).consume())

    def _redue_batch(self, after: str, batch: int) -> list[str]:
        def work(tx: ManagedTransaction) -> list[str]:
            rows = [
                {
                    "id": r["id"],
                    "strength": r["strength"],
                    "since_us": r["since_us"],
                    "due": self.fading.due(float(r["strength"]), _native(r["since"])),
                }
                for r in tx.run(cy.Q_REDUE_FACTS, after=after, batch=int(batch))
            ]
            if rows:
                tx.run(cy.Q_REDUE_SET, rows=rows).consume()
            return [r["id"] for r in rows]

        return self._write(work)

    def reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        params = {"user_id": user_id, "ids": fact_ids, "now": shape.utc(now)}

        def work(tx: ManagedTransaction) -> int:
            rows = []
            for r in tx.run(cy.Q_REINFORCE_READ, params):
                after = self.fading.reinforcement(
                    float(r["strength"]), _native(r["since"]), bool(r["archived"]), now, amount
                )
                if after is not None:
                    rows.append({"id": r["id"], "strength": after, "due": self.fading.due(after, now)})
            if rows:
                tx.run(cy.Q_REINFORCE_SET, params, rows=rows).consume()
                bump(tx, user_id, now=params["now"], facts=fact_ids)
            return len(rows)

        return self._write(work)

    def recorded_chunk_context(self) -> str | None:
        found = self._read_one(episodes_cypher.Q_CHUNK_CONTEXT, {})
        return found[0]["context"] if found else None

    def record_chunk_context(self, context: str) -> None:
        self._write(lambda tx: tx.run(episodes_cypher.Q_SET_CHUNK_CONTEXT, context=context).consume())

    def users_to_reembed(self, context: str) -> list[str]:
        return [r["user_id"] for r in self._read_one(episodes_cypher.Q_USERS_TO_REEMBED, {"context": context})]

    def chunks_to_reembed(self, user_id: str, context: str, *, after: str, batch: int) -> list[ChunkRecord]:
        rows = self._rows(
            episodes_cypher.Q_CHUNKS_TO_REEMBED, user_id=user_id, context=context, after=after, batch=int(batch)
        )
        return shape.live_chunks(rows)

    def reembed_chunks(
        self,
        user_id: str,
        context: str,
        vectors: list[tuple[str, list[float]]],
        states: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        held = states or {}
        rows = [{"id": c, "embedding": shape.vector(v), "token_states": held.get(c)} for c, v in vectors]

        def work(tx: ManagedTransaction) -> list[str]:
            params = {"user_id": user_id, "context": context, "rows": rows}
            written = [r["id"] for r in tx.run(episodes_cypher.Q_REEMBED_SET, params)]
            if written:
                bump(tx, user_id, now=shape.utc(utcnow()), chunks=written)
            return written

        return self._write(work)

    def replace_clusters(self, user_id: str, clusters: list[ClusterRecord]) -> None:
        now = utcnow()
        rows = [
            {
                "id": c.id,
                "user_id": user_id,
                "label": c.label,
                "summary": c.summary,
                "centroid": shape.vector([float(x) for x in c.centroid]),
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
            bump(tx, user_id, now=now)

        self._write(work)

    def _clusters(self, user_id: str) -> tuple[list[dict[str, Any]], list[Link]]:
        return self._rows_and_links(cy.Q_CLUSTERS, cy.Q_CLUSTER_MEMBERS, user_id, dict)

    def add_feedback(self, rows: list[FeedbackRow]) -> None:
        first = time.time_ns()
        props = [
            {**row.model_dump(), "created_at": shape.utc(row.created_at), "seq": first + i}
            for i, row in enumerate(rows)
        ]

        def work(tx: ManagedTransaction) -> None:
            tx.run(cy.Q_FEEDBACK_ADD, rows=props).consume()

        self._write(work)

    def feedback(self, user_id: str | None, limit: int) -> list[FeedbackRow]:
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
