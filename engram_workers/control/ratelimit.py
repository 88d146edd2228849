"""Fleet-wide LLM rate limit: GCRA (the generic cell-rate algorithm) in one Redis Lua script
(``engram_api.ledger.scripts.GCRA``).

Grants are spaced ``1/rate`` apart across every worker process. A moving window (what the ``limits``
package offers) lets each window's whole quota go in one burst, so the provider saw 1.5x the rate in
some seconds (measured by the flaky-LLM chaos scenario); spaced grants cannot bunch like that.

Saturation is counted where it is felt: the seconds callers sleep for a slot (``LLM_RATE_WAIT``) and the
calls put off because no slot came within their wait (``LLM_RATE_REFUSED``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.ledger.controls import GCRA, BucketArgs, BucketKeys
from engram_workers.metrics import LLM_RATE_REFUSED, LLM_RATE_WAIT

if TYPE_CHECKING:
    import redis

__all__ = ["LLMRateLimiter"]


class LLMRateLimiter:
    def __init__(self, *, redis: redis.Redis, per_second: float) -> None:
        self.redis = redis
        self.interval_ms = max(1, round(1000 / per_second))

    def acquire(self, *, max_wait: float) -> bool:
        """Take one call slot, waiting up to ``max_wait`` seconds; False means "retry later"."""
        deadline = time.monotonic() + max_wait
        while True:
            wait_ms = int(
                GCRA(self.redis, BucketKeys(bucket=keys.RATE_BUCKET), BucketArgs(interval_ms=self.interval_ms))
            )
            if wait_ms == 0:
                return True
            if time.monotonic() + wait_ms / 1000 > deadline:
                LLM_RATE_REFUSED.inc()
                return False
            LLM_RATE_WAIT.inc(wait_ms / 1000)
            time.sleep(wait_ms / 1000)
