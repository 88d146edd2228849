"""The ingestion pipeline end to end: real Redis, real Neo4j, real worker processes, the LLM stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from engram_api import keys
from engram_api.models import MessageState
from engram_testing.llm_standin import Reply
from tests.support.extractions import entity, fact, lives_in, message_text
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 1, 10, 12, 0, tzinfo=UTC)
MOVES = [("I live in Tampa.", "Tampa"), ("I moved to Austin.", "Austin"), ("I just moved to Denver.", "Denver")]
SCRIPT = {
    "I live in Tampa.": lives_in("Tampa"),
    "I moved to Austin.": lives_in("Austin"),
    "I just moved to Denver.": lives_in("Denver"),
    "My brother Alex works at Amazon.": {
        "entities": [entity("e1", "Alex", "Person", aliases=["my brother"]), entity("e2", "Amazon", "Company")],
        "facts": [
            fact("user", "HAS_BROTHER", "e1", "User has a brother named Alex", importance=0.7),
            fact("e1", "WORKS_AT", "e2", "Alex works at Amazon", single_valued=True),
        ],
    },
    "I love hiking in the mountains.": {
        "entities": [entity("e1", "hiking", "Activity")],
        "facts": [fact("user", "LIKES", "e1", "User loves hiking in the mountains")],
    },
}


def scripted(request: dict) -> Reply:
    text = message_text(request)
    if text.startswith("fail500"):
        return Reply.error(500)
    if text.startswith("badjson"):
        return Reply(content="{not json at all")
    if text.startswith("hang"):
        return Reply(content="{}", hang=True)
    if text.startswith("user-fact "):
        # "user-fact <n> <topic>": a distinct fact per message, for load tests.
        _, n, topic = text.split(" ", 2)
        return Reply.json(
            {
                "entities": [entity("e1", topic.title(), "Thing")],
                "facts": [fact("user", "LIKES", "e1", f"User likes {topic} number {n}")],
            }
        )
    return Reply.json(SCRIPT.get(text, {"entities": [], "facts": []}))


@pytest.fixture(scope="module")
def stack(redis_url, neo4j_uri, llm_server, tmp_path_factory):
    llm_server.script(scripted)
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("pipeline"),
        neo4j_uri=neo4j_uri,
        llm_url=llm_server.url,
        middleware="tests.support.faults:CrashAfterWriteOnce",
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _script(llm_server):
    llm_server.script(scripted)


def uid() -> str:
    return f"u_{uuid.uuid4().hex[:10]}"


def enqueue_moves(client, user, order):
    receipts = []
    for i in order:
        text, _ = MOVES[i]
        receipts.append(client.enqueue(user, text, message_id=f"{user}-m{i}", timestamp=T0 + timedelta(days=120 * i)))
    return receipts


def lives_in_chain(client, user):
    return [
        (f.object_name, f.valid_from, f.valid_until, f.source_ids) for f in client.history(user, "user", "LIVES_IN")
    ]


def test_tampa_austin_denver_only_denver_is_current(stack):
    client, user = stack.client, uid()
    result = client.wait(enqueue_moves(client, user, [0, 1, 2]), timeout=SETTLE_S)
    assert sorted(result.applied) == [f"{user}-m0", f"{user}-m1", f"{user}-m2"]

    chain = lives_in_chain(client, user)
    assert [c[0] for c in chain] == ["Tampa", "Austin", "Denver"]
    assert chain[0][1] == T0 and chain[0][2] == T0 + timedelta(days=120)
    assert chain[1][1] == T0 + timedelta(days=120) and chain[1][2] == T0 + timedelta(days=240)
    assert chain[2][2] is None
    assert [c[3] for c in chain] == [[f"{user}-m0"], [f"{user}-m1"], [f"{user}-m2"]]
    history = client.history(user, "user", "LIVES_IN")
    assert history[0].superseded_by == history[1].id and history[1].superseded_by == history[2].id

    stats = client.stats(user)
    assert (stats.current_facts, stats.superseded_facts, stats.episodes) == (1, 2, 3)
    top = client.recall(user, "where does the user live?", k=5).items
    statements = " ".join(i.statement for i in top if i.kind == "fact")
    assert "Denver" in statements and "Tampa" not in statements and "Austin" not in statements


def chain_shape(client, user):
    """The LIVES_IN chain with message ids reduced to their move number (users differ, moves do not)."""
    return [
        (name, start, end, [s.split("-m")[1] for s in src]) for name, start, end, src in lives_in_chain(client, user)
    ]


@pytest.mark.parametrize("order", [(2, 1, 0), (0, 2, 1)], ids=["reversed", "late-into-the-middle"])
def test_any_arrival_order_gives_the_same_state(stack, order):
    """Newest first, or the middle move arriving after the last one: one at a time, so each message is
    applied before the next arrives and the history is rebuilt around it."""
    client, forward, shuffled = stack.client, uid(), uid()
    client.wait(enqueue_moves(client, forward, [0, 1, 2]), timeout=SETTLE_S)
    for i in order:
        client.wait(enqueue_moves(client, shuffled, [i]), timeout=SETTLE_S)

    assert chain_shape(client, shuffled) == chain_shape(client, forward)
    history = client.history(shuffled, "user", "LIVES_IN")
    assert [h.object_name for h in history if h.valid_until is None] == ["Denver"]
    assert history[0].superseded_by == history[1].id and history[1].superseded_by == history[2].id


def test_two_users_with_identical_facts_share_nothing(stack):
    client, a, b = stack.client, uid(), uid()
    client.wait([client.enqueue(u, "My brother Alex works at Amazon.") for u in (a, b)], timeout=SETTLE_S)
    page_a, page_b = client.get_graph(a), client.get_graph(b)
    ids_a = {f.id for f in page_a.facts} | {e.id for e in page_a.entities}
    ids_b = {f.id for f in page_b.facts} | {e.id for e in page_b.entities}
    assert ids_a and ids_b and not ids_a & ids_b
    assert all(f.user_id == a for f in page_a.facts) and all(e.user_id == b for e in page_b.entities)
    vectors = client.reader.keeper.vectors
    assert vectors.path_for(a) != vectors.path_for(b)
    chunks_a = {v.node_id for v in client.graph.vectors(a)[0] if v.kind == "episode"}
    assert chunks_a and vectors.load(a).node_ids() == ids_a | chunks_a
    assert vectors.load(b).node_ids().isdisjoint(ids_a | chunks_a)
    for item in client.recall(a, "Alex Amazon brother").items:
        assert item.id in ids_a | chunks_a


def test_message_delivered_twice_after_a_crash_leaves_no_duplicates(stack):
    """The apply worker's pool child dies right after the graph commit (before FAISS, bookkeeping and the
    ack): the message is redelivered and finished without a second node, edge, vector or link."""
    client, user = stack.client, uid()
    receipt = client.enqueue(user, "My brother Alex works at Amazon.", message_id="crash-after-write-1")
    assert client.wait(receipt, timeout=SETTLE_S).applied == ["crash-after-write-1"]
    marker = stack.data_dir / "faults" / f"crashed-{receipt.message_id}"
    assert marker.exists(), "the fault was never injected"

    stats = client.stats(user)
    assert (stats.episodes, stats.facts, stats.entities) == (1, 2, 3)  # User, Alex, Amazon
    page = client.get_graph(user)
    assert len({f.id for f in page.facts}) == len(page.facts) == 2
    assert all(f.source_ids == ["crash-after-write-1"] for f in page.facts)
    vectors, version = client.graph.vectors(user)
    # What a reader searches (its copy, from its file or the graph): each vector once. A redelivered finish
    # loads no copy just to write it (``IndexKeeper.advance``), so a local file is optional; one kept agrees.
    index = client.reader.keeper.current(user, client.graph.user_stamp(user))
    assert index.version == version and len(index) == len(vectors) == 6  # 2 facts, 3 entities, 1 episode chunk
    stored = client.reader.keeper.vectors.load(user)
    assert stored is None or stored.node_ids() == index.node_ids()
    assert Counter(client.graph.vectors(user)[0][i].node_id for i in range(len(vectors))).most_common(1)[0][1] == 1


@pytest.mark.slow
def test_many_users_through_two_processes_match_a_sequential_run(stack, llm_server):
    client = stack.client
    llm_server.latency_s = 0.05
    try:
        users = [uid() for _ in range(20)]
        items = [
            {"user_id": u, "messages": f"user-fact {n} topic{n % 4}", "message_id": f"{u}-{n}",
             "timestamp": T0 + timedelta(minutes=n)}
            for u in users for n in range(10)
        ]  # fmt: skip
        result = client.wait(client.enqueue_many(items), timeout=SETTLE_S)
        assert len(result.applied) == 200 and not result.dead_lettered

        sequential = uid()
        for n in range(10):
            client.wait(
                client.enqueue(sequential, f"user-fact {n} topic{n % 4}", timestamp=T0 + timedelta(minutes=n)),
                timeout=SETTLE_S,
            )
        expected = client.stats(sequential)
        for u in users:
            got = client.stats(u)
            assert (got.facts, got.entities, got.episodes) == (expected.facts, expected.entities, expected.episodes)
    finally:
        llm_server.latency_s = 0.0


@pytest.mark.parametrize("prefix", ["fail500", "badjson", "hang"])
def test_llm_failures_are_retried_then_dead_lettered_and_replayable(stack, llm_server, prefix):
    client, user, other = stack.client, uid(), uid()
    bad = client.enqueue(user, f"{prefix} I live in Tampa.", message_id=f"{user}-bad")
    good = client.enqueue(other, "I live in Tampa.")
    assert client.wait(good, timeout=SETTLE_S).applied == [good.message_id]
    result = client.wait(bad, timeout=SETTLE_S)
    assert result.dead_lettered == [bad.message_id]
    letters = [d for d in client.dead_letters(user) if d.message_id == bad.message_id]
    assert len(letters) == 1 and letters[0].attempts == 3 and letters[0].stage == "extract"
    assert "LLM failed 3 times" in letters[0].reason
    if prefix == "badjson":
        assert letters[0].raw_llm == "{not json at all"

    # The operator fixes the model (here: the script answers properly), then replays.
    llm_server.script(lambda req: Reply.json(lives_in("Tampa")))
    client.wait(client.replay(user, bad.message_id), timeout=SETTLE_S)
    assert [f.object_name for f in client.history(user, "user", "LIVES_IN")] == ["Tampa"]
    assert not [d for d in client.dead_letters(user) if d.message_id == bad.message_id]
    assert client.redis.hget(keys.status(user, bad.message_id), "state") == MessageState.APPLIED


def test_enqueue_touches_neither_llm_nor_graph_store(stack, tmp_path):
    """In a fresh process with the graph store and the LLM pointing at closed ports, enqueue still works
    and neither a graph driver nor litellm is even imported."""
    user = uid()
    code = f"""
import json, sys
from engram_api import MemoryClient
from engram_api.settings import Settings
s = Settings(neo4j_uri="bolt://127.0.0.1:1", llm_model="openai/x", llm_api_base="http://127.0.0.1:1/v1",
             data_dir={str(tmp_path)!r})
c = MemoryClient(settings=s, redis_url={stack.env["REDIS_URL"]!r})
r = c.enqueue({user!r}, "I live in Tampa.", message_id="probe-1")
print(json.dumps({{"task": r.task_id, "mods": sorted(m for m in sys.modules
      if m.split(".")[0] in ("litellm", "neo4j", "sqlite3", "torch", "sentence_transformers", "faiss"))}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SETTLE_S, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["task"] and report["mods"] == []
    # The stack's workers take it from there: the message is real, and so is its user in the shared Neo4j.
    assert stack.client.wait([(user, "probe-1")], timeout=SETTLE_S).applied == ["probe-1"]
    stack.client.forget_user(user)
