"""Fleet-wide circuit breaker around the LLM, state in Redis (pybreaker's ``CircuitRedisStorage``).

After ``fail_max`` consecutive failures every worker stops calling the model for ``reset_timeout``
seconds; then one trial call decides whether it closes again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pybreaker
import redis

from engram_api import keys

__all__ = ["BreakerOpenError", "LLMBreaker"]

T = TypeVar("T")
BreakerOpenError = pybreaker.CircuitBreakerError


class LLMBreaker:
    def __init__(
        self,
        *,
        redis_url: str,
        fail_max: int,
        reset_timeout: float,
        is_failure: Callable[[BaseException], bool],
    ) -> None:
        # pybreaker's storage expects a bytes-level client.
        client = redis.Redis.from_url(redis_url, socket_timeout=5)
        storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client, namespace=keys.BREAKER)
        self.breaker = pybreaker.CircuitBreaker(
            fail_max=fail_max,
            reset_timeout=reset_timeout,
            state_storage=storage,
            name="llm",
            # The model answered but the answer was bad: that says nothing about the service's health.
            exclude=[lambda exc: not is_failure(exc)],
        )
        self.reset_timeout = reset_timeout

    @property
    def state(self) -> str:
        return str(self.breaker.current_state)

    def call(self, fn: Callable[[], T]) -> T:
        return self.breaker.call(fn)
