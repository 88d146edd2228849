"""Scenario 5 — poison message: a message whose apply kills the worker process every single time.

``tests.support.faults:CrashAlways`` (loaded through ``ENGRAM_MIDDLEWARE``) calls ``os._exit(1)`` in the
apply pool child for every message id starting with ``poison-``. The pool child dies, the main process
re-queues the message (acks_late + reject_on_worker_lost), and the per-message deliveries counter,
incremented on every start and decremented only when a start finishes, remembers each death. Proves: the
poison message is dead-lettered after ``ENGRAM_POISON_MAX_DELIVERIES`` deaths (bounded), and the same user's
later messages are applied anyway (no head-of-line blocking), as are other users' messages.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from accounting import ScenarioResult
from fleet import Services
from scenario import Scenario, ScenarioParams
from workload import Workload, enqueue_paced

from engram_api import keys
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER

NAME = "poison message"
_POOL_CHILD_DIED = re.compile(r"Process 'ForkPoolWorker-\d+' pid:\d+ exited with 'exitcode 1'")


@dataclass(frozen=True)
class Params(ScenarioParams):
    # users x per_user messages, enqueued at once (produce_s 0), one per user poisoned
    poison_at: int = 2  # which of a user's messages (in event time) is the poison one
    bystanders: int = 4  # users with no poison at all
    max_deliveries: int = 5  # ENGRAM_POISON_MAX_DELIVERIES (the default)


FULL = Params(users=4, per_user=8, produce_s=0.0)
# Every death costs a fresh pool child that loads the embedding model again: keep the quick run to 3.
QUICK = Params(users=1, per_user=5, produce_s=0.0, poison_at=1, bystanders=2, max_deliveries=3, settle_timeout_s=150.0)


class Poison(Scenario[Params]):
    NAME = NAME
    FLEET = "poison"
    WORKERS = MappingProxyType({"extract": {**EXTRACT_WORKER, "concurrency": 4}, "apply": APPLY_WORKER})

    def __init__(self, services: Services, params: Params) -> None:
        super().__init__(services, params)
        self.bystanders = Workload(f"{self.FLEET}b{os.getpid()}", users=params.bystanders, per_user=params.per_user)
        poisoned = {m.user_id: m for m in self.work.messages[params.poison_at :: params.per_user]}
        self.messages = [
            dataclasses.replace(m, message_id=f"poison-{m.message_id}") if poisoned[m.user_id] is m else m
            for m in self.work.messages
        ]
        self.work.messages = self.messages  # what is sent: the graph check expects no episode of a poison one
        self.poison_ids = {f"poison-{m.message_id}" for m in poisoned.values()}
        # The poisoned users' messages after their poison one: they must not wait for it.
        self.later = [m for m in self.messages if m.timestamp > poisoned[m.user_id].timestamp]

    def workloads(self) -> list[Workload]:
        return [self.work, self.bystanders]

    def fleet_settings(self) -> Mapping[str, object]:
        return {"middleware": "tests.support.faults:CrashAlways", "poison_max_deliveries": self.params.max_deliveries}

    def exercise(self) -> None:
        params, result, client = self.params, self.result, self.client
        poison_ids, later = self.poison_ids, self.later
        enqueue_paced(client, [*self.messages, *self.bystanders.messages], self.receipts, seconds=params.produce_s)
        tally = self.settle()

        letters = [d for d in client.dead_letters() if d.message_id in poison_ids]
        deaths = len(_POOL_CHILD_DIED.findall(self.workers["apply"].log_path.read_text(errors="replace")))
        dead_at = {d.user_id: d.failed_at.timestamp() for d in letters}
        pipe = client.redis.pipeline(transaction=False)
        for m in later:
            pipe.hget(keys.status(m.user_id, m.message_id), "applied_at")
        overtook = sum(
            1
            for m, applied_at in zip(later, pipe.execute(), strict=True)
            if applied_at is not None and float(applied_at) < dead_at.get(m.user_id, float("inf"))
        )

        result.checks["only the poison messages were dead-lettered"] = tally.dead == poison_ids
        result.checks["poison dead-lettered by the apply stage, with its reason"] = len(letters) == len(
            poison_ids
        ) and all(d.stage == "apply" and "worker died" in d.reason for d in letters)
        result.checks["bounded: max_deliveries deaths per poison message"] = all(
            d.attempts == params.max_deliveries for d in letters
        ) and deaths == params.max_deliveries * len(poison_ids)
        result.checks["the poisoned users' later messages were applied"] = all(
            m.message_id in tally.applied for m in later
        )
        result.metrics.update(
            poison_messages=len(poison_ids),
            max_deliveries=params.max_deliveries,
            apply_child_deaths=deaths,
            later_messages_applied_before_the_poison_died=f"{overtook}/{len(later)}",
        )
        result.details["dead_letters"] = [d.model_dump(mode="json", exclude={"envelope"}) for d in letters]


def run(services: Services, params: Params = FULL) -> ScenarioResult:
    return Poison(services, params).run()
