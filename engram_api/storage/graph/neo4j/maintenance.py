"""Maintenance on the Neo4j backend: decay, reinforcement, clusters, feedback and learned weights, as a
mixin of ``Neo4jGraphStore``.

The decay formula and the input checks live in ``base``; here are queries and transactions only. A
maintenance write that changes what recall can return bumps the user's version in the same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from neo4j import ManagedTransaction

from engram_api.models import ClusterRecord, FeedbackRow, LearnedWeights, utcnow
from engram_api.storage.graph.contract import Link
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import rows as shape
from engram_api.storage.graph.neo4j.connection import Neo4jConnection, bump

__all__ = ["Neo4jMaintenance"]


class Neo4jMaintenance(Neo4jConnection):
    """Decay, reinforce, clusters, feedback and weights hooks of the graph-store contract on Neo4j."""

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
                bump(tx, user_id, now=params["now"], facts=[r["id"] for r in rows])
            return [r["archived"] for r in rows]

        return self._write(work)

    def reinforce(self, user_id: str, fact_ids: list[str], *, amount: float, now: datetime) -> int:
        params = {
            "user_id": user_id,
            "ids": fact_ids,
            "amount": float(amount),
            "now": shape.utc(now),
        }

        def work(tx: ManagedTransaction) -> int:
            changed = int(tx.run(cy.Q_REINFORCE, params).single(strict=True)["changed"])
            if changed:
                bump(tx, user_id, now=params["now"], facts=fact_ids)
            return changed

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
