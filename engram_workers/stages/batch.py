"""Apply micro-batching: the holder of a user's write lease applies up to ``apply_batch`` of the user's ready
messages (``keys.ready``: extraction stored, not applied) in event-time order, under one lease.

What a batch shares is the per-message fixed cost: ONE encoder call for every text of every member (with
the vectors extract handed over), ONE ``write.finish`` at the end (one FAISS delta record, one published
stamp, one cache drop). What it does not share is anything a message's correctness rests on.

Where the store can (``GraphStore.batched`` yields True: Neo4j), every member's write is also in ONE graph
transaction, committed once after the last member (the per-commit work is most of a write's server CPU).
If anything in that transaction fails (a member's plan or write, or the commit), all of it rolls back and
the batch is replayed one transaction per member, the path described below, so a failure there has
exactly the effects it has without sharing. Otherwise (SQLite, whose write lock is the whole file's) each
member commits on its own.

Invariants:
- Each member is idempotent by message id, with its own status (APPLIED, its version), provenance and
  ``after_write`` hooks (run once its write is committed). Member i+1 is planned against the graph as
  member i left it (in a shared transaction, reads see its uncommitted writes) and an in-memory copy of the
  index holding i's upserts (dedup, entity resolution, supersession see it); nothing reaches the index
  file before ``finish``, which writes the upserts of exactly the members whose write committed.
- Members are claimed (removed from the ready set) once per task, before anything is planned, and kept
  across re-plans (``StaleWriteError`` re-runs the batch under a fresh lease). A claimed member is never
  handed to another batch: a batch that dies (a SIGKILL mid-batch, a member that kills the process) costs
  no message, because every member still has its own apply task, which applies it alone or finds it applied.
- A member that raises is skipped and left to its own task (its normal retry and dead-letter path); the
  others go on, and what committed is finished. The triggering message keeps its own error semantics: its
  exception is raised after the rest is finished. A store outage stops the batch (the rest would fail too).
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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from engram_api.errors import StaleWriteError, StoreUnavailableError
from engram_api.models import ApplyOutcome, Envelope, MessageState, StageOutcome, StageResult, WritePlan
from engram_api.storage.faiss.files import Kind, UserIndex
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.consolidation import message_texts, plan_message
from engram_workers.handover import HandOver
from engram_workers.resolution import Vectors
from engram_workers.resources import WorkerResources
from engram_workers.stages.common import deliveries, set_state

__all__ = ["Claim", "Member", "apply_batch", "mark_applied", "summary"]

log = logging.getLogger("engram.pipeline")


@dataclass(frozen=True)
class Member:
    """One message of a batch: its envelope and the extraction extract handed over."""

    envelope: Envelope
    handed: HandOver

    @property
    def message_id(self) -> str:
        return self.envelope.message_id


@dataclass
class Claim:
    """The ready messages one apply task took from its user's set: taken once, kept across re-plans."""

    ids: list[str] | None = None

    def take(self, ctx: WorkerResources, user_id: str, trigger: str, others: int) -> list[str]:
        if self.ids is None:
            self.ids = ctx.ledger.claim_ready(user_id, trigger, others)
        return self.ids


def summary(outcome: ApplyOutcome, plan: WritePlan) -> str:
    return (
        f"v{outcome.version}, +{len(plan.new_entities)} entities, +{len(plan.new_facts)} facts, "
        f"{len(plan.fact_changes)} superseded, {len(plan.reinforced_fact_ids)} reinforced"
    )


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
            members.append(Member(Envelope.model_validate_json(payload), HandOver.model_validate_json(stored)))
        except ValidationError as exc:
            log.warning("apply batch: %s left to its own task (unreadable: %s)", mid, type(exc).__name__)
    return members


@dataclass
class _Progress:
    """What the batch wrote so far: the members whose transaction committed (or found it committed) with
    their results and seconds, the index upserts of those that applied, and the trigger's outcome or error."""

    done: dict[str, tuple[StageResult, float]] = field(default_factory=dict)
    upserts: list[tuple[str, Kind, Sequence[float]]] = field(default_factory=list)
    trigger_error: Exception | None = None
    stopped: bool = False  # a store outage: nothing more is planned


@dataclass
class _Run:
    """One pass over a batch under one lease: the encoded texts and the batch's own copy of the index.
    ``shared``: the members' writes are in one store transaction (see the module docstring); then any
    member's error is raised (the transaction must roll back) and ``after_write`` waits for ``commit``."""

    ctx: WorkerResources
    write: UserWrite
    vectors: Vectors
    index: UserIndex
    shared: bool
    progress: _Progress = field(default_factory=_Progress)
    copied: bool = False
    uncommitted: list[tuple[str, ApplyOutcome, WritePlan, float]] = field(default_factory=list)

    def all(self, members: list[Member], trigger: Member) -> None:
        for member in members:
            if self.progress.stopped:
                break
            if member is trigger:
                self.apply(member, is_trigger=True)
            else:
                self.member(member)

    def apply(self, member: Member, *, is_trigger: bool) -> None:
        """Plan ``member`` against the graph and index as they are now and write it."""
        ctx, mid, started = self.ctx, member.message_id, time.perf_counter()
        try:
            planned = plan_message(
                envelope=member.envelope, extraction=member.handed.extraction, usage=member.handed.usage,
                graph=ctx.graph, embedder=ctx.embedder, index=self.index, vectors=self.vectors,
            )  # fmt: skip
            outcome = ctx.graph.apply(planned.plan)
        except StaleWriteError:
            raise  # another writer moved the user: the whole batch is planned again from fresh reads
        except Exception as exc:
            if self.shared:
                raise
            self._failed(mid, exc, is_trigger)
            self.progress.stopped = isinstance(exc, StoreUnavailableError)
            return
        if outcome.applied:
            # The next member must see this one's vectors. The keeper's cached index is shared with readers
            # and never mutated: the batch changes its own copy (the base is shared, the overlay cloned once).
            if not self.copied:
                self.index, self.copied = self.index.copy(), True
            self.index.upsert(planned.upserts)
            self.progress.upserts.extend(planned.upserts)
        if self.shared:
            self.uncommitted.append((mid, outcome, planned.plan, started))
        else:
            self._written(mid, outcome, planned.plan, started, is_trigger)

    def commit(self, trigger: str) -> None:
        """The shared transaction committed: each member's ``after_write`` and result, in order."""
        for mid, outcome, plan, started in self.uncommitted:
            self._written(mid, outcome, plan, started, mid == trigger)
        self.uncommitted.clear()

    def _written(self, mid: str, outcome: ApplyOutcome, plan: WritePlan, started: float, is_trigger: bool) -> None:
        try:
            for m in self.ctx.middleware:
                m.after_write(self.write.user_id, mid, outcome)
        except Exception as exc:  # as in a single apply: committed, its status left to a retry (own task)
            self._failed(mid, exc, is_trigger)
            return
        done = StageOutcome.APPLIED if outcome.applied else StageOutcome.ALREADY
        self.progress.done[mid] = (StageResult(done, summary(outcome, plan)), time.perf_counter() - started)

    def _failed(self, mid: str, exc: Exception, is_trigger: bool) -> None:
        if is_trigger:
            self.progress.trigger_error = exc
        else:
            log.warning("apply batch: %s left to its own task (%s)", mid, type(exc).__name__)

    def member(self, member: Member) -> None:
        """A member other than the trigger, as its own task would take it: counted as a delivery (a batch
        that dies on it leaves the count up, so a message that kills workers is dead-lettered all the same,
        and never batched again; its tombstone and state are read with the count), between its own
        ``before_stage`` and ``after_stage``."""
        ctx, user_id, mid = self.ctx, self.write.user_id, member.message_id
        with deliveries(ctx, user_id, mid, "apply") as delivery:
            if delivery.settled is not None or delivery.crashed:
                return
            try:
                for m in ctx.middleware:
                    m.before_stage("apply", user_id, mid)
            except Exception as exc:
                self._failed(mid, exc, is_trigger=False)
                return
            self.apply(member, is_trigger=False)


def apply_batch(ctx: WorkerResources, write: UserWrite, trigger: Member, claim: Claim) -> StageResult:
    """Apply ``trigger`` and up to ``apply_batch - 1`` more ready messages of its user (see the module
    docstring); returns the trigger's result or raises its error, after finishing what committed."""
    user_id = write.user_id
    others = _load(ctx, user_id, claim.take(ctx, user_id, trigger.message_id, ctx.settings.apply_batch - 1))
    members = sorted([trigger, *others], key=lambda m: (m.envelope.timestamp, m.message_id))
    texts = [t for m in members for t in message_texts(m.envelope, m.handed.extraction)]
    vectors = Vectors(ctx.embedder, texts, [m.handed.vectors for m in members])

    def fresh(shared: bool) -> _Run:
        return _Run(ctx=ctx, write=write, vectors=vectors, index=write.index(), shared=shared)

    shared = False
    try:
        with ctx.graph.batched() as shared:
            run = fresh(shared)
            run.all(members, trigger)
    except (StaleWriteError, StoreUnavailableError):
        raise  # re-planned under a fresh lease / the trigger's retry path: nothing of the batch committed
    except Exception as exc:
        if not shared:
            raise
        log.info("apply batch of %d rolled back (%s): one transaction per member", len(members), type(exc).__name__)
        run = fresh(False)
        run.all(members, trigger)
    run.commit(trigger.message_id)
    return _finish(ctx, write, trigger.message_id, len(members), run.progress)


def _finish(ctx: WorkerResources, write: UserWrite, trigger: str, size: int, progress: _Progress) -> StageResult:
    """One finish for every member that committed, then each one's status and the other members'
    ``after_stage`` (the trigger's runs in its task); the trigger's result or error."""
    user_id = write.user_id
    if progress.done or progress.upserts:
        stamp = write.finish(upserts=progress.upserts)
        for mid in progress.done:
            mark_applied(ctx, user_id, mid, stamp.version)
    for mid, (result, seconds) in progress.done.items():
        if mid == trigger:
            continue
        try:
            for m in ctx.middleware:
                m.after_stage("apply", user_id, mid, result, seconds)
        except Exception as exc:  # its own task runs after_stage again, where the error takes its normal path
            log.warning("apply batch: after_stage of %s failed (%s)", mid, type(exc).__name__)
    if progress.trigger_error is not None:
        raise progress.trigger_error
    if trigger not in progress.done:
        # A store outage stopped the batch before the trigger's turn: the trigger's own retry path.
        raise StoreUnavailableError("the graph store failed earlier in this apply batch")
    result = progress.done[trigger][0]
    if size > 1:
        return StageResult(result.outcome, f"{result.detail}; batch of {len(progress.done)}/{size}")
    return result
