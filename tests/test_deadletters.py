"""Dead letters, one key each with a per-user and a fleet-wide index (issue 45): a user's listing reads
that user's letters alone, the retention prune reads only the letters past the retention, and a letter
and its index entries come and go together. A private real Redis, so the counts are the code's alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from engram_api import keys
from engram_api.errors import InvalidInputError
from engram_api.ledger import MessageLedger
from engram_api.models import DeadLetter
from engram_api.producer import build_envelope
from engram_api.settings import Settings
from tests.support.commands import counted, private_redis_fixture  # noqa: F401 (the private_redis fixture)

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
SETTINGS = Settings()


@pytest.fixture
def r(private_redis: redis.Redis) -> redis.Redis:
    return private_redis


@pytest.fixture
def ledger(r: redis.Redis) -> MessageLedger:
    r.flushdb()
    return MessageLedger(r, status_ttl_s=600, secrets=["hunter2-secret"])


def letter(user: str, mid: str, failed_at: datetime, reason: str = "boom") -> DeadLetter:
    envelope = build_envelope(SETTINGS, user, "Hi.", message_id=mid, timestamp=T0)
    return DeadLetter(
        user_id=user, message_id=mid, stage="extract", reason=reason, envelope=envelope, failed_at=failed_at
    )


def test_a_users_listing_reads_only_that_users_letters(r: redis.Redis, ledger: MessageLedger) -> None:
    for n in range(40):  # 200 letters of other users
        for i in range(5):
            assert ledger.dead_letter(letter(f"dl_crowd{n}", f"m{i}", T0 + timedelta(minutes=i)))
    mine = [letter("dl_me", f"m{i}:x", T0 + timedelta(hours=3 - i)) for i in range(3)]
    for one in mine:
        assert ledger.dead_letter(one)

    with counted(r) as reads:
        listed = ledger.dead_letters.list("dl_me")
    assert [d.message_id for d in listed] == ["m2:x", "m1:x", "m0:x"]  # oldest first
    assert listed[0] == mine[2]
    # The user's index (a page, then the empty page after it) and its three letters: nothing else.
    assert reads.lookups == 2 + 3 and reads["hvals"] == reads["hgetall"] == reads["scan"] == 0
    assert len(ledger.dead_letters.list()) == 203
    with pytest.raises(InvalidInputError) as err:
        ledger.dead_letters.list("no such:user")  # refused before anything is read, not listed empty
    assert err.value.field == "user_id"
    crowd = ledger.dead_letters.list(where=lambda uid: uid == "dl_crowd7")
    assert [(d.user_id, d.message_id) for d in crowd] == [("dl_crowd7", f"m{i}") for i in range(5)]


def test_the_prune_reads_only_the_letters_past_the_retention(r: redis.Redis, ledger: MessageLedger) -> None:
    now = T0 + timedelta(days=30)
    for i in range(100):
        ledger.dead_letter(letter(f"dl_u{i % 7}", f"new{i}", now - timedelta(days=1)))
    old = [letter(f"dl_u{i}", f"old{i}", now - timedelta(days=20 + i)) for i in range(4)]
    for one in old:
        ledger.dead_letter(one)

    with counted(r) as reads:
        assert ledger.dead_letters.prune(older_than=timedelta(days=14), now=now) == 4
    assert reads["get"] == reads["mget"] == reads["hscan"] == 0  # no letter is read, let alone parsed
    assert reads["del"] == 4 and reads["zrangebyscore"] == 2  # a page of the old ones, then an empty page
    assert len(ledger.dead_letters.list()) == 100
    for one in old:
        assert ledger.dead_letters.get(one.user_id, one.message_id) is None
        assert r.zscore(keys.user_dead_letters(one.user_id), one.message_id) is None
    assert ledger.dead_letters.prune(older_than=timedelta(days=14), now=now) == 0


def test_a_letter_is_stored_redacted_and_removed_with_its_index_entries(r: redis.Redis, ledger: MessageLedger) -> None:
    one = letter("dl_rm", "m1", T0, reason="LLM said no (key hunter2-secret)")
    assert ledger.dead_letter(one)
    stored = ledger.dead_letters.get("dl_rm", "m1")
    assert stored is not None and "hunter2-secret" not in stored.reason
    assert ledger.knows("dl_rm", "m1")
    assert ledger.dead_letters.remove("dl_rm", "m1") and not ledger.dead_letters.remove("dl_rm", "m1")
    assert r.zcard(keys.dead_letters()) == 0 and r.zcard(keys.user_dead_letters("dl_rm")) == 0
    assert ledger.dead_letters.list("dl_rm") == [] and not r.exists(keys.dead_letter("dl_rm", "m1"))


def test_forgetting_a_message_takes_its_letter_and_no_letter_is_written_after(
    r: redis.Redis, ledger: MessageLedger
) -> None:
    assert ledger.dead_letter(letter("dl_fg", "m1", T0))
    ledger.forget("dl_fg", "m1")
    assert ledger.dead_letters.list() == [] and r.zcard(keys.user_dead_letters("dl_fg")) == 0
    assert not ledger.dead_letter(letter("dl_fg", "m1", T0))  # tombstoned: nothing written
    assert not r.exists(keys.dead_letter("dl_fg", "m1")) and r.zcard(keys.dead_letters()) == 0
