"""Errors a caller or a stage acts on are typed members of the ``EngramError`` tree, with their facts as
attributes: a held user lease (``UserBusyError.user_id``) and an open LLM breaker
(``BreakerOpenError.retry_in``), raised by the real lock and breaker on the real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from engram_api import keys
from engram_api.errors import BreakerOpenError, EngramError, UserBusyError
from engram_api.storage.writer.lease import Lease
from engram_workers.control import LLMBreaker


def test_a_held_user_lock_is_a_user_busy_error_naming_the_user(redis_client: redis.Redis, user_id: str) -> None:
    with Lease(redis_client, user_id, ttl=10, wait=0), pytest.raises(UserBusyError) as caught:  # noqa: SIM117
        with Lease(redis_client, user_id, ttl=10, wait=0.1):
            pass
    assert isinstance(caught.value, EngramError)
    assert caught.value.user_id == user_id and user_id in str(caught.value)


@pytest.fixture
def breaker(redis_url: str) -> Iterator[LLMBreaker]:
    # The breaker's state is fleet-wide: database 0 (no stack uses it), emptied of it before and after.
    url = redis_url.rsplit("/", 1)[0] + "/0"
    state = [keys.breaker(part) for part in ("open", "tripped", "failures", "trial")]
    client = redis.Redis.from_url(url)
    client.delete(*state)
    yield LLMBreaker(redis=client, fail_max=1, reset_timeout=30.0, is_failure=lambda _: True)
    client.delete(*state)
    client.close()


def test_an_open_breaker_is_a_breaker_open_error_saying_when_to_retry(breaker: LLMBreaker) -> None:
    def failing() -> None:
        raise ConnectionError("the model is down")

    with pytest.raises(ConnectionError):
        breaker.call(failing)
    with pytest.raises(BreakerOpenError) as caught:
        breaker.call(lambda: "never called")
    assert isinstance(caught.value, EngramError)
    assert 0 < caught.value.retry_in <= 30.0
