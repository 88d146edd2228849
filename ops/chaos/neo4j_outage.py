"""Scenario 3 — Neo4j outage: the graph store is stopped mid-run and started again (same port and data).

While it is down every stage that touches the graph fails with ``StoreUnavailableError``; the pipeline must
wait it out (apply: ``RetryLater`` with back-off, up to ~40 tries capped at 15 s each) rather than give
up. Proves: nothing dead-lettered, nothing lost or duplicated, and everything lands once Neo4j is back.
"""

from __future__ import annotations

from dataclasses import dataclass

from accounting import ScenarioResult
from fleet import Services
from scenario import Scenario, ScenarioParams

from engram_api import keys

NAME = "Neo4j outage"


@dataclass(frozen=True)
class Params(ScenarioParams):
    down_s: float = 30.0  # Neo4j is stopped 30 % into the production window, for this long plus its start


FULL = Params(users=20, per_user=15, produce_s=45.0)
QUICK = Params(users=6, per_user=10, produce_s=15.0, down_s=10.0, settle_timeout_s=150.0)


class Neo4jOutage(Scenario[Params]):
    NAME = NAME
    FLEET = "neo4j-outage"
    LLM_LATENCY_S = 0.02

    def __init__(self, services: Services, params: Params) -> None:
        if services.neo4j is None:
            raise RuntimeError("the Neo4j outage scenario needs a Neo4jServer it may stop and start")
        super().__init__(services, params)
        self.neo4j = services.neo4j

    def exercise(self) -> None:
        params, result = self.params, self.result
        self.produce_in_background(self.work.messages, seconds=params.produce_s)
        outage = self.outage(self.neo4j.stop, self.neo4j.start, after_s=params.produce_s * 0.3, down_s=params.down_s)
        tally = self.settle()

        pipe = self.client.redis.pipeline(transaction=False)
        for r in self.receipts:
            pipe.hmget(keys.status(r.user_id, r.message_id), "store_attempts", "extract_errors", "apply_errors")
        counters = [[int(v or 0) for v in row] for row in pipe.execute()]
        recovered = self.recovery(outage)
        result.checks["nothing dead-lettered"] = not tally.dead
        result.checks["applied again after Neo4j returned"] = recovered["applied_again_after_restart_s"] is not None
        result.metrics.update(
            neo4j_down_s=outage.down_s,
            max_apply_store_retries=max((c[0] for c in counters), default=0),
            messages_with_unexpected_errors=sum(1 for c in counters if c[1] or c[2]),
            **recovered,
        )
        letters = self.client.dead_letters()
        reasons = sorted({d.reason.splitlines()[0][:160] for d in letters if d.message_id in tally.dead})
        result.notes += [f"dead-letter reason: {r}" for r in reasons[:3]]


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return Neo4jOutage(services, params).run()
