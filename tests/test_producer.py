"""The producer on a real Redis: one atomic script per message, Celery's own wire format, idempotent."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engram_api import InvalidInputError, MemoryClient, Receipt, Settings, StoreUnavailableError, WaitTimeoutError, keys
from engram_api.ledger.wire import task_message
from engram_api.models import Envelope, MessageState
from engram_workers.services import RedisServer
from tests.support.stack import engram_stack


@pytest.fixture
def client(redis_url, tmp_path):
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as s:
        yield s.client


def _decoded(raw: str) -> dict:
    msg = json.loads(raw)
    msg["body"] = json.loads(base64.b64decode(msg["body"]))
    for volatile in ("delivery_tag", "reply_to"):
        msg["properties"].pop(volatile)
    for volatile in ("origin", "ignore_result"):
        msg["headers"].pop(volatile)
    # The publish time differs between the two; that both carry one is what matters (the lag metric reads it).
    assert isinstance(msg["headers"].pop(keys.SENT_AT_HEADER), float)
    return msg


def test_task_message_matches_what_celery_itself_publishes(client):
    from engram_workers.celery_config import make_celery

    app = make_celery(client.settings, client.redis_url)
    app.send_task(keys.EXTRACT_TASK, args=("u1", "m1"), task_id="tid-1", queue=keys.EXTRACT_QUEUE,
                  routing_key=keys.EXTRACT_QUEUE)  # fmt: skip
    celery_made = client.redis.rpop(keys.EXTRACT_QUEUE)
    ours = task_message(keys.EXTRACT_TASK, "tid-1", ("u1", "m1"), keys.EXTRACT_QUEUE, time.time())
    assert _decoded(ours) == _decoded(celery_made)


def test_enqueue_records_payload_status_and_task_in_one_go(client):
    receipt = client.enqueue("alice", "I live in Tampa.", message_id="m-1",
                             timestamp=datetime(2024, 1, 1, tzinfo=UTC), metadata={"channel": "web"})  # fmt: skip
    assert not receipt.duplicate
    status = client.redis.hgetall(keys.status("alice", "m-1"))
    assert status["state"] == "queued" and status["task_id"] == receipt.task_id
    payload = json.loads(client.redis.get(keys.message_payload("alice", "m-1")))
    assert payload["messages"] == [{"role": "user", "content": "I live in Tampa."}]
    assert payload["metadata"] == {"channel": "web"}
    queued = [json.loads(m) for m in client.redis.lrange(keys.EXTRACT_QUEUE, 0, -1)]
    assert [m["headers"]["id"] for m in queued] == [receipt.task_id]
    assert queued[0]["headers"]["argsrepr"] == "('alice', 'm-1')"  # ids only: no text in Flower


def test_the_same_message_id_twice_is_one_task(client):
    first = client.enqueue("alice", "I live in Tampa.", message_id="dup-1")
    second = client.enqueue("alice", "I live in Tampa (again).", message_id="dup-1")
    assert second.duplicate and second.task_id == first.task_id
    assert client.redis.llen(keys.EXTRACT_QUEUE) == 1
    other_user = client.enqueue("bob", "I live in Tampa.", message_id="dup-1")
    assert not other_user.duplicate and client.redis.llen(keys.EXTRACT_QUEUE) == 2


def test_a_bad_item_in_a_batch_enqueues_nothing(client):
    items = [{"user_id": "alice", "messages": "fine"}, {"user_id": "alice", "messages": ""}]
    with pytest.raises(InvalidInputError) as err:
        client.enqueue_many(items)
    assert err.value.field == "items[1].messages"
    assert client.redis.llen(keys.EXTRACT_QUEUE) == 0


def test_wait_without_workers_times_out_with_a_typed_error_naming_what_is_pending(client):
    receipts = [client.enqueue("alice", "I live in Tampa.", message_id=f"w-{n}") for n in range(5)]
    with pytest.raises(WaitTimeoutError) as err:
        client.wait(receipts, timeout=0.5)
    assert isinstance(err.value, TimeoutError)  # callers catching the builtin catch it too
    assert "5 of 5 messages still pending" in str(err.value) and "w-0" in str(err.value)
    assert client.redis.llen(keys.EXTRACT_QUEUE) == 5  # waiting changed nothing


def test_wait_reads_only_what_is_pending_and_keeps_what_it_saw_finished(client):
    """A poll reads the statuses still pending: one seen applied stays applied for this wait even when its
    status is gone by the next poll (expired), and the progress callback sees each poll's count."""
    receipts = [client.enqueue("alice", f"note {n}", message_id=f"p-{n}") for n in range(3)]
    status = [keys.status("alice", r.message_id) for r in receipts]
    client.redis.hset(status[0], "state", "applied")
    client.redis.hset(status[1], "state", "dead")
    polls: list[tuple[int, int]] = []

    def progress(finished: int, total: int) -> None:
        polls.append((finished, total))
        if len(polls) == 1:
            client.redis.delete(status[0], status[1])  # a re-read would now see both pending
        elif len(polls) == 3:
            client.redis.hset(status[2], "state", "applied")

    result = client.producer.wait(receipts, timeout=30, on_progress=progress)
    assert result.applied == ["p-0", "p-2"] and result.dead_lettered == ["p-1"] and result.done
    assert polls == [(2, 3), (2, 3), (2, 3), (3, 3)]


def test_a_batch_cut_short_by_redis_is_retried_whole_and_each_message_is_queued_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis stops after two items of five are published: a typed error, the two stay queued (and are
    not lost: Redis keeps them through its restart), and the same batch sent again adds only the three
    others, the two known ids coming back as duplicates."""
    with (
        RedisServer(data_dir=tmp_path / "redis", appendonly=True) as server,
        MemoryClient(settings=Settings(data_dir=tmp_path / "data"), redis_url=server.url) as client,
    ):
        items = [{"user_id": "batcher", "messages": f"message {i}", "message_id": f"b{i}"} for i in range(5)]
        submit, published = client.producer.submit, []

        def redis_stops_after_two(envelope: Envelope) -> Receipt:
            if len(published) == 2:
                server.stop()  # a real stop, between two publishes of one batch
            published.append(submit(envelope))
            return published[-1]

        monkeypatch.setattr(client.producer, "submit", redis_stops_after_two)
        with pytest.raises(StoreUnavailableError, match="Redis unavailable"):
            client.enqueue_many(items)
        monkeypatch.undo()
        server.start()
        assert client.redis.llen(keys.EXTRACT_QUEUE) == 2

        receipts = client.enqueue_many(items)
        assert [(r.message_id, r.duplicate) for r in receipts] == [(f"b{i}", i < 2) for i in range(5)]
        assert client.redis.llen(keys.EXTRACT_QUEUE) == 5
        queued = [json.loads(m)["headers"]["argsrepr"] for m in client.redis.lrange(keys.EXTRACT_QUEUE, 0, -1)]
        assert sorted(queued) == sorted(repr(("batcher", f"b{i}")) for i in range(5))
        assert client.producer.states([("batcher", f"b{i}") for i in range(5)]) == [MessageState.QUEUED] * 5
