"""Apply stage (its own queue): one message's extraction -> consolidated graph write + FAISS update.

One writer per user across the fleet (a ``UserWrite``: renewed lease, and a graph write fenced on the
stamp the plan was built on, re-planned when refused); the graph write is one transaction, idempotent by
message id; the FAISS index follows the graph's stamp; the stamp in Redis is published last so readers'
caches see the change. A crash between any two steps is repaired by redelivery: the graph says the
message is applied, and the rest is finished from there. The extraction arrives as a ``HandOver``
(``engram_workers.handover``); vectors extract already encoded in it are not encoded again. With
``apply_batch`` > 1 the lease holder also applies the user's other ready messages, each in its own
transaction, sharing one encoder call and one finish (``engram_workers.stages.batch``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engram_api import keys
from engram_api.errors import StoreUnavailableError, UserBusyError
from engram_api.models import ApplyOutcome, Envelope, Extraction, MessageState, StageOutcome, StageResult, Usage
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.consolidation import Planned, plan_message
from engram_workers.handover import CarriedVectors, HandOver
from engram_workers.middleware import Middleware
from engram_workers.resources import WorkerResources
from engram_workers.stages.batch import Claim, Member, apply_batch, mark_applied, summary
from engram_workers.stages.common import (
    RetryLater,
    backoff,
    dead_letter,
    load_envelope,
    read_stored,
    set_state,
)

__all__ = ["Written", "hand_over", "run_apply", "write_extraction"]

# A Neo4j outage of several minutes must not dead-letter anything: ~40 tries with backoff capped at 15 s.
_STORE_ATTEMPTS = 40


def hand_over(ctx: WorkerResources, user_id: str, message_id: str) -> None:
    """Publish the apply task for a message whose extraction is stored."""
    ctx.dispatch(keys.APPLY_TASK, (user_id, message_id))


@dataclass(frozen=True)
class Written:
    """What ``write_extraction`` did: the graph's outcome and the plan it wrote (or found already written)."""

    outcome: ApplyOutcome
    planned: Planned


def write_extraction(
    *,
    write: UserWrite,
    graph: GraphStore,
    embedder: Embedder,
    middleware: Sequence[Middleware],
    envelope: Envelope,
    extraction: Extraction,
    usage: Usage,
    carried: CarriedVectors | None = None,
) -> Written:
    """One message's extraction into the user's memory: plan against the graph, one graph transaction
    (idempotent by message id: ``outcome.applied`` is False when the graph already had it), the
    ``after_write`` hooks, then ``write.finish`` (FAISS index, published stamp, caches). ``carried``: the
    vectors extract handed over (texts it already encoded), used when they come from our model.

    Runs inside the user's ``UserWrite`` (its fence refuses the graph write with ``StaleWriteError`` when
    another writer moved the user since ``write`` opened; ``UserWrites.run`` then plans again). The stage
    runs it; tests that write memory without a fleet run it too, so they follow the stage step by step.
    """
    user_id, message_id = envelope.user_id, envelope.message_id
    planned = plan_message(
        envelope=envelope, extraction=extraction, usage=usage, graph=graph, embedder=embedder, index=write.index(),
        carried=carried,
    )  # fmt: skip
    outcome = graph.apply(planned.plan)
    for m in middleware:
        m.after_write(user_id, message_id, outcome)
    write.finish(upserts=planned.upserts if outcome.applied else ())
    return Written(outcome=outcome, planned=planned)


def _apply_locked(
    ctx: WorkerResources, write: UserWrite, message_id: str, claim: Claim, *, first_start: bool
) -> StageResult:
    graph, user_id = ctx.graph, write.user_id
    # Read under the lease, so a message forgotten before it is never applied (``forget`` waits for it).
    found = read_stored(ctx, user_id, message_id)
    if found.settled is not None:
        return found.settled
    # A later start may follow one that committed and died before marking the message: finish it without
    # planning again. A first start cannot (the write below is idempotent all the same).
    if not first_start and graph.is_applied(user_id, message_id):
        mark_applied(ctx, user_id, message_id, write.finish().version)
        return StageResult(StageOutcome.ALREADY, "applied (finished bookkeeping)")
    if found.payload is None:
        return StageResult(StageOutcome.FORGOTTEN, "no payload")
    envelope = Envelope.model_validate_json(found.payload)
    if found.extraction is None:
        set_state(ctx, user_id, message_id, MessageState.QUEUED)
        ctx.dispatch(keys.EXTRACT_TASK, (user_id, message_id))
        return StageResult(StageOutcome.SENT_BACK, "extraction missing")
    handed = HandOver.model_validate_json(found.extraction)
    if ctx.settings.apply_batch > 1:
        return apply_batch(ctx, write, Member(envelope, handed), claim)

    written = write_extraction(
        write=write, graph=graph, embedder=ctx.embedder, middleware=ctx.middleware,
        envelope=envelope, extraction=handed.extraction, usage=handed.usage, carried=handed.vectors,
    )  # fmt: skip
    mark_applied(ctx, user_id, message_id, write.stamp.version)
    outcome = StageOutcome.APPLIED if written.outcome.applied else StageOutcome.ALREADY
    return StageResult(outcome, summary(written.outcome, written.planned.plan))


def run_apply(ctx: WorkerResources, user_id: str, message_id: str, *, first_start: bool = False) -> StageResult:
    """Apply one message (and, batching, its user's other ready ones) under the user's lease. A task
    reaches here only for a message neither finished nor forgotten (``tasks``: ``Delivery.settled``);
    under the lease both are read again. ``first_start``: no earlier apply of this message started
    (``Delivery.first``), so the graph cannot hold it yet and is not asked (one store read less), and the
    write is fenced on the user's published stamp (``UserWrites.run``: another read less)."""
    try:
        ctx.warm_up()
        claim = Claim()  # the batch members this task takes, kept when a fenced write re-plans
        return ctx.writes.run(
            user_id,
            lambda write: _apply_locked(ctx, write, message_id, claim, first_start=first_start),
            wait=0.2,
            # A later start may follow a writer that died between its commit and its publish; it must
            # finish from the graph's stamp, so only a first start trusts the published one.
            published=first_start,
        )
    except UserBusyError:
        raise RetryLater(random.uniform(0.05, 0.4), "another worker is applying this user's messages") from None
    except StoreUnavailableError as exc:
        attempts = ctx.ledger.count(user_id, message_id, "store_attempts")
        if attempts >= _STORE_ATTEMPTS:
            return dead_letter(
                ctx,
                load_envelope(ctx, user_id, message_id),
                user_id=user_id,
                message_id=message_id,
                stage="apply",
                reason=f"graph store unavailable {attempts} times: {exc}",
                attempts=attempts,
            )
        raise RetryLater(backoff(attempts, base=0.5, cap=15.0), f"graph store unavailable: {exc}") from exc
