"""Scenario 6 — lease expiry under load: per-user write leases lapse mid-apply while messages for the
same few users keep arriving.

A thief thread deletes every held per-user apply lease over and over during production; to a holder
that is exactly a lease that expired while it worked (a stalled process, an apply slower than the TTL).
Several apply processes then write the same user at once. The renewed lease cannot help here; the fence
must: each graph write commits only if the user's stamp is still the one its plan was built on, else it
is refused and planned again. Proves: nothing lost, nothing duplicated (entities, facts, provenance,
index rows), every user's LIVES_IN chain follows event time with only the last move current, and each
user's FAISS index holds exactly the graph's vectors.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import MappingProxyType

from accounting import ScenarioResult
from fleet import EXTRACT_8, Poller, Services
from scenario import Scenario, ScenarioParams
from workload import enqueue_paced

from engram_api import MemoryClient, keys
from engram_api.errors import WaitTimeoutError
from engram_workers.services.celery_worker import APPLY_WORKER

NAME = "lease expiry under load"


@dataclass(frozen=True)
class Params(ScenarioParams):
    steal_every_s: float = 0.02  # the thief deletes every held lease this often


FULL = Params(users=6, per_user=40, produce_s=60.0, moves=8)
QUICK = Params(users=3, per_user=16, produce_s=15.0, moves=4, settle_timeout_s=200.0)


class Thief(Poller):
    """Deletes the held apply leases of ``users`` every ``every`` seconds until stopped; counts thefts."""

    def __init__(self, client: MemoryClient, users: list[str], every: float) -> None:
        super().__init__("lease-thief", every, join_timeout=10)
        self.redis = client.redis
        self.leases = [keys.apply_lock(u) for u in users]
        self.stolen = 0

    def poll(self) -> None:
        self.stolen += int(self.redis.delete(*self.leases))


class LeaseExpiry(Scenario[Params]):
    NAME = NAME
    FLEET = "lease-expiry"
    # Two processes of three threads: overlapping writers across and within processes.
    WORKERS = MappingProxyType(
        {
            "extract": EXTRACT_8,
            "apply-1": {**APPLY_WORKER, "pool": "threads", "concurrency": 3},
            "apply-2": {**APPLY_WORKER, "pool": "threads", "concurrency": 3},
        }
    )
    LLM_LATENCY_S = 0.01

    def exercise(self) -> None:
        params, result, client = self.params, self.result, self.client
        # Round-robin over users (each user's own messages stay in event-time order), so every user has
        # several messages in flight at once across the apply processes.
        messages = sorted(self.work.messages, key=lambda m: (m.timestamp, m.user_id))
        thief = Thief(client, self.work.users, params.steal_every_s)
        thief.start()
        enqueue_paced(client, messages, self.receipts, seconds=params.produce_s)
        # Keep stealing until the backlog is applied: the last messages are the most contended.
        with contextlib.suppress(WaitTimeoutError):
            client.wait(self.receipts, timeout=params.settle_timeout_s / 2)
        thief.stop()
        tally = self.settle(timeout=params.settle_timeout_s / 2)

        result.checks["leases were stolen mid-apply"] = thief.stolen > 0
        self.check_order(tally)
        # What a reader searches at the graph's stamp must be exactly the graph's vectors.
        keeper = client.reader.keeper
        drifted = [
            u
            for u in self.work.users
            if keeper.current(u, client.graph.user_stamp(u)).node_ids()
            != {i.node_id for i in client.graph.vectors(u)[0]}
        ]
        result.checks["every index equals its graph"] = not drifted
        if drifted:
            result.notes.append(f"index differs from the graph for {drifted[:2]}")
        result.metrics.update(leases_stolen=thief.stolen, users=params.users, per_user=params.per_user)


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return LeaseExpiry(services, params).run()
