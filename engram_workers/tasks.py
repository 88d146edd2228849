"""Celery task definitions: thin bindings of the stages and maintenance jobs to the queue.

Task arguments are ids only (user id, message id): message text never appears in Flower or the logs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from celery import Task

from engram_api import keys
from engram_workers.app import app
from engram_workers.context import WorkerContext, get_context
from engram_workers.stages import RetryLater
from engram_workers.stages.apply import run_apply
from engram_workers.stages.common import dead_letter, load_envelope
from engram_workers.stages.extract import run_extract

__all__ = ["apply", "extract"]

# Unexpected errors (bugs, corrupt data) are retried a few times, then the message is dead-lettered
# instead of being acked into oblivion.
_UNEXPECTED_ATTEMPTS = 3


def _run_stage(
    task: Task, stage: str, fn: Callable[[WorkerContext, str, str], str], user_id: str, message_id: str
) -> str:
    ctx = get_context()
    try:
        return fn(ctx, user_id, message_id)
    except RetryLater as later:
        raise task.retry(countdown=later.countdown, max_retries=None) from None
    except Exception as exc:
        attempts = int(ctx.redis.hincrby(keys.status(user_id, message_id), f"{stage}_errors", 1))
        if attempts >= _UNEXPECTED_ATTEMPTS:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            return dead_letter(
                ctx,
                load_envelope(ctx, user_id, message_id),
                user_id=user_id,
                message_id=message_id,
                stage=stage,
                reason=reason + "\n" + traceback.format_exc(limit=5)[-1500:],
                attempts=attempts,
            )
        raise task.retry(countdown=2.0 * attempts, max_retries=None) from exc


@app.task(name=keys.EXTRACT_TASK, bind=True, max_retries=None)
def extract(self: Task, user_id: str, message_id: str) -> str:
    return _run_stage(self, "extract", run_extract, user_id, message_id)


@app.task(name=keys.APPLY_TASK, bind=True, max_retries=None)
def apply(self: Task, user_id: str, message_id: str) -> str:
    return _run_stage(self, "apply", run_apply, user_id, message_id)


def _jsonable(report: Any) -> Any:
    return report.model_dump(mode="json") if hasattr(report, "model_dump") else report
