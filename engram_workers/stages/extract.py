"""Extract stage (I/O bound, threads pool): message -> validated ``Extraction``, then hand to apply.

Trivial messages skip the LLM; with no ``LLM_MODEL`` the offline rule-based extractor runs instead. The
LLM path goes through the fleet-wide rate limit and circuit breaker, one litellm call, JSON validated by
pydantic. Transient failures retry with backoff and jitter; after ``llm_max_attempts`` the message is
dead-lettered with the reason and the raw answer. The extraction is stored in Redis before the apply task
is published, so a retried apply never calls the LLM again. When the message is one chunk, its
slim-context query is that chunk's text, and the vector goes with the extraction (``engram_workers.stages.handover``):
apply then does not encode the chunk again, unless the chunk's vector carries an earlier turn (``chunk_embed_context``).

A message of the LLM path is extracted only while it holds its user's turn (``engram_api.ledger.turns``, on
by ``extract_in_order``): the user's messages reach the model one at a time in event-time order, each after
the one before it is applied, so each prompt shows the facts of every message before it. A message that
finds the turn taken ends its task as WAITING; the message that passes the turn on sends it again. Trivial
and rules messages read no context and take no turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from engram_api import keys, tracing
from engram_api.errors import BreakerOpenError, LLMError, StoreUnavailableError
from engram_api.models import Envelope, EpisodeRecord, Extraction, MessageState, StageOutcome, StageResult, Usage
from engram_api.naming import SINGLE_VALUED, self_entity_id
from engram_api.storage.graph.episodes import EmbedContext, chunk_envelope, embedded_texts
from engram_api.versions import ABSENT, Stamp
from engram_workers import metrics
from engram_workers.extraction.llm import Completion, LLMAnswer, call_llm
from engram_workers.extraction.prompt import SlimContext, build_prompt, is_owner_turn
from engram_workers.extraction.rules import extract_rules
from engram_workers.extraction.trivial import answers_a_question, is_trivial
from engram_workers.resources import WorkerResources
from engram_workers.stages.common import (
    RetryLater,
    backoff,
    dead_letter,
    is_forgotten,
    read_stored,
    set_state,
)
from engram_workers.stages.handover import HandOver

__all__ = ["run_extract"]

_CONTEXT_ITEMS = 8


def _query(envelope: Envelope, embed_context: EmbedContext) -> tuple[str, bool]:
    """The slim-context query text, and whether apply embeds that very text (as the message's one chunk)."""
    chunks = chunk_envelope(envelope)
    if len(chunks) == 1:
        # The same words as the whole text: chunking only folds whitespace, which the tokenizer ignores.
        return chunks[0].text, embedded_texts(envelope, chunks, embed_context)[0] == chunks[0].text
    return envelope.text[:2000], False


@dataclass(frozen=True)
class PromptInputs:
    """What a message's prompt is built from, read in one store call: the slim context, the earlier turns,
    and the vectors encoded on the way that apply will need (they go with the hand-over)."""

    slim: SlimContext
    earlier: list[EpisodeRecord]
    vectors: dict[str, np.ndarray]


def read_prompt_inputs(ctx: WorkerResources, envelope: Envelope, published: Stamp | None = None) -> PromptInputs:
    """The user's most similar existing entities and current facts, plus the owner's current one-value
    facts (home, employer, ...) whatever the similarity, so "I quit" can name the fact it ends; and the
    user's last ``llm_context_turns`` episodes unless the producer sent its own earlier turns.

    ``published``: the user's stamp as writers last published it (read with the message, no round trip
    of its own), else the graph is asked. It may trail the graph by a write in progress, as a reader's
    does; the index it selects is then at that version or newer, and the inputs are a prompt's hint,
    which apply's consolidation checks against the graph anyway."""
    uid = envelope.user_id
    stamp = published if published is not None else ctx.graph.user_stamp(uid)
    if stamp == ABSENT:  # a user the store has never seen has no memory and no earlier episodes
        return PromptInputs(SlimContext(), [], {})
    index = ctx.keeper.current(uid, stamp)
    text, apply_needs_it = _query(envelope, ctx.settings.chunk_embed_context)
    query = ctx.queries.encode_one(text)
    hits = index.search(query, _CONTEXT_ITEMS * 2)
    turns = 0 if envelope.earlier else ctx.settings.llm_context_turns  # the producer's turns are the context
    read = ctx.graph.extraction_context(
        uid,
        entity_ids=[h.node_id for h in hits if h.kind == "entity"][:_CONTEXT_ITEMS],
        fact_ids=[h.node_id for h in hits if h.kind == "fact"][:_CONTEXT_ITEMS],
        slots=[(self_entity_id(uid), p) for p in sorted(SINGLE_VALUED)],
        before=envelope.timestamp,
        turns=turns,
    )
    own = [f for f in read.slot_facts if f.current_at(None)][:_CONTEXT_ITEMS]
    similar = [f for f in read.facts if f.current_at(None)]
    facts = list({f.id: f for f in [*own, *similar]}.values())
    return PromptInputs(
        SlimContext.from_records(read.entities, facts), read.episodes, {text: query} if apply_needs_it else {}
    )


def _llm_extract(
    ctx: WorkerResources, envelope: Envelope, published: Stamp | None
) -> tuple[LLMAnswer, dict[str, np.ndarray]]:
    """The resolved answer, and the vectors encoded on the way that apply will need."""
    inputs = read_prompt_inputs(ctx, envelope, published)
    prompt = build_prompt(envelope, inputs.slim, inputs.earlier)

    def admit(call: Callable[[], Completion]) -> Completion:
        # The slot is taken right before each call (the first and a parse-error retry), so the preparation
        # above cannot bunch calls together; the breaker sees every call the model gets.
        if not ctx.rate_limiter.acquire(max_wait=5.0):
            raise RetryLater(1.0, "fleet-wide LLM rate limit")
        return ctx.breaker.call(call)

    answer = call_llm(ctx.settings, prompt.messages, admit=admit, names=prompt.names)
    # Stored with ids, not handles: apply (and a replay) never needs this prompt again.
    return replace(answer, extraction=prompt.resolve(answer.extraction)), inputs.vectors


def _hand_over(ctx: WorkerResources, user_id: str, message_id: str) -> None:
    """Publish the apply task of a message whose extraction is stored: the stages hand over to each other
    through ``ctx.dispatch`` only (apply sends a message back the same way)."""
    ctx.dispatch(keys.APPLY_TASK, (user_id, message_id))


def _store_and_hand_over(
    ctx: WorkerResources,
    envelope: Envelope,
    extraction: Extraction,
    usage: Usage,
    vectors: Mapping[str, np.ndarray] | None = None,
) -> bool:
    """Store the extraction (with ``vectors`` apply would otherwise encode) and hand over; False (nothing
    stored) when the message was forgotten meanwhile."""
    uid, mid = envelope.user_id, envelope.message_id
    handed = HandOver.carrying(extraction, usage, ctx.embedder, vectors or {})
    # Per-message spend stays on the status hash; per-user totals accumulate in the graph on apply.
    stored = set_state(
        ctx, uid, mid, MessageState.EXTRACTED, extraction=handed.model_dump_json(),
        event_time=envelope.timestamp.timestamp(),
        prompt_tokens=str(usage.prompt_tokens), completion_tokens=str(usage.completion_tokens),
        cost_usd=f"{usage.cost_usd:.8f}", **tracing.status_fields(),
    )  # fmt: skip
    if stored:
        _hand_over(ctx, uid, mid)
    return stored


_FORGOTTEN = StageResult(StageOutcome.FORGOTTEN)


def run_extract(ctx: WorkerResources, user_id: str, message_id: str) -> StageResult:
    found = read_stored(ctx, user_id, message_id, published=True)
    if found.settled is not None:
        return found.settled
    if found.extraction is not None:
        # Extracted before a crash or redelivery: just make sure apply runs (apply is idempotent).
        _hand_over(ctx, user_id, message_id)
        return StageResult(StageOutcome.RE_HANDED, "extraction stored before, apply asked again")
    if found.payload is None:
        return _payload_gone(ctx, user_id, message_id)
    envelope = Envelope.model_validate_json(found.payload)

    # The user's own words: an assistant's "I love helping!" is not a fact about the user.
    said = "\n".join(m.content for m in envelope.messages if is_owner_turn(m, envelope.owner_name))
    # No person spoke (an assistant's or a tool's turn alone): nothing a model could learn about anyone.
    nobody = not any(m.role == "user" for m in envelope.messages)
    if nobody or (is_trivial(said or envelope.text) and not answers_a_question(envelope)):
        stored = _store_and_hand_over(ctx, envelope, Extraction(), Usage())
        return StageResult(StageOutcome.TRIVIAL) if stored else _FORGOTTEN
    if ctx.settings.offline_extractor:
        extraction = extract_rules(said, event_time=envelope.timestamp)
        stored = _store_and_hand_over(ctx, envelope, extraction, Usage())
        return StageResult(StageOutcome.RULES, f"{len(extraction.facts)} facts") if stored else _FORGOTTEN
    if ctx.settings.extract_in_order:
        # The model is shown the user's facts: an earlier message must be applied before this one reads them.
        taken = ctx.ledger.turns.take(user_id, message_id, envelope.timestamp.timestamp())
        if not taken.granted:
            return StageResult(
                StageOutcome.WAITING, "parked: an earlier message of the user goes first"
            )  # no id: logs keep none
        # Read again under the turn: an earlier message may have been applied since the read above (the
        # prompt must show its facts), and this one forgotten (it passes the turn it just took on).
        found = read_stored(ctx, user_id, message_id, published=True)
        if found.settled is not None:
            ctx.ledger.turns.pass_on(user_id, message_id)
            return found.settled
    try:
        answer, vectors = _llm_extract(ctx, envelope, found.published)
    except StoreUnavailableError as exc:
        # The slim-context lookup needs the graph store: an outage is a wait, not a failed message.
        raise RetryLater(backoff(2, base=1.0, cap=15.0), str(exc)) from exc
    except BreakerOpenError as exc:
        raise RetryLater(exc.retry_in + random.uniform(0, ctx.settings.breaker_reset_s / 4), str(exc)) from None
    except LLMError as exc:
        return _failed(ctx, envelope, exc)
    _count_usage(answer.usage)
    if not _store_and_hand_over(ctx, envelope, answer.extraction, answer.usage, vectors):
        return _FORGOTTEN
    return StageResult(StageOutcome.LLM, f"{len(answer.extraction.facts)} facts")


def _payload_gone(ctx: WorkerResources, user_id: str, message_id: str) -> StageResult:
    """No payload: forgotten, applied long ago, or expired while it waited. Only the last is a failure,
    and it must not pass silently: it is dead-lettered with that reason (the text is gone, so the letter
    cannot be replayed; the producer has to send the message again)."""
    if is_forgotten(ctx, user_id, message_id):
        return _FORGOTTEN
    if ctx.graph.is_applied(user_id, message_id):
        return StageResult(StageOutcome.ALREADY, MessageState.APPLIED)
    return dead_letter(
        ctx,
        None,
        user_id=user_id,
        message_id=message_id,
        stage="extract",
        reason=f"payload expired: the message waited longer than status_ttl_s ({ctx.settings.status_ttl_s} s)",
        attempts=0,
    )


def _count_usage(usage: Usage) -> None:
    metrics.LLM_TOKENS.labels(kind="prompt").inc(usage.prompt_tokens)
    metrics.LLM_TOKENS.labels(kind="completion").inc(usage.completion_tokens)
    metrics.LLM_COST.inc(usage.cost_usd)


def _failed(ctx: WorkerResources, envelope: Envelope, exc: LLMError) -> StageResult:
    uid, mid = envelope.user_id, envelope.message_id
    if is_forgotten(ctx, uid, mid):
        return _FORGOTTEN
    attempts = ctx.ledger.count(uid, mid, "llm_attempts")
    # Tokens spent on failed answers are real spend too.
    usage = getattr(exc, "usage", None)
    if usage is not None:
        ctx.ledger.add(uid, mid, "failed_cost_usd", usage.cost_usd)
        _count_usage(usage)
    if attempts >= ctx.settings.llm_max_attempts:
        return dead_letter(
            ctx,
            envelope,
            user_id=uid,
            message_id=mid,
            stage="extract",
            reason=f"LLM failed {attempts} times; last: {exc}",
            attempts=attempts,
            raw_llm=exc.raw,
        )
    hinted = getattr(exc, "retry_after", None)
    raise RetryLater(hinted if hinted else backoff(attempts), str(exc)) from exc
