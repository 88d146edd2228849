"""Apply micro-batching: the holder of a user's write lease applies up to ``apply_batch`` of the user's ready
messages (``keys.ready``: extraction stored, not applied) in event-time order, under one lease; with
``apply_batch`` 1, or none other ready, the task's own message is a batch of one. The batch is written by
``stages.writing.write_members`` (one encoder call, one shared transaction where the store can, one finish);
this module is the stage's side of it: which messages, their Redis bookkeeping and their hooks.

Invariants:
- Each member has its own status (APPLIED, with the version ``finish`` left), set only after the one
  ``finish`` of the batch; each member's ``after_stage`` runs after that (the trigger's in its own task).
- Members are claimed (removed from the ready set) once per task, before anything is planned, and kept
  across re-plans (``StaleWriteError`` re-runs the batch under a fresh lease). A claimed member is never
  handed to another batch: a batch that dies (a SIGKILL mid-batch, a member that kills the process) costs
  no message, because every member still has its own apply task, which applies it alone or finds it applied.
- A member that raises is skipped and left to its own task (its normal retry and dead-letter path); the
  others go on, and what committed is finished. The triggering message keeps its own error semantics: its
  exception is raised after the rest is finished.
- A member is processed as its own task would: its delivery counted (``stages.common.deliveries``: a batch
  that dies on it counts as one of its deaths, and a member that ever died is left to its own task, so
  poison is bounded as before), between its ``before_stage`` and ``after_stage`` hooks. Its own task,
  arriving later, finds it APPLIED and answers ALREADY.
- A member's tombstone and state are read with its delivery count, right before it is planned, so a
  message forgotten (or finished) before then is never applied by a batch; one forgotten after its commit
  is removed by ``forget``, which waits for this lease (the same window as a single apply).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import ValidationError

from engram_api.errors import StoreUnavailableError
from engram_api.models import Envelope, MessageState, StageResult
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.resources import WorkerResources
from engram_workers.stages.common import deliveries, set_state
from engram_workers.stages.handover import HandOver
from engram_workers.stages.writing import Member, Written, write_members

__all__ = ["Claim", "apply_batch", "mark_applied"]

log = logging.getLogger("engram.pipeline")


@dataclass
class Claim:
    """The ready messages one apply task took from its user's set: taken once, kept across re-plans."""

    ids: list[str] | None = None

    def take(self, ctx: WorkerResources, user_id: str, trigger: str, others: int) -> list[str]:
        if self.ids is None:
            self.ids = ctx.ledger.claim_ready(user_id, trigger, others)
        return self.ids


def mark_applied(ctx: WorkerResources, user_id: str, message_id: str, version: int) -> None:
    """The message's bookkeeping once the graph holds it and the index and stamp are finished (its payload
    and extraction are deleted in the same script)."""
    set_state(ctx, user_id, message_id, MessageState.APPLIED, version=str(version))


def _load(ctx: WorkerResources, user_id: str, message_ids: list[str]) -> list[Member]:
    """The claimed messages that can be applied: payload and extraction in one round trip. One whose
    payload or extraction is gone (forgotten, expired, sent back) or unreadable is left to its own task."""
    members = []
    for mid, (payload, stored) in zip(message_ids, ctx.ledger.payloads(user_id, message_ids), strict=True):
        if payload is None or stored is None:
            continue
        try:
            members.append(
                Member.handed(
                    Envelope.model_validate_json(payload),
                    HandOver.model_validate_json(stored),
                    ctx.settings.chunk_embed_context,
                )
            )
        except ValidationError as exc:
            log.warning("apply batch: %s left to its own task (unreadable: %s)", mid, type(exc).__name__)
    return members


@contextmanager
def _as_own_task(ctx: WorkerResources, user_id: str, member: Member) -> Iterator[bool]:
    """A member other than the trigger, as its own task would take it: counted as a delivery (a batch that
    dies on it leaves the count up, so a message that kills workers is dead-lettered all the same, and
    never batched again; its tombstone and state are read with the count), after its own ``before_stage``.
    Yields whether to apply it."""
    mid = member.message_id
    with deliveries(ctx, user_id, mid, "apply") as delivery:
        if delivery.settled is not None or delivery.crashed:
            yield False
            return
        failed = ctx.hooks.try_emit("before_stage", "apply", user_id, mid)
        if failed is not None:
            log.warning("apply batch: %s left to its own task (%s)", mid, type(failed).__name__)
        yield failed is None


def apply_batch(ctx: WorkerResources, write: UserWrite, trigger: Member, claim: Claim) -> StageResult:
    """Apply ``trigger`` and up to ``apply_batch - 1`` more ready messages of its user (see the module
    docstring); returns the trigger's result or raises its error, after finishing what committed."""
    user_id = write.user_id
    others = _load(ctx, user_id, claim.take(ctx, user_id, trigger.message_id, ctx.settings.apply_batch - 1))
    members = sorted([trigger, *others], key=lambda m: (m.message.envelope.timestamp, m.message_id))
    written = write_members(
        write, members, trigger=trigger, graph=ctx.graph, embedder=ctx.embedder, hooks=ctx.hooks,
        share=ctx.settings.apply_batch > 1, enter=lambda member: _as_own_task(ctx, user_id, member),
    )  # fmt: skip
    return _settle(ctx, user_id, trigger.message_id, len(members), written)


def _settle(ctx: WorkerResources, user_id: str, trigger: str, size: int, written: Written) -> StageResult:
    """Each finished member's status, then the other members' ``after_stage`` (the trigger's runs in its
    task); the trigger's result or error."""
    if written.stamp is not None:
        for mid in written.done:
            mark_applied(ctx, user_id, mid, written.stamp.version)
    for mid, done in written.done.items():
        if mid == trigger:
            continue
        failed = ctx.hooks.try_emit("after_stage", "apply", user_id, mid, done.result, done.seconds)
        if failed is not None:  # its own task runs after_stage again, where the error takes its normal path
            log.warning("apply batch: after_stage of %s failed (%s)", mid, type(failed).__name__)
    if written.trigger_error is not None:
        raise written.trigger_error
    if trigger not in written.done:
        # A store outage stopped the batch before the trigger's turn: the trigger's own retry path.
        raise StoreUnavailableError("the graph store failed earlier in this apply batch")
    result = written.done[trigger].result
    if size > 1:
        return StageResult(result.outcome, f"{result.detail}; batch of {len(written.done)}/{size}")
    return result
