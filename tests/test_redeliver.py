"""The redelivery sweep re-sends only messages stuck between stages past the threshold: the selection on
its own, then the real Beat task on a real fleet bringing lost messages home."""

from __future__ import annotations

import ast
import base64
import json
import re
import time
from pathlib import Path

import pytest
import redis

from engram_api import keys
from engram_api.models import MessageState
from engram_workers.celery_config import make_celery
from engram_workers.maintenance import redeliver, redeliver_stuck
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.operator_processes import wait_until
from tests.support.stack import SETTLE_S, engram_stack


def filed(client: redis.Redis, user_id: str, message_id: str, since: float, **status: object) -> None:
    """A status written by hand, filed in the in-flight index as the lifecycle scripts would file it."""
    client.hset(keys.status(user_id, message_id), mapping=status)
    client.zadd(keys.in_flight(), {keys.message_ref(user_id, message_id): since})


def test_only_old_stuck_messages_are_resent_once(redis_client, user_id):
    now = time.time()
    filed(redis_client, user_id, "old:q", now - 120, state="queued", enqueued_at=now - 120)
    filed(redis_client, user_id, "old-x", now - 120, state="extracted", extracted_at=now - 120)
    filed(redis_client, user_id, "fresh", now - 5, state="queued", enqueued_at=now - 5)
    # A member whose status says applied (the index lost track of it) is dropped, not re-sent.
    filed(redis_client, user_id, "done", now - 999, state="applied", enqueued_at=now - 999)
    sent: list[tuple[str, tuple[str, ...]]] = []

    def send(task, args):
        sent.append((task, args))

    report = redeliver_stuck(client=redis_client, send=send, older_than_s=60, now=now)
    mine = sorted(s for s in sent if s[1][0] == user_id)
    assert mine == [
        (keys.APPLY_TASK, (user_id, "old-x")),
        (keys.EXTRACT_TASK, (user_id, "old:q")),  # message ids may contain ':'
    ]
    assert {f"{user_id}:old:q", f"{user_id}:old-x"} <= set(report.resent)
    assert redis_client.zscore(keys.in_flight(), keys.message_ref(user_id, "done")) is None
    assert redis_client.zscore(keys.in_flight(), keys.message_ref(user_id, "old:q")) == now  # re-stamped

    sent.clear()
    redeliver_stuck(client=redis_client, send=send, older_than_s=60, now=now + 1)
    assert [s for s in sent if s[1][0] == user_id] == []  # re-stamped: not sent again at once


def test_a_client_that_does_not_decode_replies_finds_the_same_stuck_messages(redis_url, user_id):
    """The sweep reads statuses as bytes on such a client: a stuck message is still re-sent, not taken for
    a settled one (and the index keeps it)."""
    raw = redis.Redis.from_url(redis_url)
    now = time.time()
    filed(raw, user_id, "old", now - 120, state="queued", enqueued_at=now - 120)
    sent: list[tuple[str, tuple[str, ...]]] = []
    redeliver_stuck(client=raw, send=lambda t, a: sent.append((t, a)), older_than_s=60, now=now)
    assert [s for s in sent if s[1][0] == user_id] == [(keys.EXTRACT_TASK, (user_id, "old"))]
    assert raw.zscore(keys.in_flight(), keys.message_ref(user_id, "old")) == now
    raw.close()


def test_old_messages_still_waiting_in_the_broker_are_left_alone(redis_url: str, tmp_path: Path) -> None:
    """A backlog older than the threshold is not lost: re-sending it would double the queue at every sweep.
    Only a task that is in no queue and not reserved (kombu's ``unacked`` hash) is re-sent."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        client = stack.client
        ids = [client.enqueue("bl_user", f"I like topic {i}.", message_id=f"m{i}").message_id for i in range(3)]
        stale = time.time() - 600
        for message_id in ids:
            client.producer.ledger.in_flight.restamp("bl_user", message_id, MessageState.QUEUED, stale)
        sent: list[tuple[str, tuple[str, ...]]] = []

        def sweep() -> tuple[list[tuple[str, tuple[str, ...]]], int]:
            sent.clear()
            report = redeliver_stuck(client=client.redis, send=lambda t, a: sent.append((t, a)), older_than_s=300)
            return sorted(sent), report.waiting

        assert sweep() == ([], 3)  # all three wait in the extract queue
        # A worker reserves one the way kombu does: off the list, into the unacked hash.
        reserved = client.redis.rpop(keys.EXTRACT_QUEUE)
        client.redis.hset("unacked", "tag-1", json.dumps([json.loads(reserved), "", keys.EXTRACT_QUEUE]))
        assert sweep() == ([], 3)
        # The worker dies between kombu's two round trips: the task is in neither place, so it is re-sent.
        client.redis.hdel("unacked", "tag-1")
        assert sweep() == ([(keys.EXTRACT_TASK, ("bl_user", _message_id_of(reserved)))], 2)
        assert sweep() == ([], 2)  # re-stamped: the next sweep waits a full period before sending it again


@pytest.mark.parametrize("moved", [True, False], ids=["in-transit", "lost"])
def test_a_task_missing_at_one_read_is_looked_for_again_before_it_is_re_sent(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved: bool
) -> None:
    """A task the broker read missed because it was moving (here: off its queue at the first read, back on it
    by the confirming read, as a retry's re-published message or a restored one is) is not re-sent; one
    still missing is."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        client = stack.client
        client.enqueue("transit_user", "I like chess.", message_id="m1")
        raw = client.redis.rpop(keys.EXTRACT_QUEUE)  # in a consumer's hands, not yet recorded unacked
        client.producer.ledger.in_flight.restamp("transit_user", "m1", MessageState.QUEUED, time.time() - 600)
        monkeypatch.setattr(redeliver.time, "sleep", lambda _: moved and client.redis.lpush(keys.EXTRACT_QUEUE, raw))
        sent: list[tuple[str, tuple[str, ...]]] = []
        report = redeliver_stuck(client=client.redis, send=lambda t, a: sent.append((t, a)), older_than_s=300)
        assert (sent, report.waiting) == (([], 1) if moved else ([(keys.EXTRACT_TASK, ("transit_user", "m1"))], 0))


def test_the_sweep_reads_only_the_overdue_messages_not_every_status(redis_url: str, tmp_path: Path) -> None:
    """Issue 45: the sweep's reads follow what is overdue. Applied and fresh messages (their statuses kept
    for days) cost it nothing: no SCAN, and one status read per overdue message."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        client, ledger = stack.client, stack.client.producer.ledger
        user = "od_user"
        for i in range(60):
            client.enqueue(user, f"I like topic {i}.", message_id=f"m{i}")
        client.redis.delete(keys.EXTRACT_QUEUE)  # their task messages are lost: an overdue one is re-sent
        for i in range(40):  # applied: out of the index, their statuses kept
            assert ledger.set_state(user, f"m{i}", MessageState.APPLIED, fields={"version": "1"})
        overdue = [f"m{i}" for i in range(40, 45)]  # 15 fresh ones stay queued
        for message_id in overdue:
            ledger.in_flight.restamp(user, message_id, MessageState.QUEUED, time.time() - 600)
        now = time.time()
        # Every member waiting since before the threshold: these five, and any an earlier test left.
        due = client.redis.zcount(keys.in_flight(), "-inf", now - 300)
        assert due >= len(overdue) and client.redis.zcard(keys.in_flight()) >= due + 15

        before = client.redis.info("commandstats")
        sent: list[tuple[str, tuple[str, ...]]] = []
        report = redeliver_stuck(client=client.redis, send=lambda t, a: sent.append((t, a)), older_than_s=300, now=now)
        after = client.redis.info("commandstats")

        def calls(command: str) -> int:
            return int(after.get(f"cmdstat_{command}", {}).get("calls", 0)) - int(
                before.get(f"cmdstat_{command}", {}).get("calls", 0)
            )

        assert sorted(args[1] for _, args in sent if args[0] == user) == overdue and report.scanned == due
        # 60 statuses of this user, 5 of them read, twice: once more to confirm the lost ones before re-sending
        assert calls("scan") == 0 and calls("hmget") == 2 * due


def _message_id_of(message: str) -> str:
    body = json.loads(base64.b64decode(json.loads(message)["body"]))
    return body[0][1]


def _task_results(log: Path, task: str) -> list[str]:
    """What the worker logged as the return value of each successful ``task`` run."""
    done = re.compile(rf"Task {re.escape(task)}\[[0-9a-f-]+\] succeeded in \S+s: (.*)$")
    return [m.group(1) for line in log.read_text().splitlines() if (m := done.search(line))]


@pytest.mark.slow
def test_the_sweep_task_brings_lost_messages_home(redis_url: str, tmp_path: Path) -> None:
    """Two messages whose task messages vanished from the broker (celery/celery#7950): one was waiting for
    extraction, one had been extracted but its extraction was lost too, so apply must send it back to
    extract. The real redelivery task, run by a real worker, gets both applied."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        client = stack.client
        queued = client.enqueue("rd_user", "I live in Oslo.", message_id="lost-queued")
        extracted = client.enqueue("rd_user", "I like chess.", message_id="lost-extracted")
        client.redis.delete(keys.EXTRACT_QUEUE)  # both task messages are gone
        stale = time.time() - 600
        in_flight = client.producer.ledger.in_flight
        in_flight.restamp("rd_user", "lost-queued", MessageState.QUEUED, stale)
        client.redis.hset(keys.status("rd_user", "lost-extracted"), "state", MessageState.EXTRACTED.value)
        in_flight.restamp("rd_user", "lost-extracted", MessageState.EXTRACTED, stale)
        stack.start_worker("extract", EXTRACT_WORKER, concurrency=2)
        apply = stack.start_worker("apply", APPLY_WORKER)  # it also consumes the maintenance queue

        celery = make_celery(stack.settings, stack.env["REDIS_URL"])
        celery.send_task(
            keys.REDELIVER_TASK, kwargs={"older_than_s": 300}, queue=keys.MAINTENANCE_QUEUE,
            routing_key=keys.MAINTENANCE_QUEUE,
        )  # fmt: skip
        result = client.wait([queued, extracted], timeout=SETTLE_S)
        assert sorted(result.applied) == ["lost-extracted", "lost-queued"]
        assert [f.statement for f in client.graph.history("rd_user", "user", "LIVES_IN")] == ["User lives in Oslo"]

        (report,) = wait_until(
            lambda: _task_results(apply.log_path, keys.REDELIVER_TASK), timeout=30, what="the sweep's report"
        )
        resent = ast.literal_eval(report)["resent"]  # Celery logs the returned dict's repr
        assert sorted(resent) == ["rd_user:lost-extracted", "rd_user:lost-queued"]
        applies = _task_results(apply.log_path, keys.APPLY_TASK)
        assert "'sent-back: extraction missing'" in applies, applies
