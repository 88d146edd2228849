"""The extract -> apply hand-over carries the slim-context query vector, and apply uses it only when it is
its own model's vector for the very text it needs.

The stages run in this process (``run_extract`` with the LLM stand-in, ``run_apply``) on real Redis and
a real graph store (Neo4j and SQLite); the real MiniLM encodes, behind a wrapper that only records the
texts each stage asks it for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from engram_api import keys
from engram_api.errors import StoreUnavailableError
from engram_api.models import Envelope, MessageState, StageOutcome
from engram_api.versions import read_stamp
from engram_workers.resources import WorkerResources
from engram_workers.stages.apply import run_apply
from engram_workers.stages.common import RetryLater
from engram_workers.stages.extract import read_prompt_inputs, run_extract
from engram_workers.stages.handover import CarriedVectors, HandOver, text_key
from tests.support.extractions import entity, fact
from tests.support.memory import Recording, memory, scripted_stack
from tests.support.stack import Stack

T0 = datetime(2024, 5, 1, tzinfo=UTC)
FIRST = "I live in Lisbon and I walk along the river every evening."
SECOND = "My sister Maya is a nurse in Porto. She visits me twice a year."
ANSWERS = {
    FIRST: {
        "entities": [entity("N1", "Lisbon", "Place")],
        "facts": [
            fact("user", "LIVES_IN", "N1", "User lives in Lisbon"),
            fact("user", "LIKES", None, "User likes walks"),
        ],
    },
    SECOND: {
        "entities": [entity("N1", "Maya", "Person", aliases=["my sister"]), entity("N2", "Porto", "Place")],
        "facts": [
            fact("user", "HAS_SISTER", "N1", "User has a sister named Maya"),
            fact("N1", "WORKS_AS", None, "Maya is a nurse"),
            fact("N1", "LIVES_IN", "N2", "Maya lives in Porto"),
        ],
    },
}


@pytest.fixture(params=["neo4j", "sqlite"])
def stack(request: pytest.FixtureRequest, redis_url: str, llm_standin: Any, tmp_path_factory: Any) -> Iterator[Stack]:
    yield from scripted_stack(
        request, redis_url=redis_url, llm_standin=llm_standin, tmp_path_factory=tmp_path_factory,
        answers=ANSWERS, name="handover",
    )  # fmt: skip


class FailingOnce:
    """The real graph store, whose next commit of a planned write, once armed, fails as an outage would."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.armed = self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def apply(self, plan: Any) -> Any:
        if self.armed and not self.failed:
            self.failed = True
            raise StoreUnavailableError("injected outage at the commit")
        return self._real.apply(plan)


def process(stack: Stack) -> tuple[WorkerResources, Recording]:
    """A worker process's resources in this process, its embedder recorded; tasks are not published."""
    ctx = stack.worker_resources(dispatch=lambda _task, _args: None)
    recording = Recording(ctx.embedder)
    ctx.__dict__["embedder"] = recording  # before anything (the query batcher, the keeper) takes the real one
    return ctx, recording


def new_user() -> str:
    return f"ho_{uuid.uuid4().hex[:10]}"


def extract(ctx: WorkerResources, stack: Stack, user: str, mid: str, text: str, day: int) -> None:
    stack.client.enqueue(user, text, message_id=mid, timestamp=T0 + timedelta(days=day))
    assert run_extract(ctx, user, mid).outcome is StageOutcome.LLM


def apply(ctx: WorkerResources, user: str, mid: str) -> StageOutcome:
    outcome = run_apply(ctx, user, mid)
    assert ctx.redis.hget(keys.status(user, mid), "state") == MessageState.APPLIED, outcome
    return outcome.outcome


def handed_over(stack: Stack, user: str, mid: str) -> HandOver:
    stored = stack.client.redis.get(keys.extraction(user, mid))
    assert stored is not None
    return HandOver.model_validate_json(stored)


def test_apply_does_not_encode_the_text_whose_vector_extract_handed_over(stack: Stack) -> None:
    ctx, recorded = process(stack)
    user = new_user()
    extract(ctx, stack, user, "m0", FIRST, 0)
    assert handed_over(stack, user, "m0").vectors is None  # a new user: no slim context, nothing encoded
    apply(ctx, user, "m0")

    recorded.calls.clear()
    extract(ctx, stack, user, "m1", SECOND, 1)
    assert recorded.calls == [[SECOND]]  # the slim-context query, the message's one chunk
    carried = handed_over(stack, user, "m1").vectors
    assert carried is not None
    assert (carried.model, carried.dim, carried.keys) == (ctx.embedder.model_name, ctx.embedder.dim, [text_key(SECOND)])

    recorded.calls.clear()
    apply(ctx, user, "m1")
    assert len(recorded.calls) == 1 and SECOND not in recorded.texts()  # names and statements, one batch
    assert "Maya is a nurse" in recorded.texts()
    stored = memory(stack, user)[("episode", SECOND)]
    assert np.allclose(stored, carried.for_texts(ctx.embedder, [SECOND])[SECOND], atol=1e-6)


def test_a_chunk_that_answers_an_earlier_turn_is_embedded_with_it_and_not_from_the_hand_over(stack: Stack) -> None:
    ctx, recorded = process(stack)
    user = new_user()
    extract(ctx, stack, user, "m0", FIRST, 0)
    apply(ctx, user, "m0")
    question = {"role": "assistant", "content": "Who in your family works in a hospital?"}
    stack.client.enqueue(user, SECOND, message_id="m1", timestamp=T0 + timedelta(days=1), earlier=[question])
    assert run_extract(ctx, user, "m1").outcome is StageOutcome.LLM
    assert handed_over(stack, user, "m1").vectors is None  # the query's vector is not the chunk's: not carried

    recorded.calls.clear()
    apply(ctx, user, "m1")
    embedded = f"{SECOND}\n(replying to assistant: {question['content']})"
    assert embedded in recorded.texts() and len(recorded.calls) == 1
    stored = memory(stack, user)[("episode", SECOND)]  # the keyword document and the text shown: the words
    assert np.allclose(stored, ctx.embedder.encode([embedded])[0], atol=1e-5)
    assert not np.allclose(stored, ctx.embedder.encode([SECOND])[0], atol=1e-2)


def _foreign(model: str, dim: int) -> CarriedVectors:
    """Another model's vector for SECOND: unrelated numbers, which would show in the memory if used."""
    vector = np.random.default_rng(7).standard_normal(dim).astype("<f4")
    return CarriedVectors(model=model, dim=dim, keys=[text_key(SECOND)], data=vector.tobytes())


@pytest.mark.parametrize(
    "variant", ["no vectors (older producer)", "another model", "another dimension", "unreadable vectors"]
)
def test_a_hand_over_without_usable_vectors_is_encoded_afresh_to_the_same_memory(stack: Stack, variant: str) -> None:
    ctx, recorded = process(stack)
    carried_user, other_user = new_user(), new_user()
    for user in (carried_user, other_user):
        extract(ctx, stack, user, "m0", FIRST, 0)
        apply(ctx, user, "m0")
        extract(ctx, stack, user, "m1", SECOND, 1)
    handed = handed_over(stack, other_user, "m1")
    assert handed.vectors is not None
    if variant == "no vectors (older producer)":
        # Exactly what extract stored before vectors were carried.
        stored = json.dumps(
            {"extraction": handed.extraction.model_dump(mode="json"), "usage": handed.usage.model_dump()}
        )
    elif variant == "unreadable vectors":  # e.g. a newer format: one row short of its keys
        record = json.loads(handed.model_dump_json())
        record["vectors"]["keys"].append(text_key("another text"))
        stored = json.dumps(record)
    else:
        model, dim = ("another/model", 384) if variant == "another model" else (ctx.embedder.model_name, 8)
        stored = handed.model_copy(update={"vectors": _foreign(model, dim)}).model_dump_json()
    stack.client.redis.set(keys.extraction(other_user, "m1"), stored)

    recorded.calls.clear()
    apply(ctx, carried_user, "m1")
    assert SECOND not in recorded.texts()
    recorded.calls.clear()
    apply(ctx, other_user, "m1")
    assert SECOND in recorded.texts() and len(recorded.calls) == 1  # still one batch, the chunk in it

    carried, afresh = memory(stack, carried_user), memory(stack, other_user)
    assert carried.keys() == afresh.keys() and ("episode", SECOND) in carried
    for key, vector in carried.items():
        assert np.allclose(vector, afresh[key], atol=1e-5), key


def test_a_redelivered_apply_uses_the_same_carried_vectors_and_writes_once(stack: Stack) -> None:
    ctx, recorded = process(stack)
    outage = FailingOnce(ctx.graph)
    ctx.__dict__["graph"] = outage  # before the keeper and the user writes take the real store
    user = new_user()
    extract(ctx, stack, user, "m0", FIRST, 0)
    apply(ctx, user, "m0")
    extract(ctx, stack, user, "m1", SECOND, 1)
    saved = {
        key: stack.client.redis.get(key) for key in (keys.extraction(user, "m1"), keys.message_payload(user, "m1"))
    }

    recorded.calls.clear()
    outage.armed = True
    with pytest.raises(RetryLater):  # planned with the carried vector, the commit failed: nothing written
        run_apply(ctx, user, "m1")
    assert outage.failed and not ctx.graph.is_applied(user, "m1")
    assert apply(ctx, user, "m1") is StageOutcome.APPLIED  # the retry reads the same hand-over
    assert SECOND not in recorded.texts()
    after_first = memory(stack, user)

    # Delivered again after its bookkeeping was lost (a crash between the commit and the status write).
    for key, value in saved.items():
        assert value is not None
        stack.client.redis.set(key, value)
    stack.client.redis.hset(keys.status(user, "m1"), "state", MessageState.EXTRACTED.value)
    recorded.calls.clear()
    assert apply(ctx, user, "m1") is StageOutcome.ALREADY
    assert recorded.calls == []

    again = memory(stack, user)
    assert again.keys() == after_first.keys()
    assert all(np.array_equal(again[k], after_first[k]) for k in again)
    assert stack.client.stats(user).episodes == 2


class CountingStamps:
    """The real graph store, counting the stamp reads asked of it."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.stamps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def user_stamp(self, user_id: str) -> Any:
        self.stamps += 1
        return self._real.user_stamp(user_id)


def test_extract_takes_the_published_stamp_read_with_the_message_and_asks_the_graph_only_without_one(
    stack: Stack,
) -> None:
    ctx, _ = process(stack)
    counting = CountingStamps(ctx.graph)
    ctx.__dict__["graph"] = counting  # before the keeper and the user writes take the real store
    user = new_user()
    extract(ctx, stack, user, "m0", FIRST, 0)
    assert counting.stamps == 1  # a new user: nothing published, and the graph says it has no memory yet
    apply(ctx, user, "m0")
    published = read_stamp(ctx.redis, user)
    assert published is not None and published == counting._real.user_stamp(user)

    counting.stamps = 0
    extract(ctx, stack, user, "m1", SECOND, 1)
    assert counting.stamps == 0
    assert handed_over(stack, user, "m1").vectors is not None  # the context was read: its query vector went along
    apply(ctx, user, "m1")  # the user's next message is extracted once this one is applied (its turn)
    published, counting.stamps = read_stamp(ctx.redis, user), 0

    # The same context either way; with the stamp gone from Redis (expired, a Redis restarted empty), the
    # graph is asked.
    stack.client.enqueue(user, FIRST, message_id="m2", timestamp=T0 + timedelta(days=2))
    envelope = Envelope.model_validate_json(stack.client.redis.get(keys.message_payload(user, "m2")))
    from_redis = read_prompt_inputs(ctx, envelope, published)
    assert counting.stamps == 0 and "Lisbon" in [e.name for e in from_redis.slim.entities]
    stack.client.redis.delete(keys.user_version(user))
    counting.stamps = 0
    assert run_extract(ctx, user, "m2").outcome is StageOutcome.LLM
    assert counting.stamps == 1
    asked = read_prompt_inputs(ctx, envelope)
    assert (asked.slim, asked.earlier) == (from_redis.slim, from_redis.earlier)


def test_a_redelivered_extract_whose_answer_is_stored_asks_for_apply_again_without_a_model_call(
    stack: Stack, llm_standin: Any
) -> None:
    """A worker that died after storing the answer but before its apply task went out: the redelivered
    extract finds the stored answer, publishes apply again (RE_HANDED) and calls no model; apply then writes."""
    sent: list[tuple[str, tuple[str, ...]]] = []
    ctx = stack.worker_resources(dispatch=lambda task, args: sent.append((task, tuple(args))))
    user = new_user()
    extract(ctx, stack, user, "m1", FIRST, 0)
    assert sent == [(keys.APPLY_TASK, (user, "m1"))]  # this publish is the one the dead worker never made
    calls = len(llm_standin.requests)
    assert run_extract(ctx, user, "m1").outcome is StageOutcome.RE_HANDED
    assert sent == [(keys.APPLY_TASK, (user, "m1"))] * 2 and len(llm_standin.requests) == calls
    assert apply(ctx, user, "m1") is StageOutcome.APPLIED
    assert [f.object_name for f in stack.client.history(user, "user", "LIVES_IN")] == ["Lisbon"]
