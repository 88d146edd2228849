"""The fleet-wide LLM controls on a real Redis: the circuit breaker's decisions and its own counts, and the
rate limiter's spacing shared by every process. Decisions are asserted, never timings: the limiter runs at
a rate so low that a second grant inside the test is impossible however slow the machine, and the breaker
stays open for an hour unless the test ends its open span (``end_open_span``: the key whose TTL is the
time left, expired by the test), so no pause of the machine can let a call through early."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from engram_api.connections import redis_client
from engram_api.settings import Settings
from engram_workers.control import LLMBreaker, LLMRateLimiter
from engram_workers.control.breaker import _OPEN as OPEN_KEY  # the open span's clock: its TTL is the time left
from engram_workers.control.breaker import BreakerOpenError, BreakerStats
from tests.support.operator_processes import wait_until
from tests.support.stack import own_database, redis_db_url


class ModelDown(Exception):
    """What the model's failure looks like to the breaker here."""


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    """A Redis database of its own: breaker and limiter keys are fleet-wide, one per database."""
    with own_database() as number:
        url = redis_db_url(redis_url, number)
        client = redis.Redis.from_url(url)
        client.flushdb()
        yield url
        client.flushdb()
        client.close()


def breaker(url: str, reset_timeout: float = 3600.0) -> LLMBreaker:
    return LLMBreaker(
        redis=redis_client(url, Settings(), timeout_s=5),
        fail_max=2,
        reset_timeout=reset_timeout,
        is_failure=lambda exc: isinstance(exc, ModelDown),
    )


def fail() -> None:
    raise ModelDown("503")


def end_open_span(b: LLMBreaker) -> None:
    """The clock moves past the open span: the breaker's own record of the time left (a key's TTL) runs out."""
    assert b.state == "open"
    b.redis.pexpire(OPEN_KEY, 1)
    wait_until(lambda: b.state == "half-open", timeout=30, what="the open span to end")


def test_the_breaker_opens_refuses_then_closes_through_one_trial(url: str) -> None:
    one, other = breaker(url), breaker(url)  # two worker processes share the state
    calls: list[str] = []
    for b in (one, other):
        with pytest.raises(ModelDown):
            b.call(fail)
    assert one.state == "open"

    with pytest.raises(BreakerOpenError) as refused:
        other.call(lambda: calls.append("while open"))
    assert calls == [] and refused.value.retry_in > 0

    end_open_span(one)
    assert one.call(lambda: "answer") == "answer"
    assert one.state == "closed" and other.call(lambda: "again") == "again"
    assert one.stats() == BreakerStats(admitted=3, trials=1, rejected=1, opened=1)


def test_a_failed_trial_opens_the_breaker_again(url: str) -> None:
    b = breaker(url)
    for _ in range(2):
        with pytest.raises(ModelDown):
            b.call(fail)
    end_open_span(b)
    with pytest.raises(ModelDown):
        b.call(fail)  # the trial
    assert b.state == "open"
    assert b.stats() == BreakerStats(admitted=2, trials=1, rejected=0, opened=2)


def test_only_one_caller_gets_the_half_open_trial(url: str) -> None:
    one, other = breaker(url), breaker(url)
    for _ in range(2):
        with pytest.raises(ModelDown):
            one.call(fail)
    end_open_span(one)
    in_trial, release = threading.Event(), threading.Event()

    def slow_answer() -> str:
        in_trial.set()
        release.wait(30)
        return "answer"

    trial = threading.Thread(target=one.call, args=(slow_answer,))
    trial.start()
    try:
        assert in_trial.wait(30)
        with pytest.raises(BreakerOpenError):
            other.call(lambda: "a second trial")
    finally:
        release.set()
        trial.join(30)
    assert one.state == "closed"
    assert one.stats() == BreakerStats(admitted=2, trials=1, rejected=1, opened=1)


def test_a_bad_answer_does_not_count_against_the_service(url: str) -> None:
    b = breaker(url)
    for _ in range(5):
        with pytest.raises(ValueError):
            b.call(lambda: int("not a number"))
    assert b.state == "closed" and b.stats() == BreakerStats(admitted=5)


def test_rate_limit_slots_are_shared_by_every_process(url: str) -> None:
    # One call per 100 s: whatever the machine's speed, no second slot can come free during the test.
    one, other = (LLMRateLimiter(redis=redis_client(url, Settings()), per_second=0.01) for _ in range(2))
    assert one.acquire(max_wait=0) is True
    assert one.acquire(max_wait=0) is False
    assert other.acquire(max_wait=5) is False  # the next slot is ~100 s away: not worth waiting 5 s for
