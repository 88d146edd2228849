"""Hooks around the pipeline, as small middleware classes in one explicit, ordered list.

Built-ins log and count; deployments add their own with ``ENGRAM_MIDDLEWARE=pkg.mod:Class,...`` (audit
trails, notifications, fault injection in chaos tests). A ``before_stage``, ``after_stage`` or ``after_write``
hook that raises fails the stage like any other unexpected error (retried, then dead-lettered with the
traceback), so hooks cannot silently swallow work; an ``on_dead_letter`` hook that raises has its error added
to the stored letter.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from engram_api.models import ApplyOutcome, DeadLetter, StageResult
from engram_api.settings import Settings
from engram_workers import metrics

__all__ = ["LoggingMiddleware", "MetricsMiddleware", "Middleware", "build_middleware"]

log = logging.getLogger("engram.pipeline")


class Middleware:
    """Override any subset. Each hook gets ids, never message text."""

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None: ...

    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None: ...

    def after_write(self, user_id: str, message_id: str, outcome: ApplyOutcome) -> None:
        """Runs after the graph transaction committed, before FAISS and the Redis bookkeeping."""

    def on_dead_letter(self, letter: DeadLetter) -> None: ...


class LoggingMiddleware(Middleware):
    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        log.info(
            "%s %s", stage, outcome,
            extra={
                "stage": stage, "user_id": user_id, "message_id": message_id, "outcome": outcome.outcome.value,
                "seconds": round(seconds, 4),
            },
        )  # fmt: skip

    def on_dead_letter(self, letter: DeadLetter) -> None:
        log.warning(
            "dead-lettered: %s", letter.reason.splitlines()[0] if letter.reason else "",
            extra={"stage": letter.stage, "user_id": letter.user_id, "message_id": letter.message_id},
        )  # fmt: skip


class MetricsMiddleware(Middleware):
    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        metrics.STAGE_SECONDS.labels(stage=stage).observe(seconds)
        metrics.MESSAGES.labels(stage=stage, outcome=outcome.outcome.value).inc()

    def on_dead_letter(self, letter: DeadLetter) -> None:
        metrics.DEAD_LETTERS.labels(stage=letter.stage).inc()


BUILT_IN: list[type[Middleware]] = [LoggingMiddleware, MetricsMiddleware]


def _load(path: str) -> type[Middleware]:
    module, _, name = path.strip().partition(":")
    cls: Any = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Middleware)):
        raise TypeError(f"ENGRAM_MIDDLEWARE entry {path!r} is not a Middleware subclass")
    return cls


def build_middleware(settings: Settings) -> list[Middleware]:
    extra = [_load(p) for p in settings.middleware.split(",") if p.strip()]
    return [cls() for cls in [*BUILT_IN, *extra]]
