"""Fleet-wide controls kept in Redis: LLM rate limit and LLM circuit breaker.

(The per-user write lock lives in ``engram_api.storage.writer.lease``: the reader's ``forget`` takes it too.)
"""

from engram_workers.control.breaker import LLMBreaker
from engram_workers.control.ratelimit import LLMRateLimiter

__all__ = ["LLMBreaker", "LLMRateLimiter"]
