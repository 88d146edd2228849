"""Extraction turns on a real Redis (``engram_api.ledger.turns``): one user's messages take the turn one at a
time in event-time order, whoever finishes passes it on and wakes the earliest parked message (its extract
task back on the queue), and nothing finished or lost holds a user's later messages back."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis

from engram_api import keys
from engram_api.ledger import MessageLedger
from engram_api.ledger.wire import task_ref
from engram_api.models import DeadLetter, MessageState
from engram_api.producer import build_envelope
from engram_api.settings import Settings
from engram_workers.maintenance.redeliver import redeliver_stuck

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def ledger(redis_client: redis.Redis) -> MessageLedger:
    return MessageLedger(redis_client, status_ttl_s=600)


def enqueue(ledger: MessageLedger, user: str, mid: str, days: float) -> float:
    """Enqueue ``mid`` dated ``days`` after T0 and take its task off the queue (it "ran": only wake-ups
    stay on the queue); its event time."""
    envelope = build_envelope(Settings(), user, f"message {mid}", message_id=mid, timestamp=T0 + timedelta(days=days))
    assert ledger.enqueue(envelope, task_id=f"t-{mid}", limit=100) == (None, None)
    assert task_ref(ledger.redis.lpop(keys.EXTRACT_QUEUE)) == (keys.EXTRACT_TASK, keys.message_ref(user, mid))
    return envelope.timestamp.timestamp()


def woken(redis_client: redis.Redis, user: str) -> list[str]:
    """The message ids of ``user`` whose extract task a wake-up put on the queue, in the order they were put
    there (each at the front: the newest is taken first)."""
    refs = [task_ref(m) for m in redis_client.lrange(keys.EXTRACT_QUEUE, 0, -1)]
    return [ref.split(":", 1)[1] for task, ref in filter(None, refs) if ref.startswith(f"{user}:")]


def test_the_earliest_message_takes_the_turn_and_each_finish_wakes_the_next(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user, other = (f"tn_{uuid.uuid4().hex[:8]}" for _ in range(2))
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("kotlin", 1), ("java", 0), ("rust", 2))}
    turns = ledger.turns
    assert turns.waiting(user) == ["java", "kotlin", "rust"]  # event time, not arrival
    # Kotlin's task runs first: Java is earlier, so Kotlin parks; so does Rust.
    assert turns.take(user, "kotlin", times["kotlin"]) == (False, "java")
    assert turns.take(user, "rust", times["rust"]) == (False, "java")
    assert turns.take(user, "java", times["java"]).granted
    assert turns.take(user, "java", times["java"]).granted  # a redelivery of the holder goes on
    # Another user is never behind this one's turn.
    assert turns.take(other, "solo", enqueue(ledger, other, "solo", 5)).granted

    # Passing on a message still in flight changes nothing.
    assert turns.pass_on(user, "java") is None and turns.take(user, "kotlin", times["kotlin"]) == (False, "java")
    ledger.set_state(user, "java", MessageState.EXTRACTED, extraction="{}", event_time=times["java"])
    ledger.set_state(user, "java", MessageState.APPLIED)  # the finish passes the turn on: Kotlin is woken
    assert woken(redis_client, user) == ["kotlin"] and turns.waiting(user) == ["kotlin", "rust"]
    assert turns.take(user, "kotlin", times["kotlin"]).granted
    assert turns.take(user, "rust", times["rust"]) == (False, "kotlin")

    # A late message (older than the holder) waits for the holder, then goes before Rust.
    late = enqueue(ledger, user, "late", -400)
    assert turns.take(user, "late", late) == (False, "kotlin")
    letter = DeadLetter(user_id=user, message_id="kotlin", stage="extract", reason="the model kept failing")
    assert ledger.dead_letter(letter)  # a dead letter passes the turn on like an apply
    assert woken(redis_client, user) == ["kotlin", "late"]
    assert turns.take(user, "late", late).granted
    ledger.forget(user, "late")  # so does forgetting the holder
    assert woken(redis_client, user) == ["kotlin", "late", "rust"] and turns.take(user, "rust", times["rust"]).granted


def test_a_finished_or_lost_blocker_never_holds_later_messages_back(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user = f"tn_{uuid.uuid4().hex[:8]}"
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("a", 0), ("b", 1), ("c", 2))}
    turns = ledger.turns
    assert turns.take(user, "a", times["a"]).granted
    # "a" is lost while holding the turn (its status expired, no finish ever ran) and "b" is finished by a
    # path that never passed the turn on (a crash between its status write and the pass).
    redis_client.delete(keys.status(user, "a"))
    redis_client.hset(keys.status(user, "b"), "state", MessageState.APPLIED.value)
    assert turns.take(user, "c", times["c"]).granted
    assert turns.waiting(user) == ["c"]


def test_a_parked_message_nobody_woke_is_woken_by_the_next_take(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user = f"tn_{uuid.uuid4().hex[:8]}"
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("a", 0), ("b", 1), ("c", 2))}
    turns = ledger.turns
    assert turns.take(user, "b", times["b"]) == (False, "a")  # "a" has not run yet: "b" parks
    # "a" is forgotten by a path that did not pass the turn on: "b" stays parked until someone meets it.
    redis_client.delete(keys.status(user, "a"))
    redis_client.zrem(keys.extract_order(user), "a")
    assert turns.take(user, "c", times["c"]) == (False, "b")
    assert woken(redis_client, user) == ["b"]  # the take that found "b" first and parked woke it
    assert turns.take(user, "b", times["b"]).granted


def test_forgetting_a_user_takes_its_turn_keys(ledger: MessageLedger, redis_client: redis.Redis) -> None:
    user = f"tn_{uuid.uuid4().hex[:8]}"
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("a", 0), ("b", 1))}
    ledger.turns.take(user, "a", times["a"])
    ledger.turns.take(user, "b", times["b"])
    ledger.forget_user(user)
    assert not redis_client.exists(keys.extract_order(user), keys.extract_turn(user), keys.parked(user))


def test_a_woken_message_is_taken_before_messages_enqueued_since(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    user, other = (f"tn_{uuid.uuid4().hex[:8]}" for _ in range(2))
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("a", 0), ("b", 1))}
    assert ledger.turns.take(user, "a", times["a"]).granted and not ledger.turns.take(user, "b", times["b"]).granted
    newcomer = build_envelope(Settings(), other, "Hello there.", message_id="n1", timestamp=T0)
    ledger.enqueue(newcomer, task_id="t-n1", limit=100)  # its task stays on the queue
    ledger.set_state(user, "a", MessageState.APPLIED)
    # Workers take from the right end of the list: the woken message's task is to the right of the newcomer's.
    refs = [ref for _, ref in filter(None, map(task_ref, redis_client.lrange(keys.EXTRACT_QUEUE, 0, -1)))]
    assert refs.index(f"{user}:b") > refs.index(f"{other}:n1")


def test_the_sweep_leaves_a_message_parked_behind_a_live_holder_and_resends_the_earliest_whose_holder_finished(
    ledger: MessageLedger, redis_client: redis.Redis
) -> None:
    """A parked message's task ended on purpose: it waits for its holder's pass-on however long the burst
    takes. The sweep re-sends it only when nobody will pass the turn on (the holder finished without it)."""
    user = f"tn_{uuid.uuid4().hex[:8]}"
    times = {mid: enqueue(ledger, user, mid, days) for mid, days in (("a", 0), ("b", 1), ("c", 2))}
    turns = ledger.turns
    assert turns.take(user, "a", times["a"]).granted
    assert turns.take(user, "b", times["b"]) == (False, "a") and turns.take(user, "c", times["c"]) == (False, "a")

    def sweep() -> list[str]:
        sent: list[tuple[str, tuple[str, str]]] = []
        later = time.time() + 120  # every message of the user waits since before the threshold
        redeliver_stuck(client=redis_client, send=lambda t, a: sent.append((t, a)), older_than_s=60, now=later,
                        confirm_after_s=0)  # fmt: skip
        return sorted(mid for _, (uid, mid) in sent if uid == user)

    assert sweep() == ["a"]  # the holder's task is gone (it "ran" and vanished): re-sent; b and c wait for it
    # The holder finishes by a path that never passed the turn on: b and c would wait for ever.
    redis_client.hset(keys.status(user, "a"), "state", MessageState.APPLIED.value)
    assert sweep() == ["b"]  # only the earliest: its take drops the finished holder, and "c" follows in turn
    assert turns.take(user, "b", times["b"]).granted and turns.waiting(user) == ["b", "c"]
