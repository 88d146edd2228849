"""Celery task definitions: thin bindings of the stages and maintenance jobs to the queue.

Task arguments are ids only (user id, message id): message text never appears in Flower or the logs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from celery import Task
from celery.exceptions import Reject

from engram_api import keys, tracing
from engram_api.models import StageResult, utcnow
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.app import app
from engram_workers.resources import WorkerResources, get_resources
from engram_workers.stages import RetryLater
from engram_workers.stages.apply import run_apply
from engram_workers.stages.common import Delivery, dead_letter, deliveries, envelope_or_none, hooked, keep_alive
from engram_workers.stages.extract import run_extract

if TYPE_CHECKING:  # the maintenance jobs are imported by the tasks that run them (numpy, faiss)
    from engram_workers.maintenance.fanout import Chunk, Job

__all__ = [
    "apply",
    "decay_task",
    "extract",
    "hierarchy_task",
    "reconcile_task",
    "redeliver_task",
    "reembed_task",
    "weights_task",
]

# Unexpected errors (bugs, corrupt data) are retried a few times, then the message is dead-lettered
# instead of being acked into oblivion.
_UNEXPECTED_ATTEMPTS = 3


StageFn = Callable[[WorkerResources, str, str, Delivery], StageResult]


def _run_stage(task: Task, stage: str, fn: StageFn, user_id: str, message_id: str) -> StageResult:
    ctx = get_resources()
    try:
        with tracing.span(f"engram.{stage}", **tracing.message_ids(user_id, message_id)) as span:
            result = _deliver(ctx, task, stage, fn, user_id, message_id)
            span.set_attribute("engram.outcome", result.outcome.value)  # a no-op with tracing off
            return result
    except redis.RedisError as exc:
        # Redis itself is away (restart, failover): the bookkeeping cannot be trusted, and acking would
        # lose the message. Back on the queue it goes; the stages are idempotent.
        raise Reject(f"Redis unavailable: {exc}", requeue=True) from exc


def _deliver(ctx: WorkerResources, task: Task, stage: str, fn: StageFn, user_id: str, message_id: str) -> StageResult:
    with deliveries(ctx, user_id, message_id, stage) as delivery:
        settled, crashed = delivery.settled, delivery.crashed
        if settled is not None:  # nothing to do: answered between the hooks, as the stage itself would
            return _attempt(ctx, task, stage, lambda *_: settled, user_id, message_id)
        if crashed >= ctx.settings.poison_max_deliveries:
            return dead_letter(
                ctx,
                envelope_or_none(ctx, user_id, message_id),
                user_id=user_id,
                message_id=message_id,
                stage=stage,
                reason=f"the worker died {crashed} times while processing this message ({stage})",
                attempts=crashed,
            )
        return _attempt(ctx, task, stage, lambda c, u, m: fn(c, u, m, delivery), user_id, message_id)


def _attempt(
    ctx: WorkerResources,
    task: Task,
    stage: str,
    fn: Callable[[WorkerResources, str, str], StageResult],
    user_id: str,
    message_id: str,
) -> StageResult:
    try:
        return hooked(ctx, stage, fn, user_id, message_id)
    except RetryLater as later:
        keep_alive(ctx, user_id, message_id)
        raise _retry(task, later.countdown) from None
    except redis.RedisError:
        raise
    except Exception as exc:
        attempts = ctx.ledger.count(user_id, message_id, f"{stage}_errors")
        if attempts >= _UNEXPECTED_ATTEMPTS:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            return dead_letter(
                ctx,
                envelope_or_none(ctx, user_id, message_id),
                user_id=user_id,
                message_id=message_id,
                stage=stage,
                reason=reason + "\n" + traceback.format_exc(limit=5)[-1500:],
                attempts=attempts,
            )
        raise _retry(task, 2.0 * attempts) from exc


def _retry(task: Task, countdown: float) -> Exception:
    """Celery's ``Retry`` to raise. If the retry cannot be published, Celery raises ``Reject(requeue=False)``,
    which would drop the message: put it back on the queue instead."""
    try:
        return task.retry(countdown=countdown, max_retries=None, throw=False)
    except Reject as exc:
        return Reject(f"could not schedule the retry: {exc.reason}", requeue=True)


@app.task(name=keys.EXTRACT_TASK, bind=True, max_retries=None)
def extract(self: Task, user_id: str, message_id: str) -> str:
    return str(_run_stage(self, "extract", lambda c, u, m, _: run_extract(c, u, m), user_id, message_id))


@app.task(name=keys.APPLY_TASK, bind=True, max_retries=None)
def apply(self: Task, user_id: str, message_id: str) -> str:
    def run(ctx: WorkerResources, user: str, message: str, delivery: Delivery) -> StageResult:
        return run_apply(ctx, user, message, first_start=delivery.first)

    return str(_run_stage(self, "apply", run, user_id, message_id))


# ------------------------------------------------------------------------------------- maintenance
def _guard(ctx: WorkerResources) -> Callable[[str], AbstractContextManager[UserWrite]]:
    """Maintenance writes a user's memory as a ``UserWrite``, like the apply stage: same lease, same
    fence, and it publishes only the users it changed."""
    return lambda user_id: ctx.writes.open(user_id, wait=60.0)


def _fan_out(
    ctx: WorkerResources, job: Job, task: str, interval_s: float, due: list[str] | None = None, **extra: str
) -> dict[str, Any]:
    """Beat's driver for ``job``: queue its users in tasks of ``task`` (``maintenance.fanout``). A claim
    lapses a little before the next driver run, so whatever a task left undone is sent again then; a task
    still queued when its claim lapses is dropped (``expires``), its users already being sent again."""
    from engram_workers.maintenance.fanout import drive

    claim_s = 0.9 * interval_s

    def send(chunk: Chunk) -> object:
        kwargs = {"user_ids": chunk.user_ids, "claim": chunk.claim, **extra}
        return app.send_task(task, kwargs=kwargs, queue=keys.queue_for(task), expires=claim_s)

    report = drive(job=job, client=ctx.redis, graph=ctx.graph, send=send, claim_s=claim_s, due=due)
    return report.model_dump(mode="json")


def _released(ctx: WorkerResources, job: Job, user_ids: list[str] | None, claim: int | None, report: Any) -> None:
    """A fanned-out task's users come off the job's to-do set once visited (``fanout.release``)."""
    from engram_workers.maintenance.fanout import Chunk, release

    if claim is not None and user_ids:
        release(ctx.redis, Chunk(job=job, user_ids=user_ids, claim=claim), report.failed)


@app.task(name=keys.DECAY_TASK)
def decay_task(
    user_ids: list[str] | None = None, now: str | None = None, claim: int | None = None, fan_out: bool = False
) -> dict[str, Any]:
    """``fan_out`` (Beat): queue the users with a fact due (``decay_users``) in tasks; ``claim``: one such
    task; neither: run here."""
    from engram_workers.maintenance import decay_users, run_decay

    ctx = get_resources()
    when = datetime.fromisoformat(now) if now else utcnow()
    if fan_out:
        due = decay_users(ctx.graph, ctx.settings, when)
        return _fan_out(ctx, "decay", keys.DECAY_TASK, ctx.settings.decay_interval_s, due, now=when.isoformat())
    report = run_decay(graph=ctx.graph, settings=ctx.settings, guard=_guard(ctx), now=when, user_ids=user_ids)
    _released(ctx, "decay", user_ids, claim, report)
    return report.model_dump(mode="json")


@app.task(name=keys.HIERARCHY_TASK)
def hierarchy_task(
    user_ids: list[str] | None = None, claim: int | None = None, fan_out: bool = False
) -> dict[str, Any]:
    """``fan_out`` (Beat): queue the users written since the last run; ``claim``: one such task."""
    from engram_workers.maintenance import rebuild_hierarchy

    ctx = get_resources()
    if fan_out:
        return _fan_out(ctx, "hierarchy", keys.HIERARCHY_TASK, ctx.settings.hierarchy_interval_s)
    report = rebuild_hierarchy(
        graph=ctx.graph, keeper=ctx.keeper, embedder=ctx.embedder, settings=ctx.settings, guard=_guard(ctx),
        user_ids=user_ids,
    )  # fmt: skip
    _released(ctx, "hierarchy", user_ids, claim, report)
    return report.model_dump(mode="json")


@app.task(name=keys.WEIGHTS_TASK)
def weights_task(user_ids: list[str] | None = None) -> dict[str, Any]:
    from engram_workers.maintenance import learn_weights

    ctx = get_resources()
    report = learn_weights(graph=ctx.graph, settings=ctx.settings, guard=_guard(ctx), user_ids=user_ids)
    return report.model_dump(mode="json")


@app.task(name=keys.RECONCILE_TASK)
def reconcile_task(
    user_ids: list[str] | None = None, claim: int | None = None, fan_out: bool = False
) -> dict[str, Any]:
    """``fan_out`` (Beat): remove orphaned artefacts, then queue the users written since the last run;
    ``claim``: one such task (its users only, no orphan sweep)."""
    from engram_workers.maintenance import reconcile, remove_orphans

    ctx = get_resources()
    if fan_out:
        orphans = remove_orphans(graph=ctx.graph, keeper=ctx.keeper, redis_client=ctx.redis, guard=_guard(ctx))
        driven = _fan_out(ctx, "reconcile", keys.RECONCILE_TASK, ctx.settings.reconcile_interval_s)
        counts = orphans.model_dump(mode="json", include={"orphan_files", "orphan_stamps", "failed"})
        return {**driven, **counts, "failed": driven["failed"] + counts["failed"]}
    report = reconcile(
        graph=ctx.graph, keeper=ctx.keeper, guard=_guard(ctx), user_ids=user_ids, redis_client=ctx.redis,
        embedder=ctx.embedder, settings=ctx.settings, orphans=claim is None,
    )  # fmt: skip
    _released(ctx, "reconcile", user_ids, claim, report)
    return report.model_dump(mode="json")


@app.task(name=keys.REEMBED_TASK)
def reembed_task(user_ids: list[str] | None = None, claim: int | None = None, fan_out: bool = False) -> dict[str, Any]:
    """``fan_out`` (Beat): queue the users with a chunk of another chunk-vector policy (``reembed_users``;
    one read once the store records the settings' policy); ``claim``: one such task; neither: run here
    (every such user, then the store's record)."""
    from engram_workers.maintenance import reembed_users, run_reembed

    ctx = get_resources()
    if fan_out:
        due = reembed_users(ctx.graph, ctx.settings)
        return _fan_out(ctx, "reembed", keys.REEMBED_TASK, ctx.settings.reembed_interval_s, due)
    report = run_reembed(
        graph=ctx.graph, embedder=ctx.embedder, settings=ctx.settings, guard=_guard(ctx), user_ids=user_ids
    )
    _released(ctx, "reembed", user_ids, claim, report)
    return report.model_dump(mode="json")


@app.task(name=keys.REDELIVER_TASK)
def redeliver_task(older_than_s: float | None = None) -> dict[str, Any]:
    from engram_workers.maintenance import redeliver_stuck

    ctx = get_resources()
    threshold = ctx.settings.visibility_timeout_s if older_than_s is None else older_than_s
    retention = timedelta(days=ctx.settings.dead_letter_retention_days)
    report = redeliver_stuck(
        client=ctx.redis, send=ctx.dispatch, older_than_s=threshold, dead_letter_retention=retention
    )
    return report.model_dump(mode="json")
