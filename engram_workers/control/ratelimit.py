"""Fleet-wide LLM rate limit: a moving window in Redis shared by every worker process (``limits``)."""

from __future__ import annotations

import time

from limits import RateLimitItemPerSecond
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from engram_api import keys

__all__ = ["LLMRateLimiter"]


class LLMRateLimiter:
    def __init__(self, *, redis_url: str, per_second: float) -> None:
        # limits counts whole calls per window: express fractional rates over a longer window.
        window = 1 if per_second >= 1 else max(1, round(1 / per_second))
        amount = max(1, round(per_second * window))
        self.item = RateLimitItemPerSecond(amount, window, namespace=keys.RATE_BUCKET)
        self.limiter = MovingWindowRateLimiter(RedisStorage(redis_url))

    def acquire(self, *, max_wait: float) -> bool:
        """Take one call slot, waiting up to ``max_wait`` seconds; False means "retry later"."""
        deadline = time.monotonic() + max_wait
        while True:
            if self.limiter.hit(self.item, "llm"):
                return True
            stats = self.limiter.get_window_stats(self.item, "llm")
            pause = max(0.01, stats.reset_time - time.time())
            if time.monotonic() + pause > deadline:
                return False
            time.sleep(min(pause, 0.25))
