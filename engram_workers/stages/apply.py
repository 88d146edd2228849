"""Apply stage (its own queue): a message's extraction -> consolidated graph write + FAISS update.

One writer per user across the fleet (a ``UserWrite``: renewed lease, and a graph write fenced on the
stamp the plan was built on, re-planned when refused); the graph write is one transaction, idempotent by
message id; the FAISS index follows the graph's stamp; the stamp in Redis is published last so readers'
caches see the change. A crash between any two steps is repaired by redelivery: the graph says the
message is applied, and the rest is finished from there. The extraction arrives as a ``HandOver``
(``engram_workers.stages.handover``); vectors extract already encoded in it are not encoded again. There is one
apply path: the lease holder applies the message as a batch with up to ``apply_batch - 1`` of the user's
other ready messages, each in its own transaction (or one shared where the store can), sharing one
encoder call and one finish (``stages.batch``, ``stages.writing``); a message alone is a batch of one.

Invariants:
- The message's stored state, payload and extraction are read under the lease: one forgotten or finished
  before then is never applied here. A message whose extraction is missing goes back to extract through
  ``ctx.dispatch`` (stages hand over to each other only through it, never by importing each other).
- A graph store outage is retried with backoff (``_STORE_ATTEMPTS`` tries, minutes) before the message
  is dead-lettered; a busy lease is retried soon.
"""

from __future__ import annotations

import random

from engram_api import keys
from engram_api.errors import StoreUnavailableError, UserBusyError
from engram_api.models import Envelope, MessageState, StageOutcome, StageResult
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.metrics import LEASE_BUSY
from engram_workers.resources import WorkerResources
from engram_workers.stages.batch import Claim, apply_batch, mark_applied
from engram_workers.stages.common import (
    RetryLater,
    backoff,
    dead_letter,
    load_envelope,
    read_stored,
    set_state,
)
from engram_workers.stages.handover import HandOver
from engram_workers.stages.writing import Member

__all__ = ["run_apply"]

# A Neo4j outage of several minutes must not dead-letter anything: ~40 tries with backoff capped at 15 s.
_STORE_ATTEMPTS = 40


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
    return apply_batch(
        ctx,
        write,
        Member.handed(envelope, HandOver.model_validate_json(found.extraction), ctx.settings.chunk_embed_context),
        claim,
    )


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
        LEASE_BUSY.inc()
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
