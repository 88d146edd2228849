"""Apply micro-batching (``engram_workers.stages.batch``): the lease holder applies a user's ready messages
in one go, to the same memory as applying them one by one, with one encoder call and one index record.

The stages run in this process (``run_extract`` with the LLM stand-in, ``run_apply``) on real Redis and a
real graph store (Neo4j and SQLite); apply tasks are not published, so each test decides which task runs.
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
from engram_api.models import ApplyOutcome, MessageState, StageOutcome, StageResult
from engram_api.storage.graph.contract import GraphStore
from engram_workers.middleware import Hooks, Middleware
from engram_workers.resources import WorkerResources
from engram_workers.stages.apply import run_apply
from engram_workers.stages.common import deliveries
from engram_workers.stages.extract import run_extract
from tests.support.extractions import entity, fact, lives_in
from tests.support.memory import Recording, memory, scripted_stack
from tests.support.stack import Stack

T0 = datetime(2024, 3, 1, tzinfo=UTC)
SEED = "I live in Tampa and I work as a nurse."
# Event-time order; later messages restate, supersede and re-name what earlier ones said (in one batch).
MESSAGES = [
    "My sister Maya lives in Porto.",
    "I love hiking in the mountains.",
    "I moved to Austin last week.",
    "Maya took me hiking: I love hiking in the mountains.",
    "Maya moved to Lisbon.",
    "I started playing chess with Maya.",
]
ANSWERS: dict[str, dict[str, Any]] = {
    SEED: {
        "entities": [entity("N1", "Tampa", "Place")],
        "facts": [
            fact("user", "LIVES_IN", "N1", "User lives in Tampa"),
            fact("user", "WORKS_AS", None, "User works as a nurse"),
        ],
    },
    MESSAGES[0]: {
        "entities": [entity("N1", "Maya", "Person", aliases=["my sister"]), entity("N2", "Porto", "Place")],
        "facts": [
            fact("user", "HAS_SISTER", "N1", "User has a sister named Maya"),
            fact("N1", "LIVES_IN", "N2", "Maya lives in Porto"),
        ],
    },
    MESSAGES[1]: {
        "entities": [entity("N1", "hiking", "Activity")],
        "facts": [fact("user", "LIKES", "N1", "User loves hiking in the mountains")],
    },
    MESSAGES[2]: lives_in("Austin"),
    MESSAGES[3]: {
        "entities": [entity("N1", "Maya", "Person"), entity("N2", "hiking", "Activity")],
        "facts": [
            fact("user", "LIKES", "N2", "User loves hiking in the mountains"),
            fact("N1", "HIKES_WITH", "user", "Maya hikes with the user"),
        ],
    },
    MESSAGES[4]: {
        "entities": [entity("N1", "Maya", "Person"), entity("N2", "Lisbon", "Place")],
        "facts": [fact("N1", "LIVES_IN", "N2", "Maya lives in Lisbon")],
    },
    MESSAGES[5]: {
        "entities": [entity("N1", "chess", "Game"), entity("N2", "Maya", "Person")],
        "facts": [
            fact("user", "PLAYS", "N1", "User plays chess"),
            fact("user", "PLAYS_WITH", "N2", "User plays chess with Maya"),
        ],
    },
}


@pytest.fixture(params=["neo4j", "sqlite"])
def stack(request: pytest.FixtureRequest, redis_url: str, llm_standin: Any, tmp_path_factory: Any) -> Iterator[Stack]:
    yield from scripted_stack(
        request, redis_url=redis_url, llm_standin=llm_standin, tmp_path_factory=tmp_path_factory,
        answers=ANSWERS, name="batch",
    )  # fmt: skip


def process(stack: Stack, batch: int) -> tuple[WorkerResources, Recording]:
    """A worker process's resources in this process (``apply_batch=batch``), its embedder recorded. Its
    extractions do not wait for their user's turn (``extract_in_order`` off): these tests queue several
    model-path messages of one user ready to apply at once, which turns allow only one at a time."""
    settings = stack.settings.model_copy(update={"apply_batch": batch, "extract_in_order": False})
    ctx = stack.worker_resources(settings, dispatch=lambda _task, _args: None)
    recording = Recording(ctx.embedder)
    ctx.__dict__["embedder"] = recording
    return ctx, recording


class Counting:
    """Forwards to the real object and counts calls of one method (the FAISS file's delta appends)."""

    def __init__(self, real: Any, method: str) -> None:
        self._real, self._method, self.calls = real, method, 0

    def __getattr__(self, name: str) -> Any:
        if name == self._method:
            self.calls += 1
        return getattr(self._real, name)


def queue(ctx: WorkerResources, stack: Stack, user: str) -> list[str]:
    """The seed applied, then every message extracted (ready to apply, with the vectors extract carries)."""
    stack.client.enqueue(user, SEED, message_id="seed", timestamp=T0)
    run_extract(ctx, user, "seed")
    assert run_apply(ctx, user, "seed").outcome is StageOutcome.APPLIED
    mids = [f"m{i}" for i in range(len(MESSAGES))]
    for i, (mid, text) in enumerate(zip(mids, MESSAGES, strict=True)):
        stack.client.enqueue(user, text, message_id=mid, timestamp=T0 + timedelta(days=10 * (i + 1)))
        assert run_extract(ctx, user, mid).outcome is StageOutcome.LLM
    return mids


def snapshot(stack: Stack, user: str) -> list[Any]:
    """The user's export with every id replaced by what it names and the clock fields dropped: two users
    told the same messages must come out equal."""
    lines = [json.loads(line) for line in stack.client.export_memory(user)]
    names: dict[str, str] = {user: "USER"}
    for row in lines[1:]:
        label = row.get("statement") or row.get("name") or row.get("text") or row["id"]
        if row["id"] != label:
            names[row["id"]] = f"{row['type']}:{label}"
    text = json.dumps(lines[1:], sort_keys=True)
    for raw, label in names.items():
        text = text.replace(json.dumps(raw), json.dumps(label))
    volatile = {"created_at", "updated_at", "embedding", "exported_at", "last_decay_at"}

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in sorted(value.items()) if k not in volatile}
        if isinstance(value, list):
            return sorted((scrub(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
        return value

    return scrub(json.loads(text))


def assert_same_memory(stack: Stack, one: str, other: str) -> None:
    assert snapshot(stack, one) == snapshot(stack, other)
    mine, theirs = memory(stack, one), memory(stack, other)
    assert mine.keys() == theirs.keys()
    for key, vector in mine.items():
        assert np.allclose(vector, theirs[key], atol=1e-5), key


def test_a_batch_applies_queued_messages_to_the_same_memory_as_one_by_one(stack: Stack) -> None:
    single, batched = f"b1_{uuid.uuid4().hex[:8]}", f"b8_{uuid.uuid4().hex[:8]}"
    ctx1, _ = process(stack, 1)
    mids = queue(ctx1, stack, single)
    for mid in mids:
        assert run_apply(ctx1, single, mid).outcome is StageOutcome.APPLIED

    ctx8, recorded = process(stack, 8)
    assert queue(ctx8, stack, batched) == mids
    assert stack.client.redis.zrange(keys.ready(batched), 0, -1) == mids  # event-time order
    appends = Counting(ctx8.keeper.vectors, "append")
    ctx8.keeper.vectors = appends  # type: ignore[assignment]
    recorded.calls.clear()
    result = run_apply(ctx8, batched, "m0")
    assert result.outcome is StageOutcome.APPLIED and f"batch of {len(mids)}/{len(mids)}" in result.detail
    assert len(recorded.calls) == 1  # every member's names, statements and chunks: one encoder call
    assert appends.calls == 1  # one delta record for the whole batch
    for mid in mids:
        assert stack.client.redis.hget(keys.status(batched, mid), "state") == MessageState.APPLIED
    # Each member's own task arrives later: nothing left to do.
    assert {run_apply(ctx8, batched, mid).outcome for mid in mids[1:]} == {StageOutcome.ALREADY}
    assert stack.client.redis.exists(keys.ready(batched)) == 0

    assert_same_memory(stack, single, batched)
    history = stack.client.history(batched, "user", "LIVES_IN")
    assert [(h.object_name, h.valid_until is None) for h in history] == [("Tampa", False), ("Austin", True)]
    statements = [f.statement for f in _facts(stack.client.graph, batched)]
    assert statements.count("User loves hiking in the mountains") == 1  # reinforced, not stored twice


def _facts(graph: GraphStore, user: str) -> list[Any]:
    items, _ = graph.vectors(user)
    return graph.get_facts(user, [i.node_id for i in items if i.kind == "fact"])


class FailsFor:
    """The real graph store, whose commit of one message's plan raises (a poison message)."""

    def __init__(self, real: Any, message_id: str) -> None:
        self._real, self.message_id = real, message_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def apply(self, plan: Any) -> ApplyOutcome:
        if plan.episode.id == self.message_id:
            raise RuntimeError("injected poison")
        return self._real.apply(plan)


@pytest.mark.parametrize("poison", ["m2", "m0"], ids=["a-member", "the-trigger"])
def test_a_poison_member_is_isolated_and_left_to_its_own_task(stack: Stack, poison: str) -> None:
    user = f"bp_{uuid.uuid4().hex[:8]}"
    ctx, _ = process(stack, 8)
    mids = queue(ctx, stack, user)
    ctx.__dict__["graph"] = FailsFor(ctx.graph, poison)
    if poison == "m0":  # the triggering message keeps its own error: raised, after the rest is finished
        with pytest.raises(RuntimeError, match="injected poison"):
            run_apply(ctx, user, "m0")
    else:
        assert run_apply(ctx, user, "m0").outcome is StageOutcome.APPLIED
    graph = stack.client.graph
    for mid in mids:
        state = stack.client.redis.hget(keys.status(user, mid), "state")
        assert (state, graph.is_applied(user, mid)) == (
            (MessageState.EXTRACTED, False) if mid == poison else (MessageState.APPLIED, True)
        ), mid
    # Not handed to another batch: only its own task (still failing here) touches it.
    assert stack.client.redis.zscore(keys.ready(user), poison) is None
    with pytest.raises(RuntimeError, match="injected poison"):
        run_apply(ctx, user, poison)
    healthy, _ = process(stack, 8)
    assert run_apply(healthy, user, poison).outcome is StageOutcome.APPLIED
    memory(stack, user)  # the index holds exactly what the graph holds


class ForgetsDuringBatch(Middleware):
    """When the batch reaches ``at`` (its ``before_stage``), forget ``victim`` (as a user's ``forget`` call
    would, from another process): earlier members are written, the victim is not planned yet."""

    def __init__(self, stack: Stack, user: str, at: str, victim: str) -> None:
        self.stack, self.user, self.at, self.victim = stack, user, at, victim

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        if message_id == self.at:
            from engram_api.ledger.erasure import erase_message

            erase_message(self.stack.client.redis, self.user, self.victim, tombstone_ttl_s=600)


def test_a_forgotten_member_is_never_applied_by_a_batch(stack: Stack) -> None:
    user = f"bf_{uuid.uuid4().hex[:8]}"
    ctx, _ = process(stack, 8)
    mids = queue(ctx, stack, user)
    stack.client.forget(user, "m1")  # before the batch: tombstone, payload and extraction gone
    ctx.__dict__["hooks"] = Hooks([ForgetsDuringBatch(stack, user, at="m3", victim="m4")])  # during it
    assert run_apply(ctx, user, "m0").outcome is StageOutcome.APPLIED
    graph = stack.client.graph
    assert {mid for mid in mids if graph.is_applied(user, mid)} == set(mids) - {"m1", "m4"}
    for mid in ("m1", "m4"):
        assert stack.client.redis.exists(keys.status(user, mid)) == 0
        assert run_apply(ctx, user, mid).outcome is StageOutcome.FORGOTTEN
    memory(stack, user)


def test_a_start_is_counted_only_for_a_message_left_to_do_and_reads_its_state_with_the_count(stack: Stack) -> None:
    """``deliveries``: one script counts the start and reads the state and tombstone; a finished or forgotten
    message's start is not counted (its task has nothing to do) and the stage's answer is given."""
    user, r = f"bd_{uuid.uuid4().hex[:8]}", stack.client.redis
    ctx, _ = process(stack, 1)
    counter, status = keys.deliveries(user, "m1", "apply"), keys.status(user, "m1")
    r.hset(status, "state", MessageState.EXTRACTED)
    with deliveries(ctx, user, "m1", "apply") as first:
        assert (first.crashed, first.settled, first.first, r.get(counter)) == (0, None, True, "1")
    assert r.get(counter) == "0"  # it finished
    with deliveries(ctx, user, "m1", "apply") as retried:
        assert (retried.crashed, retried.first) == (0, False)  # a start came before (a retry, a redelivery)
    r.set(counter, 2)  # two starts died on it
    with deliveries(ctx, user, "m1", "apply") as again:
        assert again.crashed == 2 and again.settled is None and not again.first
    with deliveries(ctx, user, "m1", "extract") as other_stage:
        assert other_stage.first  # counted per stage
    for state in (MessageState.APPLIED, MessageState.DEAD):
        r.hset(status, "state", state)
        with deliveries(ctx, user, "m1", "apply") as settled:
            assert settled.settled == StageResult(StageOutcome.ALREADY, state)
        assert r.get(counter) == "2"  # not counted, nothing to undo
    r.hset(status, "state", MessageState.EXTRACTED)
    r.set(keys.forgotten(user, "m1"), 1)
    with deliveries(ctx, user, "m1", "apply") as forgotten:
        assert forgotten.settled == StageResult(StageOutcome.FORGOTTEN)
    assert r.get(counter) == "2"


class CountingReads:
    """The real graph store, counting ``is_applied`` reads."""

    def __init__(self, real: GraphStore) -> None:
        self._real, self.asked = real, 0

    def is_applied(self, user_id: str, message_id: str) -> bool:
        self.asked += 1
        return self._real.is_applied(user_id, message_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_first_apply_does_not_ask_the_graph_whether_it_is_applied_and_a_later_one_does(stack: Stack) -> None:
    """``Delivery.first`` (no earlier apply of the message started): the graph cannot hold the message yet,
    so the stage does not ask; a later start asks, and finishes a message the graph holds without planning
    it again. Were a first start ever wrong (a counter expired with the status TTL, a restored backup), the
    graph write's own idempotency answers, and nothing is written twice."""
    user = f"bf_{uuid.uuid4().hex[:8]}"
    ctx, recorded = process(stack, 1)
    reads = CountingReads(ctx.graph)
    ctx.__dict__["graph"] = reads  # before the keeper and the user writes take the real store
    mids = queue(ctx, stack, user)
    assert reads.asked == 1  # the seed's apply, run as a later start (the default)
    reads.asked = 0
    r = stack.client.redis
    saved = {key: r.get(key) for key in (keys.extraction(user, mids[0]), keys.message_payload(user, mids[0]))}
    assert run_apply(ctx, user, mids[0], first_start=True).outcome is StageOutcome.APPLIED
    assert reads.asked == 0

    def bookkeeping_lost() -> None:  # the graph holds m0, a crash came between the commit and the status write
        for key, value in saved.items():
            assert value is not None
            r.set(key, value)
        r.hset(keys.status(user, mids[0]), "state", MessageState.EXTRACTED.value)

    bookkeeping_lost()
    version = stack.client.graph.user_version(user)
    recorded.calls.clear()
    assert run_apply(ctx, user, mids[0]).outcome is StageOutcome.ALREADY  # a later start: asked, not planned
    assert reads.asked == 1 and recorded.calls == []
    bookkeeping_lost()
    result = run_apply(ctx, user, mids[0], first_start=True)  # wrongly first: planned, and the write refused
    assert result.outcome is StageOutcome.ALREADY and reads.asked == 1
    assert stack.client.graph.user_version(user) == version and stack.client.stats(user).episodes == 2


class Peeks(Middleware):
    """When the batch reaches ``at``, records which messages another connection sees applied."""

    def __init__(self, graph: GraphStore, at: str, mids: list[str]) -> None:
        self.graph, self.at, self.mids = graph, at, mids
        self.seen: set[str] | None = None

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        if message_id == self.at:
            self.seen = {mid for mid in self.mids if self.graph.is_applied(user_id, mid)}


def test_on_neo4j_a_batch_commits_its_members_in_one_transaction(stack: Stack) -> None:
    """Neo4j: nobody sees a member before the whole batch commits (one commit per batch). SQLite: each
    member is committed before the next is planned (its write lock is the whole file's)."""
    user = f"bt_{uuid.uuid4().hex[:8]}"
    ctx, _ = process(stack, 8)
    mids = queue(ctx, stack, user)
    peek = Peeks(stack.client.graph, at=mids[-1], mids=mids)
    ctx.__dict__["hooks"] = Hooks([peek])
    assert run_apply(ctx, user, "m0").outcome is StageOutcome.APPLIED
    assert peek.seen == (set() if stack.settings.neo4j_uri else set(mids[:-1]))
    assert all(stack.client.graph.is_applied(user, mid) for mid in mids)
    memory(stack, user)


class StageHooks(Middleware):
    """Records the stage hooks the batch runs for its members; ``before_stage`` raises for ``refuse``."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, str]] = []

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        self.calls.append(("before", message_id))
        if message_id == self.refuse:
            raise RuntimeError("injected before_stage failure")

    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: Any, seconds: float) -> None:
        self.calls.append((f"after:{outcome.outcome.value}", message_id))


def test_members_pass_their_own_stage_hooks_and_a_member_that_killed_a_worker_is_not_batched(stack: Stack) -> None:
    user = f"bh_{uuid.uuid4().hex[:8]}"
    ctx, _ = process(stack, 8)
    mids = queue(ctx, stack, user)
    hooks = StageHooks(refuse="m3")
    ctx.__dict__["hooks"] = Hooks([hooks])
    stack.client.redis.set(keys.deliveries(user, "m5", "apply"), 1)  # an earlier start of m5 never finished
    assert run_apply(ctx, user, "m0").outcome is StageOutcome.APPLIED  # the trigger's hooks are its task's
    batched = ["m1", "m2", "m4"]
    assert hooks.calls == [
        ("before", "m1"), ("before", "m2"), ("before", "m3"), ("before", "m4"),
        *(("after:applied", mid) for mid in batched),
    ]  # fmt: skip
    graph = stack.client.graph
    assert [mid for mid in mids if graph.is_applied(user, mid)] == ["m0", *batched]
    for mid in batched:  # applied: their delivery counters went with the apply, nothing counts against them
        assert stack.client.redis.get(keys.deliveries(user, mid, "apply")) is None
    assert stack.client.redis.get(keys.deliveries(user, "m5", "apply")) == "1"


def test_the_ready_set_drops_dead_lettered_and_forgotten_users_messages(stack: Stack) -> None:
    from engram_api.models import DeadLetter

    user = f"br_{uuid.uuid4().hex[:8]}"
    ctx, _ = process(stack, 8)
    mids = queue(ctx, stack, user)
    ready = keys.ready(user)
    assert ctx.ledger.dead_letter(DeadLetter(user_id=user, message_id="m3", stage="apply", reason="test", attempts=1))
    assert stack.client.redis.zscore(ready, "m3") is None and stack.client.redis.zcard(ready) == len(mids) - 1
    stack.client.forget_user(user)
    assert stack.client.redis.exists(ready) == 0
    assert run_apply(ctx, user, "m0").outcome is StageOutcome.FORGOTTEN
    assert not any(stack.client.graph.is_applied(user, mid) for mid in mids)
