"""A Sentinel failover under load (issue 45, item 7), on real processes: a primary, its replica and a Sentinel;
the fleet knows only the Sentinel's address. Messages are applied before the failover, more are in flight
when the primary is SIGKILLed, and more are enqueued after the Sentinel promoted the replica: the producer,
the workers (Celery through Engram's Sentinel transport, the stages' own clients) and the reader carry on
through the same ``sentinel://`` URL, and every enqueued message is applied exactly once in the graph.

What a failover can lose is Redis's part: replication is asynchronous, so writes the replica had not received
are gone. The test makes the producer's enqueues reach the replica before the kill (it waits for the
replica's offset), which is what a producer gets from Redis's ``WAIT``; the workers' writes after that may be
lost (an ack, a stage's bookkeeping), and at-least-once delivery with idempotent stages must absorb it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from engram_api.errors import WaitTimeoutError
from engram_api.models import Receipt
from engram_workers.celery_config import redelivery_bound_s
from engram_workers.maintenance.redeliver import resend_lost
from engram_workers.services.redis_server import SENTINEL_MASTER, RedisServer
from tests.support.operator_processes import wait_until
from tests.support.stack import SETTLE_S, Stack, engram_stack

# Three Redis processes, two workers, a failover, and up to a redelivery bound for what the kill cut off.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PASSWORD = "failover-secret"
CITIES = ("Lisbon", "Porto", "Braga", "Faro", "Evora", "Coimbra")
PER_PHASE = 6


def _offset(server: redis.Redis, field: str) -> int:
    return int(server.info("replication")[field])


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, RedisServer]]:
    """A primary, a replica of it and a Sentinel watching them, the Sentinel knowing the replica."""
    with (
        RedisServer(data_dir=tmp_path / "primary", appendonly=True, password=PASSWORD) as primary,
        RedisServer(data_dir=tmp_path / "replica", appendonly=True, password=PASSWORD, replica_of=primary) as replica,
        RedisServer(data_dir=tmp_path / "sentinel", appendonly=False, sentinel_of=primary) as watcher,
    ):  # fmt: skip
        sentinel = redis.Redis(port=watcher.port, decode_responses=True)
        # The Sentinel learns of replicas from the primary's INFO (every 10 s): no failover without one.
        wait_until(
            lambda: any("s_down" not in r["flags"] for r in sentinel.sentinel_slaves(SENTINEL_MASTER)),
            timeout=60,
            what="the Sentinel to know the replica",
        )
        yield primary, replica, watcher


def _promoted(sentinel: redis.Redis, replica: RedisServer) -> bool:
    """The Sentinel names the replica as the primary and has finished the failover (what clients ask it)."""
    state = sentinel.sentinel_master(SENTINEL_MASTER)
    return int(state["port"]) == replica.port and state["is_master"] and not state["is_sdown"] and not state["is_odown"]


def _enqueue(stack: Stack, phase: str) -> list[Receipt]:
    return [
        stack.client.enqueue(
            f"{phase}_{i}_{uuid.uuid4().hex[:6]}", f"I live in {CITIES[i]}.", timestamp=datetime(2024, 5, 1, tzinfo=UTC)
        )
        for i in range(PER_PHASE)
    ]


def test_a_failover_loses_no_message_and_applies_none_twice(
    topology: tuple[RedisServer, RedisServer, RedisServer], tmp_path: Path
) -> None:
    primary, replica, watcher = topology
    sentinel = redis.Redis(port=watcher.port, decode_responses=True)
    with engram_stack(redis_url=watcher.url, data_dir=tmp_path / "stack", neo4j_uri=None, llm_url=None) as stack:
        before = _enqueue(stack, "before")
        assert all(r.message_id in stack.client.wait(r, timeout=SETTLE_S).applied for r in before)

        # In flight at the kill: enqueued (and on the replica), not yet applied.
        during = _enqueue(stack, "during")
        on_primary = redis.Redis(port=primary.port, password=PASSWORD)
        target = _offset(on_primary, "master_repl_offset")
        on_replica = redis.Redis(port=replica.port, password=PASSWORD)
        wait_until(lambda: _offset(on_replica, "slave_repl_offset") >= target, timeout=30, what="the replica")
        primary.kill()
        wait_until(lambda: _promoted(sentinel, replica), timeout=90, what="the Sentinel to promote the replica")

        # The producer goes on through the same URL, to the new primary.
        after = _enqueue(stack, "after")
        receipts = before + during + after
        # Held messages of the workers' broken connections come back within the redelivery bound; a task the
        # kill lost between its fetch and its unacked record is the redelivery sweep's (Beat runs it).
        resent: list[str] = []
        try:
            result = stack.client.wait(receipts, timeout=redelivery_bound_s(stack.settings) + 60)
        except WaitTimeoutError:
            resent = resend_lost(stack.settings, stack.env["REDIS_URL"], older_than_s=0).resent
            result = stack.client.wait(receipts, timeout=SETTLE_S)
        print(f"failover: {len(receipts)} messages, {len(resent)} re-sent by the redelivery sweep: {resent}")
        assert result.dead_lettered == [] and result.pending == [], (result, resent)
        assert sorted(result.applied) == sorted(r.message_id for r in receipts)

        # Each message applied once: one episode per user, and as many facts as a user applied before the kill.
        facts = {stack.client.stats(r.user_id).facts for r in before}
        assert len(facts) == 1 and facts != {0}
        for r in receipts:
            stats = stack.client.stats(r.user_id)
            assert (stats.episodes, stats.facts) == (1, *facts), r.user_id
        # The reader follows the new primary too (its stamps and caches live there).
        for i, r in enumerate(after):
            assert CITIES[i] in stack.client.get_context(r.user_id, "where do I live?")
        assert redis.Redis(port=replica.port, password=PASSWORD).info("replication")["role"] == "master"
