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
import random
import threading
import time
from dataclasses import dataclass

from harness import (
    APPLY_WORKER,
    EXTRACT_WORKER,
    ScenarioResult,
    Services,
    Workload,
    audit,
    enqueue_paced,
    fleet,
    settle,
    start_workers,
    warm_up,
)

from engram_api import keys
from engram_api.errors import WaitTimeoutError
from engram_api.models import Receipt

NAME = "lease expiry under load"


@dataclass(frozen=True)
class Params:
    users: int = 6
    per_user: int = 40
    moves: int = 8
    produce_s: float = 60.0
    steal_every_s: float = 0.02
    settle_timeout_s: float = 600.0
    seed: int = 6


FULL = Params()
QUICK = Params(users=3, per_user=16, moves=4, produce_s=15.0, settle_timeout_s=200.0)


class Thief(threading.Thread):
    """Deletes the held apply leases of ``users`` every ``every`` seconds until stopped; counts thefts."""

    def __init__(self, client: object, users: list[str], every: float) -> None:
        super().__init__(daemon=True)
        self.redis = client.redis  # type: ignore[attr-defined]
        self.leases = [keys.apply_lock(u) for u in users]
        self.every = every
        self.stolen = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.stolen += int(self.redis.delete(*self.leases))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    result = ScenarioResult(NAME)
    begun = time.monotonic()
    rng = random.Random(params.seed)
    work = Workload(f"lease{rng.randrange(10**6)}", users=params.users, per_user=params.per_user, moves=params.moves)
    # Round-robin over users (each user's own messages stay in event-time order), so every user has
    # several messages in flight at once across the apply processes.
    order = {m.message_id: (m.timestamp, m.user_id) for m in work.messages}
    messages = sorted(work.messages, key=lambda m: order[m.message_id])
    services.llm.reset()
    services.llm.latency_s = 0.01

    with fleet(services, "lease-expiry") as stack:
        client = stack.client
        start_workers(
            stack,
            {
                "extract": {**EXTRACT_WORKER, "concurrency": 8},
                # Two processes of three threads: overlapping writers across and within processes.
                "apply-1": {**APPLY_WORKER, "pool": "threads", "concurrency": 3},
                "apply-2": {**APPLY_WORKER, "pool": "threads", "concurrency": 3},
            },
        )
        warm_up(stack, services.llm, work.reply)
        receipts: list[Receipt] = []
        thief = Thief(client, work.users, params.steal_every_s)
        thief.start()
        enqueue_paced(client, messages, receipts, seconds=params.produce_s)
        # Keep stealing until the backlog is applied: the last messages are the most contended.
        with contextlib.suppress(WaitTimeoutError):
            client.wait(receipts, timeout=params.settle_timeout_s / 2)
        thief.stop()
        tally = settle(client, receipts, timeout=params.settle_timeout_s / 2)
        dup = audit(client, work.users)
        result.count(tally, dup)

        violations = work.order_violations(client, tally.applied)
        # What a reader searches at the graph's stamp must be exactly the graph's vectors.
        keeper = client.reader.keeper
        drifted = [
            u
            for u in work.users
            if keeper.current(u, client.graph.user_stamp(u)).node_ids()
            != {i.node_id for i in client.graph.vectors(u)[0]}
        ]
        result.checks["leases were stolen mid-apply"] = thief.stolen > 0
        result.checks["per-user LIVES_IN order"] = not violations
        result.checks["every index equals its graph"] = not drifted
        if violations:
            result.notes.append(f"order violated for {len(violations)} users, e.g. {violations[:2]}")
        if drifted:
            result.notes.append(f"index differs from the graph for {drifted[:2]}")
        result.metrics.update(leases_stolen=thief.stolen, users=params.users, per_user=params.per_user)
    result.seconds = round(time.monotonic() - begun, 1)
    return result
