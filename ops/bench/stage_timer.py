"""Benchmark middleware, loaded by the workers through ``ENGRAM_MIDDLEWARE=stage_timer:StageTimer``.

It writes each stage's in-worker duration into the message's status hash (``bench_extract_s``,
``bench_apply_s``): the same ``seconds`` the built-in MetricsMiddleware feeds to the Prometheus
histogram ``engram_stage_seconds``, but per message, so a benchmark can take exact percentiles without
scraping a metrics port. Kept apart from benchlib so a worker imports nothing else from ops/bench.
"""

from __future__ import annotations

from engram_api import keys
from engram_api.models import StageResult
from engram_workers.middleware import Middleware
from engram_workers.resources import get_resources


class StageTimer(Middleware):
    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        get_resources().redis.hset(keys.status(user_id, message_id), f"bench_{stage}_s", repr(seconds))
