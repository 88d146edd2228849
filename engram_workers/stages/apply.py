"""Apply stage (its own queue): one message's extraction -> consolidated graph write + FAISS update.

One writer per user across the fleet (``user_lock``); the graph write is one transaction, idempotent by
message id; the FAISS index follows the graph's version; the per-user version in Redis is bumped last so
readers' caches see the change. A crash between any two steps is repaired by redelivery: the graph says
the message is applied, and the rest is finished from there.
"""

from __future__ import annotations

import json
import random

from engram_api import keys
from engram_api.errors import StoreUnavailableError, UserBusyError
from engram_api.locks import user_lock
from engram_api.models import Extraction, MessageState, Usage
from engram_api.versions import publish_version
from engram_workers.consolidation import plan_message
from engram_workers.context import WorkerContext
from engram_workers.stages.common import (
    RetryLater,
    backoff,
    dead_letter,
    load_envelope,
    set_state,
    state_of,
)

__all__ = ["hand_over", "run_apply"]

# A Neo4j outage of several minutes must not dead-letter anything: ~40 tries with backoff capped at 15 s.
_STORE_ATTEMPTS = 40


def hand_over(ctx: WorkerContext, user_id: str, message_id: str) -> None:
    """Publish the apply task for a message whose extraction is stored."""
    ctx.dispatch(keys.APPLY_TASK, (user_id, message_id))


def _finish(ctx: WorkerContext, user_id: str, message_id: str, version: int) -> None:
    publish_version(ctx.redis, user_id, version)
    set_state(ctx, user_id, message_id, MessageState.APPLIED, version=str(version))
    ctx.redis.delete(keys.message_payload(user_id, message_id), keys.extraction(user_id, message_id))


def _apply_locked(ctx: WorkerContext, user_id: str, message_id: str) -> str:
    graph = ctx.graph
    if graph.is_applied(user_id, message_id):
        version = graph.user_version(user_id)
        ctx.keeper.current(user_id, version)
        _finish(ctx, user_id, message_id, version)
        return "already applied (finished bookkeeping)"
    envelope = load_envelope(ctx, user_id, message_id)
    stored = ctx.redis.get(keys.extraction(user_id, message_id))
    if envelope is None:
        return "no payload (forgotten)"
    if stored is None:
        set_state(ctx, user_id, message_id, MessageState.QUEUED)
        ctx.dispatch(keys.EXTRACT_TASK, (user_id, message_id))
        return "extraction missing: sent back to extract"
    data = json.loads(stored)
    extraction = Extraction.model_validate(data["extraction"])
    usage = Usage.model_validate(data["usage"])

    before = graph.user_version(user_id)
    index = ctx.keeper.current(user_id, before)
    planned = plan_message(
        envelope=envelope, extraction=extraction, usage=usage, graph=graph, embedder=ctx.embedder, index=index
    )
    outcome = graph.apply(planned.plan)
    for m in ctx.middleware:
        m.after_write(user_id, message_id, outcome)
    if outcome.applied:
        ctx.keeper.advance(user_id, from_version=before, to_version=outcome.version, upserts=planned.upserts)
    else:
        ctx.keeper.current(user_id, outcome.version)
    _finish(ctx, user_id, message_id, outcome.version)
    plan = planned.plan
    return (
        f"applied v{outcome.version}: +{len(plan.new_entities)} entities, +{len(plan.new_facts)} facts, "
        f"{len(plan.fact_changes)} superseded, {len(plan.reinforced_fact_ids)} reinforced"
    )


def run_apply(ctx: WorkerContext, user_id: str, message_id: str) -> str:
    state = state_of(ctx, user_id, message_id)
    if state in (MessageState.APPLIED, MessageState.DEAD):
        return f"already {state}"
    try:
        with user_lock(ctx.redis, user_id, ttl=ctx.settings.apply_lock_ttl_s, wait=0.2):
            return _apply_locked(ctx, user_id, message_id)
    except UserBusyError:
        raise RetryLater(random.uniform(0.05, 0.4), "another worker is applying this user's messages") from None
    except StoreUnavailableError as exc:
        attempts = int(ctx.redis.hincrby(keys.status(user_id, message_id), "store_attempts", 1))
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
