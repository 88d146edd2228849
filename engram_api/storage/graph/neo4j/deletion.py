"""Deletion on Neo4j: the hooks behind ``forget_message``, ``forget_fact`` and ``forget_user``, mixed into
``Neo4jGraphStore``.

``forgetting`` plans what goes; this module reads the scope of one forget and applies its plan in one write
transaction: supersession repairs, the doomed facts, the episode with its chunks (only a message's forget
touches chunks), then the entities left orphaned. Removing a user detach-deletes every node it owns and
its learned weights.
"""

from __future__ import annotations

from neo4j import ManagedTransaction

from engram_api.models import utcnow
from engram_api.storage.graph.forgetting import ForgetPlan, ForgetScope, Removed
from engram_api.storage.graph.neo4j import cypher as cy
from engram_api.storage.graph.neo4j import edits as edits
from engram_api.storage.graph.neo4j import episodes as episodes_cypher
from engram_api.storage.graph.neo4j.connection import Neo4jConnection, bump

__all__ = ["Neo4jDeletion"]


class Neo4jDeletion(Neo4jConnection):
    """Forget scope, forget plan and user removal as Cypher transactions."""

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
            reverted, kept = [], []
            if plan.episode_id is not None:
                # Facts the episode stated that another episode keeps: their sources change (marked below).
                doomed = set(plan.fact_ids)
                kept = [r["id"] for r in tx.run(cy.Q_FORGET_SOURCED, params) if r["id"] not in doomed]
                # What the message did to entities it does not take with it (aliases, summaries): undone.
                reverted = edits.revert_edits(tx, plan.user_id, plan.episode_id, params["now"])
            edits.drop_clusters(tx, plan.user_id, [*plan.fact_ids, *plan.entity_candidates, *reverted])
            if plan.repairs:
                tx.run(cy.Q_FORGET_RESTORE, params, rows=[r.model_dump() for r in plan.repairs]).consume()
            tx.run(cy.Q_FORGET_FACTS, params, doomed=plan.fact_ids).consume()
            if plan.episode_id is not None:
                # Only a message's forget touches chunks: with no episode id the query would take them all.
                tx.run(episodes_cypher.Q_FORGET_CHUNKS, params).consume()
                tx.run(cy.Q_FORGET_EPISODE, params).consume()
            orphans = [r["id"] for r in tx.run(cy.Q_FORGET_ORPHANS, params, candidates=plan.entity_candidates)]
            gone = [*plan.fact_ids, *plan.chunk_ids, *orphans]
            # The repaired facts and those that lost a source are marked: a reader's snapshot takes them in with
            # the removed ids (``feed``), never loading the user whole for a forget.
            changed = [*(r.fact_id for r in plan.repairs), *kept]
            bump(tx, plan.user_id, now=params["now"], facts=changed, removed=True, gone=gone)
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

    def purge_erased(self) -> None:
        """Nothing Engram can do from a client: the deleted nodes stay in the server's transaction logs
        (until rotation and ``db.tx_log.rotation.retention_policy`` prune them), in the full-text index's
        Lucene segments (until they merge) and in any backup; docs/operations.md "Data retention and
        erasure" gives the settings that bound that (the operator's part)."""
