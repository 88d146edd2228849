"""Fleet-wide LLM rate limit: GCRA (the generic cell-rate algorithm) in one Redis Lua script.

Grants are spaced ``1/rate`` apart across every worker process. A moving window (what the ``limits``
package offers) lets each window's whole quota go in one burst, so the provider saw 1.5x the rate in
some seconds (measured by the flaky-LLM chaos scenario); spaced grants cannot bunch like that.
"""

from __future__ import annotations

import time

from engram_api import keys
from engram_api.connections import redis_client

__all__ = ["LLMRateLimiter"]

# KEYS: theoretical arrival time. ARGV: interval ms. Returns 0 when granted, else ms to wait.
# Redis' own clock is used, so workers with skewed clocks still share one schedule.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if tat - now > 0 then return tat - now end
redis.call('SET', KEYS[1], tat + interval, 'PX', interval * 2 + 1000)
return 0
"""


class LLMRateLimiter:
    def __init__(self, *, redis_url: str, per_second: float) -> None:
        self.redis = redis_client(redis_url, timeout_s=5, decode_responses=False)
        self.interval_ms = max(1, round(1000 / per_second))
        self._gcra = self.redis.register_script(_GCRA)

    def acquire(self, *, max_wait: float) -> bool:
        """Take one call slot, waiting up to ``max_wait`` seconds; False means "retry later"."""
        deadline = time.monotonic() + max_wait
        while True:
            wait_ms = int(self._gcra(keys=[keys.RATE_BUCKET], args=[self.interval_ms]))
            if wait_ms == 0:
                return True
            if time.monotonic() + wait_ms / 1000 > deadline:
                return False
            time.sleep(wait_ms / 1000)
