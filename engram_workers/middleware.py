"""Hooks around the pipeline, as small middleware classes in one explicit, ordered list, called by one
emitter (``Hooks``, like dramatiq's broker emitting to its ordered middleware).

Built-ins log and count; deployments add their own with ``ENGRAM_MIDDLEWARE=pkg.mod:Class,...`` (audit
trails, notifications, fault injection in chaos tests).

Invariants:
- Every hook of the pipeline is called through ``Hooks``: on every middleware in list order (built-ins
  first, then ``ENGRAM_MIDDLEWARE`` as given); the first one that raises ends that emission.
- The error policy, stated once (``Hooks``): a hook that raises for the message a task is running fails
  the stage like any other unexpected error (retried, then dead-lettered with the traceback), so hooks
  cannot silently swallow work. Where the stage must not fail again over it, the error is handed back:
  an ``on_dead_letter`` hook's goes into the stored letter; a batch member's (applied on behalf of its own
  task) leaves the member to that task, which calls the hook again and takes the normal path.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any, Literal

from engram_api.models import ApplyOutcome, DeadLetter, StageResult
from engram_api.settings import Settings
from engram_workers import metrics

__all__ = ["Hook", "Hooks", "LoggingMiddleware", "MetricsMiddleware", "Middleware", "build_hooks"]

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


Hook = Literal["before_stage", "after_stage", "after_write", "on_dead_letter"]


class Hooks:
    """The one emitter: calls a hook on every middleware of the list, in order (see the module docstring)."""

    def __init__(self, middleware: Sequence[Middleware]) -> None:
        self.middleware = tuple(middleware)

    def emit(self, hook: Hook, *args: Any) -> None:
        """For the message a task is running: a hook's error is raised as is, and fails the stage."""
        for m in self.middleware:
            getattr(m, hook)(*args)

    def try_emit(self, hook: Hook, *args: Any) -> Exception | None:
        """Where the stage must not fail again over a hook: the error is returned, for the caller to put where
        the module docstring says (the stored letter; a batch member left to its own task)."""
        try:
            self.emit(hook, *args)
        except Exception as exc:
            return exc
        return None


def build_hooks(settings: Settings) -> Hooks:
    """The emitter over the built-in middleware and ``settings.middleware``'s (loaded now: a bad entry raises)."""
    extra = [_load(p) for p in settings.middleware.split(",") if p.strip()]
    return Hooks([cls() for cls in [*BUILT_IN, *extra]])
