"""Erasure is final, dead letters are bounded, nothing passes silently (issue 12: findings 3, 4, 9, 10, 11, 13).

Real worker processes on the real Redis and Neo4j; only the LLM is the in-process stand-in, which lets a
test hold an extraction in flight while the message is forgotten.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from engram_api import MemoryClient, keys
from engram_api.errors import InvalidInputError, NotFoundError
from engram_api.models import DeadLetter, StageOutcome, utcnow
from engram_api.settings import Settings
from engram_testing.llm_standin import Reply
from engram_workers.maintenance import redeliver_stuck
from engram_workers.stages.common import keep_alive
from engram_workers.stages.extract import run_extract
from tests.support.extractions import lives_in, message_text
from tests.support.stack import engram_stack

LEAKED_KEY = "sk-live-Zq8vN2rT5wX1yB4c"

# Worker start-up and the first model load are slow on a shared machine; the waits inside have bounds.
pytestmark = pytest.mark.timeout(900)


def scripted(request: dict) -> Reply:
    text = message_text(request)
    if text.startswith("always-fails"):
        return Reply.error(500)
    if text.startswith("bad-key"):
        return Reply.error(401, f"Incorrect API key provided: {LEAKED_KEY}. Find your key at ...")
    return Reply.json(lives_in("Lisbon"))


@pytest.fixture(scope="module")
def stack(redis_url, neo4j_uri, llm_server, tmp_path_factory):
    llm_server.script(scripted)
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("hardening"),
        neo4j_uri=neo4j_uri,
        llm_url=llm_server.url,
        llm_timeout_s=60,  # a model answer can be held back until forget has finished
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _script(llm_server):
    llm_server.script(scripted)


def uid() -> str:
    return f"u_{uuid.uuid4().hex[:10]}"


def traces(client: MemoryClient, user: str, mid: str) -> dict[str, object]:
    """Every place a message can live in Redis, and whether it is still there."""
    r = client.redis
    return {
        "payload": r.exists(keys.message_payload(user, mid)),
        "extraction": r.exists(keys.extraction(user, mid)),
        "status": r.exists(keys.status(user, mid)),
        "deliveries": sum(r.exists(keys.deliveries(user, mid, s)) for s in keys.STAGES),
        "dead_letter": bool(r.exists(keys.dead_letter(user, mid))),
    }


NOTHING = {"payload": 0, "extraction": 0, "status": 0, "deliveries": 0, "dead_letter": False}


# ------------------------------------------------------------------------------------------ finding 3
def test_forget_removes_the_dead_letter_and_status_and_replay_cannot_bring_it_back(stack, llm_server):
    client, user = stack.client, uid()
    dead = client.enqueue(user, "always-fails: I live in Oslo", message_id="m-dead")
    applied = client.enqueue(user, "I live in Lisbon", message_id="m-ok")
    result = client.wait([dead, applied], timeout=300)
    assert result.dead_lettered == ["m-dead"] and result.applied == ["m-ok"]
    # Finding 9: every LLM call carries a completion-token bound.
    assert {r.body.get("max_tokens") for r in llm_server.requests} == {stack.settings.llm_max_output_tokens}

    client.forget(user, "m-dead")
    client.forget(user, "m-ok")

    assert traces(client, user, "m-dead") == NOTHING
    assert traces(client, user, "m-ok") == NOTHING
    assert client.dead_letters(user) == []
    with pytest.raises(NotFoundError):  # its dead letter is gone with it
        client.replay(user, "m-dead")
    assert client.stats(user).facts == 0


@pytest.mark.parametrize("how", ["forget", "forget_user"])
def test_an_extraction_in_flight_during_forget_writes_nothing_back(stack, llm_server, how):
    client, user = stack.client, uid()
    client.recall(user, "warm up the reader")  # model loaded before the race, not during it
    entered, release = threading.Event(), threading.Event()

    def slow(request: dict) -> Reply:
        if message_text(request).startswith("in-flight"):
            entered.set()
            release.wait(30)  # the answer comes only once forget has returned (LLM timeout: 60 s)
        return Reply.json(lives_in("Lisbon"))

    llm_server.script(slow)
    receipt = client.enqueue(user, "in-flight: I live in Lisbon", message_id="m-race")
    assert entered.wait(300), "the extract stage never called the model"
    if how == "forget":
        client.forget(user, "m-race")
    else:
        client.forget_user(user)
    release.set()
    stack.workers[0].wait_for_log(f"{receipt.task_id}] succeeded", timeout=300)

    assert traces(client, user, "m-race") == NOTHING
    assert client.dead_letters(user) == []
    assert client.stats(user).facts == 0
    assert client.recall(user, "where does the user live?").items == []


# ------------------------------------------------------------------------------------------ finding 4
def test_dead_letters_past_the_retention_are_pruned_by_the_sweep(stack):
    client, user = stack.client, uid()
    assert Settings().dead_letter_retention_days == 30
    now = utcnow()
    for mid, age in (("m-old", timedelta(days=31)), ("m-recent", timedelta(days=29))):
        letter = DeadLetter(user_id=user, message_id=mid, stage="extract", reason="test", failed_at=now - age)
        assert client.producer.ledger.dead_letter(letter)

    report = redeliver_stuck(
        client=client.redis, send=lambda *a: None, older_than_s=60, dead_letter_retention=timedelta(days=30)
    )

    assert report.pruned_dead_letters >= 1
    assert [d.message_id for d in client.dead_letters(user)] == ["m-recent"]


# ----------------------------------------------------------------------------------------- finding 10
def test_a_payload_that_expired_while_waiting_is_dead_lettered_with_that_reason(stack):
    client, user = stack.client, uid()
    ctx = stack.worker_resources()
    client.redis.hset(keys.status(user, "m-expired"), mapping={"state": "queued", "enqueued_at": "0"})

    outcome = run_extract(ctx, user, "m-expired")

    assert outcome.outcome is StageOutcome.DEAD_LETTERED
    [letter] = client.dead_letters(user)
    assert letter.message_id == "m-expired" and "payload expired" in letter.reason
    assert client.producer.states([(user, "m-expired")]) == ["dead"]


def test_a_retried_message_keeps_its_payload_for_another_full_ttl(stack):
    client, user = stack.client, uid()
    ctx = stack.worker_resources()
    client.redis.set(keys.message_payload(user, "m-wait"), "{}", ex=5)
    client.redis.hset(keys.status(user, "m-wait"), "state", "queued")
    client.redis.expire(keys.status(user, "m-wait"), 5)

    keep_alive(ctx, user, "m-wait")

    ttl = stack.settings.status_ttl_s
    assert client.redis.ttl(keys.message_payload(user, "m-wait")) > ttl - 60
    assert client.redis.ttl(keys.status(user, "m-wait")) > ttl - 60


# ----------------------------------------------------------------------------------------- finding 11
def test_dead_letter_methods_reject_ids_that_would_reach_another_users_letter(stack):
    client, user = stack.client, uid()
    letter = DeadLetter(user_id=user, message_id="b:c", stage="extract", reason="test", envelope=None)
    client.producer.ledger.dead_letter(letter)

    for call in (client.replay, client.drop_dead_letter):
        with pytest.raises(InvalidInputError) as err:
            call(f"{user}:b", "c")
        assert err.value.field == "user_id"
    with pytest.raises(InvalidInputError):
        client.dead_letters("not a user")

    assert [d.message_id for d in client.dead_letters(user)] == ["b:c"]


# ----------------------------------------------------------------------------------------- finding 13
def test_credentials_never_reach_health_reports_dead_letters_or_logs(stack):
    password = "hunter2-Secret-Pw"
    base = stack.env["REDIS_URL"]
    with_password = base.replace("redis://", f"redis://default:{password}@", 1)
    with MemoryClient(settings=stack.settings, redis_url=with_password) as other:
        report = other.health()
    assert report.checks["redis"].ok
    assert password not in report.model_dump_json()

    client, user = stack.client, uid()
    receipt = client.enqueue(user, "bad-key: I live in Oslo", message_id="m-key")
    assert client.wait([receipt], timeout=300).dead_lettered == ["m-key"]
    [letter] = client.dead_letters(user)
    assert "Incorrect API key" in letter.reason
    assert LEAKED_KEY not in letter.model_dump_json()
    assert LEAKED_KEY not in client.redis.hget(keys.status(user, "m-key"), "reason")
    for worker in stack.workers:
        assert LEAKED_KEY not in worker.log_path.read_text(errors="replace")
