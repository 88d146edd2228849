"""The test stacks' Redis addressing: each live stack a database of its own, on the URL it was given."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from tests.support.stack import own_database, redis_db_url


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/7"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/7"),
        (
            "redis://:secret@cache.internal:6380/2?socket_timeout=5",
            "redis://:secret@cache.internal:6380/7?socket_timeout=5",
        ),
        ("rediss://user:pw@host/", "rediss://user:pw@host/7"),
        ("unix:///run/redis.sock?db=0&password=x", "unix:///run/redis.sock?password=x&db=7"),
    ],
)
def test_the_database_is_replaced_and_everything_else_kept(base: str, expected: str) -> None:
    assert redis_db_url(base, 7) == expected


def test_live_stacks_never_share_a_database_and_stay_within_an_external_redis() -> None:
    with own_database() as first, own_database() as second:
        assert first != second
        with own_database() as third:
            assert third not in (first, second)
    with own_database() as again:
        assert again == first  # released numbers are reused: a long run never runs out
    with ExitStack() as live:
        numbers = [live.enter_context(own_database()) for _ in range(15)]
        assert sorted(numbers) == list(range(1, 16))  # database 0 is never taken; 16 is the default count
        with pytest.raises(RuntimeError, match="in use"):
            live.enter_context(own_database())
