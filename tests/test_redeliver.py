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

from engram_api import keys
from engram_api.models import MessageState
from engram_workers.celery_config import make_celery
from engram_workers.maintenance import redeliver_stuck
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.operator_processes import wait_until
from tests.support.stack import SETTLE_S, engram_stack


def test_only_old_stuck_messages_are_resent_once(redis_client, user_id):
    now = time.time()
    redis_client.hset(keys.status(user_id, "old:q"), mapping={"state": "queued", "enqueued_at": now - 120})
    redis_client.hset(keys.status(user_id, "old-x"), mapping={"state": "extracted", "extracted_at": now - 120})
    redis_client.hset(keys.status(user_id, "fresh"), mapping={"state": "queued", "enqueued_at": now - 5})
    redis_client.hset(keys.status(user_id, "done"), mapping={"state": "applied", "enqueued_at": now - 999})
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

    sent.clear()
    redeliver_stuck(client=redis_client, send=send, older_than_s=60, now=now + 1)
    assert [s for s in sent if s[1][0] == user_id] == []  # re-stamped: not sent again at once


def test_old_messages_still_waiting_in_the_broker_are_left_alone(redis_url: str, tmp_path: Path) -> None:
    """A backlog older than the threshold is not lost: re-sending it would double the queue at every sweep.
    Only a task that is in no queue and not reserved (kombu's ``unacked`` hash) is re-sent."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        client = stack.client
        ids = [client.enqueue("bl_user", f"I like topic {i}.", message_id=f"m{i}").message_id for i in range(3)]
        stale = str(time.time() - 600)
        for message_id in ids:
            client.redis.hset(keys.status("bl_user", message_id), "enqueued_at", stale)
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
        stale = str(time.time() - 600)
        client.redis.hset(keys.status("rd_user", "lost-queued"), "enqueued_at", stale)
        client.redis.hset(
            keys.status("rd_user", "lost-extracted"),
            mapping={"state": MessageState.EXTRACTED.value, "extracted_at": stale},
        )
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
