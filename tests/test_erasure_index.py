"""Erasure by per-user indexes (issue 45): ``erase_user`` finds a user's messages, dead letters and recall
logs by the indexes the writing scripts keep, never by SCAN, so its commands follow the user's message
count, not the keyspace; it leaves no key of the user and touches no other user's. Keys written before
the indexes are found once ``engram maintenance ledger-reindex`` ran. A private real Redis per module, so
the command counts are the erasure's alone."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import redis

from engram_api import keys
from engram_api.ledger import MessageLedger
from engram_api.ledger.reindex import reindex
from engram_api.models import DeadLetter, MessageState
from engram_api.producer import build_envelope
from engram_api.reader.background import ReaderThreads
from engram_api.settings import Settings
from tests.support.commands import counted, private_redis_fixture  # noqa: F401 (the private_redis fixture)

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
TTL = 600
SETTINGS = Settings()


@pytest.fixture
def r(private_redis: redis.Redis) -> redis.Redis:
    return private_redis


@pytest.fixture
def ledger(r: redis.Redis) -> MessageLedger:
    return MessageLedger(r, status_ttl_s=TTL)


def user_keys(r: redis.Redis, user: str) -> list[str]:
    """Every key named by ``user`` (by SCAN: the test may, the erasure may not)."""
    return sorted(k for pattern in keys.user_keys_pattern(user) for k in r.scan_iter(match=pattern))


def populate(ledger: MessageLedger, user: str, n: int) -> None:
    """``n`` messages in every state a user's keys can be in: queued, started, extracted, applied, dead;
    and two recall logs."""
    for i in range(n):
        mid = f"m{i}:x"  # message ids may contain ':'
        envelope = build_envelope(SETTINGS, user, f"I like topic {i}.", message_id=mid, timestamp=T0)
        ledger.enqueue(envelope, task_id=f"t{i}", limit=10_000)
        kind = i % 5
        if kind >= 1:
            ledger.enter(user, mid, "extract")
        if kind >= 2:
            ledger.set_state(user, mid, MessageState.EXTRACTED, extraction="{}", event_time=T0.timestamp())
            ledger.enter(user, mid, "apply")
        if kind == 3:
            ledger.set_state(user, mid, MessageState.APPLIED, fields={"version": "1"})
        if kind == 4:
            ledger.dead_letter(DeadLetter(user_id=user, message_id=mid, stage="apply", reason="x", envelope=envelope))
    threads = ReaderThreads(threads=1)
    for recall_id in ("r1", "r2"):
        threads.log_recall(ledger.redis, user, recall_id, "{}")
    threads.flush()


def test_erase_user_issues_no_scan_and_leaves_no_key_of_the_user(r: redis.Redis, ledger: MessageLedger) -> None:
    gone, kept = "er_gone", "er_kept"
    populate(ledger, gone, 25)
    populate(ledger, kept, 5)
    assert len(user_keys(r, gone)) > 25 * 2  # premise: every kind of key exists
    assert r.exists(keys.recall_log(gone, "r1"), keys.dead_letter(gone, "m4:x")) == 2
    kept_before = {k: r.type(k) for k in user_keys(r, kept)}

    with counted(r) as calls:
        assert ledger.forget_user(gone) == 25
    assert calls["scan"] == 0 and calls["keys"] == 0 and calls["hkeys"] == 0
    assert user_keys(r, gone) == []
    assert all(ledger.is_forgotten(gone, f"m{i}:x") for i in range(25))  # every message tombstoned
    assert not any(ref.startswith(f"{gone}:") for ref in r.zrange(keys.in_flight(), 0, -1))
    assert not any(ref.startswith(f"{gone}:") for ref in r.zrange(keys.dead_letters(), 0, -1))
    assert {k: r.type(k) for k in user_keys(r, kept)} == kept_before  # the other user's keys untouched
    assert len(ledger.dead_letters.list(kept)) == 1


def test_erasure_costs_follow_the_users_messages_not_the_keyspace(r: redis.Redis, ledger: MessageLedger) -> None:
    def cost(user: str) -> int:
        populate(ledger, user, 20)
        with counted(r) as calls:
            ledger.forget_user(user)
        assert user_keys(r, user) == []
        return calls.total

    small = cost("er_small")
    for n in range(30):  # 3,000 more messages of other users
        populate_bulk(ledger, f"er_crowd{n}", 100)
    assert r.dbsize() > 3_000
    assert cost("er_large") == small


def populate_bulk(ledger: MessageLedger, user: str, n: int) -> None:
    """``n`` applied messages of ``user`` (statuses kept, as on a busy deployment)."""
    for i in range(n):
        envelope = build_envelope(SETTINGS, user, "Hi.", message_id=f"b{i}", timestamp=T0)
        ledger.enqueue(envelope, task_id=f"t{i}", limit=10_000)
        ledger.set_state(user, f"b{i}", MessageState.APPLIED)


def test_an_applied_message_keeps_only_its_status_and_index_entry(r: redis.Redis, ledger: MessageLedger) -> None:
    user = "er_applied"
    envelope = build_envelope(SETTINGS, user, "Hi.", message_id="m1", timestamp=T0)
    ledger.enqueue(envelope, task_id="t1", limit=10)
    ledger.enter(user, "m1", "extract")
    ledger.set_state(user, "m1", MessageState.EXTRACTED, extraction="{}", event_time=T0.timestamp())
    ledger.enter(user, "m1", "apply")
    ledger.count(user, "m1", "store_attempts")
    ledger.set_state(user, "m1", MessageState.APPLIED, fields={"version": "7"})
    assert ledger.status(user, "m1")["version"] == "7" and ledger.enter(user, "m1", "apply").started == 0
    assert user_keys(r, user) == sorted([keys.status(user, "m1"), keys.user_messages(user)])
    assert ledger.enqueue(envelope, task_id="t2", limit=10).existing == "t1"  # a duplicate: the receipt
    assert 0 < r.ttl(keys.status(user, "m1")) <= TTL and 0 < r.ttl(keys.user_messages(user)) <= TTL


def test_the_message_index_drops_members_whose_keys_have_expired(r: redis.Redis, ledger: MessageLedger) -> None:
    """The scripts that finish a message trim the index (not the enqueue: it stays cheap). A queued message is
    in its backlog, not yet in the index: the script that finishes it files it there."""
    user = "er_trim"
    r.zadd(keys.user_messages(user), {"ancient": time.time() - TTL - 5, "recent": time.time() - TTL + 60})
    ledger.enqueue(build_envelope(SETTINGS, user, "Hi.", message_id="m1", timestamp=T0), task_id="t", limit=10)
    assert r.zrange(keys.user_messages(user), 0, -1) == ["ancient", "recent"]
    assert r.zrange(keys.pending(user), 0, -1) == ["m1"]
    ledger.set_state(user, "m1", MessageState.APPLIED)
    assert r.zrange(keys.user_messages(user), 0, -1) == ["recent", "m1"]


def test_backlog_entries_of_lost_messages_neither_count_nor_refuse(r: redis.Redis, ledger: MessageLedger) -> None:
    """A message lost to a crash leaves its backlog entry; past the TTL it is not counted, and the enqueue it
    would refuse drops it."""
    user = "er_lost"
    r.zadd(keys.pending(user), {"lost1": time.time() - TTL - 5, "lost2": time.time() - TTL - 1})
    assert ledger.backlogs([user]) == [0]
    first, second = (build_envelope(SETTINGS, user, "Hi.", message_id=m, timestamp=T0) for m in ("m1", "m2"))
    assert ledger.enqueue(first, task_id="t1", limit=3) == (None, None)  # 2 entries, under the limit: no trim
    assert r.zcard(keys.pending(user)) == 3
    assert ledger.enqueue(second, task_id="t2", limit=3) == (None, None)  # full until the lost ones go
    assert r.zrange(keys.pending(user), 0, -1) == ["m1", "m2"] and ledger.backlogs([user]) == [2]
    third = build_envelope(SETTINGS, user, "Hi.", message_id="m3", timestamp=T0)
    assert ledger.enqueue(third, task_id="t3", limit=2) == (None, 2)  # really full: refused, nothing written
    assert not r.exists(keys.message_payload(user, "m3"), keys.status(user, "m3"))


def test_keys_written_before_the_indexes_are_erased_once_reindexed(r: redis.Redis, ledger: MessageLedger) -> None:
    user = "er_legacy"
    envelope = build_envelope(SETTINGS, user, "Hi.", message_id="old:1", timestamp=T0)
    # What an older Engram left: keys in no index, and a letter in the single dead-letter hash.
    r.set(keys.message_payload(user, "old:1"), envelope.model_dump_json(), ex=TTL)
    r.hset(keys.status(user, "old:1"), mapping={"state": "queued", "task_id": "t"})
    r.hset(keys.status(user, "old:2"), mapping={"state": "applied", "task_id": "t2"})
    r.set(keys.recall_log(user, "rec"), "{}", ex=60)
    letter = DeadLetter(user_id=user, message_id="old:3", stage="extract", reason="boom", envelope=envelope)
    r.hset(keys.legacy_dead_letters(), keys.message_ref(user, "old:3"), letter.model_dump_json())
    ledger.forget_user(user)
    assert len(user_keys(r, user)) == 4  # not found: the erasure reads only the indexes

    report = reindex(r, status_ttl_s=TTL)
    assert report.dead_letters == 1 and report.messages >= 3 and report.recall_logs >= 1
    assert not r.exists(keys.legacy_dead_letters())
    assert [d.message_id for d in ledger.dead_letters.list(user)] == ["old:3"]  # moved, listed as before
    assert ledger.forget_user(user) == 3
    assert user_keys(r, user) == []


def test_a_recall_log_and_its_index_entry_are_one_command(r: redis.Redis) -> None:
    """A recall's log and its entry in the user's index of recall logs go in one script call (one
    ``EVALSHA``, no MULTI of four commands, whose redis-py Python cost the reader ~3x the script's CPU a
    recall): the log as given, for a day; the index holds its id scored by when, drops entries older than a
    log lives, and lives as long as its newest log."""
    user, rows = "log_once", '{"fact_1": {"similarity": 0.5, "total": Infinity}}'
    threads = ReaderThreads(threads=1)
    threads.log_recall(r, "log_warm", "r0", "{}")  # the server learns the script (a first call loads it)
    threads.flush()
    r.zadd(keys.recall_logs(user), {"expired": time.time() - 25 * 3600, "recent": time.time() - 60})
    with counted(r) as calls:
        threads.log_recall(r, user, "r1", rows)
        threads.flush()
    assert calls["evalsha"] == 1 and calls["multi"] == 0 and calls["exec"] == 0
    assert r.get(keys.recall_log(user, "r1")) == rows
    assert r.zrange(keys.recall_logs(user), 0, -1) == ["recent", "r1"]
    assert abs(r.zscore(keys.recall_logs(user), "r1") - time.time()) < 60
    assert 23 * 3600 < r.ttl(keys.recall_log(user, "r1")) <= 24 * 3600
    assert 23 * 3600 < r.ttl(keys.recall_logs(user)) <= 24 * 3600
