"""The message ledger on a real Redis: named KEYS/ARGV reach the Lua by name, a script survives a server
that forgot it, its call is packed byte for byte as redis-py packs it, and each transition of ``MessageLedger`` writes what its docstring says, atomically
refusing to write for a forgotten message."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import NamedTuple

import pytest
import redis

from engram_api import keys
from engram_api.ledger import MessageLedger
from engram_api.ledger.lua import packed_evalsha
from engram_api.ledger.scripts import LuaScript, NoArgs
from engram_api.ledger.wire import task_ref
from engram_api.models import DeadLetter, MessageState
from engram_api.producer import build_envelope
from engram_api.settings import Settings

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)


class PairKeys(NamedTuple):
    first: str
    second: str


class PairArgs(NamedTuple):
    left: str
    right: str


ECHO = LuaScript(
    PairKeys,
    PairArgs,
    "return {K.first, K.second, A.left, A.right, unpack(ARGV, REST)}",
    rest="anything",
)


def test_a_script_reads_its_keys_and_args_by_name_and_survives_a_script_flush(redis_client: redis.Redis) -> None:
    call = (PairKeys(first="k1", second="k2"), PairArgs(left="a", right="b"))
    assert ECHO(redis_client, *call, "x", "y") == ["k1", "k2", "a", "b", "x", "y"]
    redis_client.script_flush()  # a restarted server: the next call loads it again
    assert ECHO(redis_client, *call) == ["k1", "k2", "a", "b"]


def test_a_call_with_another_scripts_tuples_is_refused_before_redis() -> None:
    nowhere = redis.Redis(port=1)  # nothing listens: a call that reached Redis would raise ConnectionError
    with pytest.raises(TypeError, match="PairKeys and PairArgs"):
        ECHO(nowhere, PairArgs(left="k1", right="k2"), PairArgs(left="a", right="b"))  # type: ignore[arg-type]
    no_rest = LuaScript(PairKeys, NoArgs, "return K.first")
    with pytest.raises(TypeError, match="no variable arguments"):
        no_rest(nowhere, PairKeys(first="k", second="k"), NoArgs(), "extra")
    with pytest.raises(ValueError, match="plain Lua name"):
        LuaScript(NamedTuple("Until", [("until", str)]), NoArgs, "return 0")  # a Lua keyword


def test_a_call_is_packed_as_redis_py_packs_it_and_keeps_the_pools_semantics(
    redis_client: redis.Redis, redis_url: str
) -> None:
    flat = ("k1", "k2", "Zoë ☕ \r\n", 604_800, 1_733_500_000.123456, -3, 0.1, b"\x00raw")
    assert packed_evalsha(ECHO.sha, 2, flat) == b"".join(redis.Connection().pack_command("EVALSHA", ECHO.sha, 2, *flat))
    assert packed_evalsha(ECHO.sha, 2, ("k1", "k2", True)) is None  # redis-py's own path refuses it
    call = (PairKeys(first="k1", second="k2"), PairArgs(left="Zoë ☕", right="b"))
    with pytest.raises(redis.DataError):
        ECHO(redis_client, call[0], PairArgs(left=True, right="b"))  # type: ignore[arg-type]
    failing = LuaScript(PairKeys, NoArgs, "return redis.error_reply('refused ' .. K.first)")
    with pytest.raises(redis.ResponseError, match="refused k1"):  # an error reply is redis-py's exception
        failing(redis_client, call[0], NoArgs())
    pipe = redis_client.pipeline()  # a pipeline queues the call (redis-py's path), and runs it with the rest
    assert ECHO(pipe, *call, "x") is pipe and pipe.execute() == [["k1", "k2", "Zoë ☕", "b", "x"]]

    pool = redis_client.connection_pool
    conn = pool.get_connection()
    conn.send_command("CLIENT", "ID")
    own = conn.read_response()
    pool.release(conn)
    with redis.Redis.from_url(redis_url) as other:
        assert other.client_kill_filter(_id=own) == 1  # the pooled connection dies between two calls
    assert ECHO(redis_client, *call) == ["k1", "k2", "Zoë ☕", "b"]  # a fresh connection answers
    assert not pool._in_use_connections  # every call gave its connection back, the failed ones too


@pytest.fixture
def ledger(redis_client: redis.Redis) -> MessageLedger:
    return MessageLedger(redis_client, status_ttl_s=600)


def test_a_message_walks_queued_extracted_applied(ledger: MessageLedger, redis_client: redis.Redis) -> None:
    user = f"lg_{uuid.uuid4().hex[:8]}"
    envelope = build_envelope(Settings(), user, "I live in Oslo.", message_id="m1", timestamp=T0)
    assert ledger.enqueue(envelope, task_id="t1", limit=10) == (None, None)
    assert ledger.enqueue(envelope, task_id="t2", limit=10).existing == "t1"  # the same id: nothing written
    queued = [task_ref(m) for m in redis_client.lrange(keys.EXTRACT_QUEUE, 0, -1)]
    assert queued.count((keys.EXTRACT_TASK, f"{user}:m1")) == 1
    assert ledger.backlogs([user]) == [1] and ledger.states([(user, "m1")]) == [MessageState.QUEUED]

    entered = ledger.enter(user, "m1", "extract")
    assert entered == (1, "queued", False, False)
    ledger.leave(user, "m1", "extract")
    assert ledger.enter(user, "m1", "extract") == (1, "queued", False, True)  # back at 0, an earlier start

    assert ledger.set_state(user, "m1", MessageState.EXTRACTED, extraction='{"x": 1}', event_time=T0.timestamp())
    assert redis_client.zscore(keys.ready(user), "m1") == T0.timestamp()
    assert ledger.read(user, "m1") == (
        False,
        "extracted",
        envelope.model_dump_json(exclude_none=True),
        '{"x": 1}',
        None,
    )
    assert ledger.payloads(user, ["m1", "gone"]) == [(ledger.payload(user, "m1"), '{"x": 1}'), (None, None)]
    assert ledger.claim_ready(user, "other", 5) == ["m1"] and redis_client.zcard(keys.ready(user)) == 0

    assert ledger.count(user, "m1", "store_attempts") == 1 and ledger.count(user, "m1", "store_attempts") == 2
    assert ledger.set_state(user, "m1", MessageState.APPLIED, fields={"version": "3"})
    assert ledger.status(user, "m1")["version"] == "3" and ledger.enter(user, "m1", "apply").started == 0
    assert ledger.read(user, "m1") == (False, "applied", None, None, None)
    assert ledger.backlogs([user]) == [0] and ledger.knows(user, "m1")


def test_a_full_backlog_refuses_and_a_forgotten_message_takes_no_write(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user = f"lg_{uuid.uuid4().hex[:8]}"
    first, second = (build_envelope(Settings(), user, "Hi.", message_id=m, timestamp=T0) for m in ("m1", "m2"))
    assert ledger.enqueue(first, task_id="t1", limit=1) == (None, None)
    assert ledger.enqueue(second, task_id="t2", limit=1) == (None, 1)
    assert not redis_client.exists(keys.message_payload(user, "m2"), keys.status(user, "m2"))

    ledger.forget(user, "m1")
    assert ledger.is_forgotten(user, "m1") and not ledger.knows(user, "m1")
    assert not ledger.set_state(user, "m1", MessageState.EXTRACTED, extraction="{}")
    letter = DeadLetter(user_id=user, message_id="m1", stage="extract", reason="boom", envelope=first)
    assert not ledger.dead_letter(letter)
    assert ledger.enter(user, "m1", "extract") == (0, None, True, False)
    assert not redis_client.exists(keys.extraction(user, "m1"), keys.status(user, "m1"))
    assert ledger.dead_letters.list(user) == [] and ledger.backlogs([user]) == [0]


def test_a_dead_letter_finishes_the_message_and_a_replay_starts_it_again(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user = f"lg_{uuid.uuid4().hex[:8]}"
    envelope = build_envelope(Settings(), user, "Hi.", message_id="m1", timestamp=T0)
    ledger.enqueue(envelope, task_id="t1", limit=5)
    ledger.enter(user, "m1", "extract")
    letter = DeadLetter(user_id=user, message_id="m1", stage="extract", reason="boom", envelope=envelope)
    assert ledger.dead_letter(letter)
    assert ledger.states([(user, "m1")]) == ["dead"] and ledger.payload(user, "m1") is None
    assert ledger.backlogs([user]) == [0] and [d.message_id for d in ledger.dead_letters.list(user)] == ["m1"]

    ledger.replaying(user, "m1")
    assert not redis_client.exists(keys.status(user, "m1"), keys.deliveries(user, "m1", "extract"))
    assert ledger.enqueue(envelope, task_id="t2", limit=5) == (None, None)  # a new message now
    assert json.loads(ledger.payload(user, "m1") or "{}")["message_id"] == "m1"
    assert ledger.forget_user(user) == 1 and ledger.dead_letters.list(user) == []


def test_the_in_flight_index_follows_the_status_it_files(ledger: MessageLedger, redis_client: redis.Redis) -> None:
    user = f"lg_{uuid.uuid4().hex[:8]}"
    refs = {m: keys.message_ref(user, m) for m in ("m1", "m2", "m3", "m4")}

    def since(message_id: str) -> float | None:
        return redis_client.zscore(keys.in_flight(), refs[message_id])

    def for_apply(message_id: str) -> float | None:  # the extracted share, with the same score
        return redis_client.zscore(keys.in_flight_extracted(), refs[message_id])

    for message_id in refs:
        ledger.enqueue(build_envelope(Settings(), user, "Hi.", message_id=message_id), task_id=message_id, limit=9)
    enqueued_at = float(ledger.status(user, "m1")["enqueued_at"])
    assert since("m1") == enqueued_at and for_apply("m1") is None

    ledger.set_state(user, "m1", MessageState.EXTRACTED, extraction="{}")
    assert since("m1") == for_apply("m1") == float(ledger.status(user, "m1")["extracted_at"]) >= enqueued_at
    ledger.set_state(user, "m1", MessageState.QUEUED)  # sent back: waits since it was enqueued, as its status says
    assert since("m1") == enqueued_at and for_apply("m1") is None
    for message_id in refs:
        ledger.set_state(user, message_id, MessageState.EXTRACTED, extraction="{}")
    ledger.set_state(user, "m1", MessageState.APPLIED)
    assert ledger.dead_letter(DeadLetter(user_id=user, message_id="m2", stage="apply", reason="x"))
    ledger.forget(user, "m3")
    assert [since(m) for m in ("m1", "m2", "m3")] == [None, None, None] and since("m4") is not None
    assert [for_apply(m) for m in ("m1", "m2", "m3")] == [None, None, None] and for_apply("m4") == since("m4")

    ledger.in_flight.restamp(user, "m4", MessageState.EXTRACTED, 1000.0)
    assert since("m4") == for_apply("m4") == 1000.0 and ledger.status(user, "m4")["extracted_at"] == "1000.0"
    assert (user, "m4", MessageState.EXTRACTED, 1000.0) in ledger.in_flight.overdue(1000.0)[1]
    ledger.set_state(user, "m5", MessageState.EXTRACTED, extraction="{}")  # no enqueue: filed by its stage write
    redis_client.hdel(keys.status(user, "m5"), "state")  # a status no longer saying extracted: the sweep drops it
    refs["m5"] = keys.message_ref(user, "m5")
    ledger.in_flight.restamp(user, "m5", MessageState.EXTRACTED, 999.0)
    ledger.in_flight.overdue(999.0)
    assert since("m5") is None and for_apply("m5") is None
    ledger.forget_user(user)
    assert since("m4") is None and for_apply("m4") is None
