"""The read side on real Neo4j + Redis + FAISS, with data ingested through the real pipeline."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram_api import keys
from engram_api.models import LearnedWeights, utcnow
from engram_api.reader.context import EXCERPTS_HEADER
from engram_api.settings import Settings
from engram_api.versions import read_stamp
from engram_testing.llm_standin import Reply
from engram_workers.maintenance import run_decay
from tests.support.extractions import entity, fact, lives_in, message_text
from tests.support.faults import CuttableLink
from tests.support.memory import apply_in_process
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
TOPICS = ["chess", "jazz", "sushi", "tennis", "python", "gardening", "opera", "cycling", "baking", "hiking"]


def _script(text: str) -> dict:
    if text.startswith("I live in "):
        return lives_in(text.removeprefix("I live in ").rstrip("."))
    if text == "My brother is Alex.":
        return {
            "entities": [entity("e1", "Alex", "Person")],
            "facts": [fact("user", "HAS_BROTHER", "e1", "User's brother is Alex", importance=0.7)],
        }
    if text == "Alex got hired at Amazon.":
        return {
            "entities": [entity("e1", "Alex", "Person"), entity("e2", "Amazon", "Organization")],
            "facts": [fact("e1", "WORKS_AT", "e2", "Alex was hired by Amazon", single_valued=True)],
        }
    if text.startswith("distractor "):
        n = int(text.split()[1])
        relatives = ["User's cousin works for a company in Ohio", "User's sister works for a software company",
                     "User's uncle is employed by a bank"]  # fmt: skip
        statement = relatives[n] if n < 3 else f"User's office has {n} meeting rooms"
        return {"entities": [], "facts": [fact("user", "NOTE", None, statement)]}
    if text.startswith("I have a dog named "):
        name = text.removeprefix("I have a dog named ").rstrip(".")
        return {
            "entities": [entity("e1", name, "Pet")],
            "facts": [fact("user", "HAS_PET", "e1", f"User has a dog named {name}")],
        }
    if text.startswith("I enjoy "):
        topic = text.removeprefix("I enjoy ").rstrip(".")
        return {
            "entities": [entity("e1", topic, "Activity")],
            "facts": [fact("user", "LIKES", "e1", f"User enjoys {topic}")],
        }
    return {"entities": [], "facts": []}


def scripted(request: dict) -> Reply:
    return Reply.json(_script(message_text(request)))


@pytest.fixture(scope="module")
def stack(redis_url, neo4j_uri, llm_server, tmp_path_factory):
    llm_server.script(scripted)
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("reader"), neo4j_uri=neo4j_uri, llm_url=llm_server.url
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _scripted(llm_server):
    llm_server.script(scripted)


def uid() -> str:
    return f"r_{uuid.uuid4().hex[:10]}"


def ingest(client, user, texts, start=T0, step=timedelta(days=30)):
    receipts = [client.enqueue(user, t, timestamp=start + step * i) for i, t in enumerate(texts)]
    result = client.wait(receipts, timeout=SETTLE_S)
    assert not result.dead_lettered
    return receipts


def test_after_a_move_recall_and_context_say_austin_and_history_says_tampa(stack):
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Tampa.", "I live in Austin."])
    recall = client.recall(user, "where does the user live?", k=5)
    facts = [i for i in recall.items if i.kind == "fact"]
    text = " ".join(i.statement for i in facts)
    assert "Austin" in text and "Tampa" not in text
    top = facts[0]
    assert top.object == "Austin" and top.current and top.valid_until is None and top.source_ids
    assert top.breakdown.total == pytest.approx(top.score, abs=1e-5)
    # The old message is still a memory: an episode, dated, never a current fact.
    said = [i for i in recall.items if i.kind == "episode" and "Tampa" in i.statement]
    assert said and not said[0].current and said[0].event_time == T0
    context = client.get_context(user, "where does the user live?")
    current_part = context.partition(EXCERPTS_HEADER)[0]
    assert "Austin" in current_part and "Tampa" not in current_part

    history = client.history(user, "user", "LIVES_IN")
    assert [h.object_name for h in history] == ["Tampa", "Austin"]
    before_move = client.recall(user, "where does the user live?", k=5, as_of=T0 + timedelta(days=10))
    assert next(i for i in before_move.items if i.kind == "fact").object == "Tampa"
    # as_of hides what was said later too.
    assert all("Austin" not in i.statement for i in before_move.items)


def test_context_shows_what_a_relative_expression_meant_when_it_was_said(stack):
    client, user = stack.client, uid()
    ingest(client, user, ["We went hiking in Yosemite last month with my cousin yesterday."])
    context = client.get_context(user, "hiking in Yosemite")
    # T0 is 2024-03-01: the excerpt keeps its words and says what they meant then.
    assert "last month (= 2024-02)" in context and "yesterday (= 2024-02-29)" in context
    assert "[2024-03-01]" in context


def test_multi_hop_finds_the_brothers_company_through_the_graph(stack):
    client, user = stack.client, uid()
    # Three facts about relatives' companies match the question's words better than "Alex was hired by
    # Amazon" does, so vector similarity alone ranks the answer out of the top 3; the graph reaches it
    # from the brother fact (brother -> Alex -> Amazon).
    ingest(client, user, [f"distractor {n}" for n in range(30)] + ["My brother is Alex.", "Alex got hired at Amazon."])
    # Pin this user's weights to the configured ones: other tests may have learned global weights in the
    # shared Neo4j, and the premise below is about similarity, not about whatever was learned.
    configured = Settings()
    client.graph.save_weights(
        LearnedWeights(scope=user, alpha=configured.alpha, beta=configured.beta, gamma=configured.gamma,
                       recency_weight=configured.recency_weight, importance_weight=configured.importance_weight,
                       samples=0, quality=0.0)
    )  # fmt: skip
    question = "what company does my brother work for?"
    # Over facts only: the multi-hop premise is about the extracted graph, not the raw messages.
    recipe = client.reader.recipe()
    vector_only = client.reader.recall(user, question, k=3, recipe=recipe.with_channels("fact_vector"))
    assert all("Amazon" not in i.statement for i in vector_only.items), "the vector match alone finds it: no test"
    fused = client.reader.recall(user, question, k=3, recipe=recipe.with_channels("fact_vector", "graph"))
    amazon = [i for i in fused.items if i.object == "Amazon"]
    # Reached through the graph: the brother fact seeds the expansion with its entities, and Alex's job is a
    # fact on that seed (0 hops). An item the graph never reached would say -1.
    assert amazon and amazon[0].path in ("graph", "both") and amazon[0].hops == 0


def test_reader_process_never_imports_celery_nor_calls_the_llm(stack, llm_server):
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Austin."])
    calls_before = len(llm_server.requests)
    code = f"""
import json, sys
from engram_api import MemoryClient
r = MemoryClient().recall({user!r}, "where does the user live?", k=3)
print(json.dumps({{"top": next(i for i in r.items if i.kind == "fact").object, "mods": sorted({{m.split('.')[0] for m in sys.modules}}
      & {{"celery", "kombu", "litellm", "openai"}})}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **stack.env},
        timeout=SETTLE_S,
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"top": "Austin", "mods": []}
    assert len(llm_server.requests) == calls_before


def test_recall_scores_each_fact_with_its_strength_faded_as_the_old_daily_job_stored_it(stack):
    """Read-time decay: the strength in a fact's score is its stored strength times decay_per_day ** days
    since it was set, the value the old daily job stored had it run at the recall's instant (fixed here
    by ``as_of``: 40 and 140 days on, where the old job would have faded every fact 40 and 140 times)."""
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Austin.", "I enjoy chess.", "I have a dog named Rex."])
    per_day, day = client.settings.decay_per_day, timedelta(days=1)
    for days in (40, 140):
        when = utcnow() + timedelta(days=days)
        recall = client.recall(user, "what does the user do and where do they live?", k=10, as_of=when)
        items = {i.id: i for i in recall.items if i.kind == "fact"}
        assert items
        for record in client.graph.get_facts(user, list(items)):
            since = record.last_decay_at or record.created_at
            old_job = record.strength  # the old job's daily runs, one factor a day, then one run at ``when``
            for _ in range(days - 1):
                old_job *= per_day
                since += day
            old_job *= per_day ** ((when - since) / day)
            assert items[record.id].breakdown.strength == pytest.approx(old_job, rel=1e-9)
            assert record.strength == 1.0 and not record.archived  # nothing was written: it is read faded


def test_feedback_is_stored_reinforces_the_useful_fact_and_moves_the_version(stack):
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Austin.", "I enjoy chess.", "I have a dog named Rex."])
    # Decay is read at recall: the job finds nothing due for months, so it reads and writes nothing.
    version = client.graph.user_version(user)
    decayed = run_decay(graph=client.graph, settings=client.settings,
                        guard=lambda u: client.reader.writes.open(u, wait=30.0),
                        now=utcnow(), user_ids=[user])  # fmt: skip
    assert (decayed.due, decayed.archived) == (0, 0)
    assert client.graph.user_version(user) == version
    assert read_stamp(client.redis, user) == client.graph.user_stamp(user)

    recall = client.recall(user, "does the user have a dog?", k=3)
    (rex,) = [i for i in recall.items if i.kind == "fact" and "Rex" in i.statement]
    ids = [i.id for i in recall.items]  # facts and excerpts: feedback covers every item of the recall
    fact_ids = [i.id for i in recall.items if i.kind == "fact"]
    strength = {f.id: f.strength for f in client.graph.get_facts(user, fact_ids)}
    version = client.graph.user_version(user)

    assert client.feedback(user, recall.recall_id, [rex.id]) == len(ids)

    rows = [r for r in client.graph.feedback(user, 100) if r.recall_id == recall.recall_id]
    assert sorted((r.fact_id, r.useful) for r in rows) == sorted((i, i == rex.id) for i in ids)
    after = {f.id: f.strength for f in client.graph.get_facts(user, fact_ids)}
    reinforce = client.settings.reinforce_amount
    assert after[rex.id] == pytest.approx(min(1.0, strength[rex.id] + reinforce))
    assert {i: after[i] for i in fact_ids if i != rex.id} == {i: strength[i] for i in fact_ids if i != rex.id}
    assert client.graph.user_version(user) > version
    assert read_stamp(client.redis, user) == client.graph.user_stamp(user)
    again = client.recall(user, "does the user have a dog?", k=3)
    assert not again.cached  # the reader's cache saw the new version


def test_feedback_at_once_after_each_recall_finds_its_log_written_off_the_recall_path(stack):
    """The recall log is written on a reader thread after the result is returned: feedback in the same
    process waits for it, so however soon it comes, it finds the recall; the log is in Redis for others."""
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Austin.", "I enjoy chess.", "I have a dog named Rex."])
    for n in range(20):
        recall = client.recall(user, f"what does the user do, take {n}?", k=3)
        assert not recall.cached and recall.items
        assert client.feedback(user, recall.recall_id, [recall.items[0].id]) == len(recall.items)
        logged = json.loads(client.redis.get(keys.recall_log(user, recall.recall_id)))
        assert logged == {i.id: i.breakdown.model_dump() for i in recall.items}  # every component, exactly


def test_every_recall_log_is_in_redis_once_the_reader_is_flushed(stack):
    """``Reader.flush`` (``MemoryClient.close`` calls it) waits for the log writes still in flight, so a
    process that recalls and closes at once leaves every log for ``feedback`` from another process."""
    client, user = stack.client, uid()
    ingest(client, user, ["I live in Austin.", "I enjoy chess."])
    recalls = [client.recall(user, f"where does the user live, take {n}?", k=3) for n in range(20)]
    client.reader.flush()
    assert all(client.redis.exists(keys.recall_log(user, r.recall_id)) for r in recalls)


def test_cache_sees_a_fact_written_by_a_worker_in_another_process(stack):
    client, user = stack.client, uid()
    ingest(client, user, ["I enjoy chess."])
    first = client.recall(user, "does the user have a dog?", k=5)
    again = client.recall(user, "does the user have a dog?", k=5)
    assert again.cached and all("Rex" not in i.statement for i in first.items)
    ingest(client, user, ["I have a dog named Rex."])
    after = client.recall(user, "does the user have a dog?", k=5)
    assert not after.cached and any("Rex" in i.statement for i in after.items)


def test_isolation_over_1000_randomized_recalls_across_20_users(stack):
    client = stack.client
    rng = random.Random(7)
    users = [uid() for _ in range(20)]
    receipts = []
    messages: dict[str, set[str]] = {u: set() for u in users}
    for u in users:
        said = [f"I enjoy {topic}." for topic in rng.sample(TOPICS, 4)]
        said.append(f"I live in {rng.choice(['Tampa', 'Austin', 'Denver', 'Boston'])}.")
        for text in said:
            receipts.append(client.enqueue(u, text))
            messages[u].add(receipts[-1].message_id)
    assert len(client.wait(receipts, timeout=SETTLE_S).applied) == len(receipts)
    owned = {}
    for u in users:
        page = client.get_graph(u, page_size=1000)
        owned[u] = {f.id for f in page.facts}
        owned[u] |= {c.id for c in client.graph.get_chunks(u, episode_ids=sorted(messages[u]))}
    queries = [f"does the user enjoy {t}?" for t in TOPICS] + ["where does the user live?", "hobbies"]
    for _ in range(1000):
        u = rng.choice(users)
        for item in client.recall(u, rng.choice(queries), k=rng.randint(1, 10)).items:
            assert item.id in owned[u]
            assert set(item.source_ids) <= messages[u]


def _neo4j_count(client, user) -> int:
    """Every node and relationship of the user, counted by a separate driver (not through our store)."""
    from neo4j import GraphDatabase

    with GraphDatabase.driver(client.settings.neo4j_uri, auth=None) as drv:
        records, _, _ = drv.execute_query(
            "MATCH (n) WHERE n.user_id = $u OPTIONAL MATCH (n)-[r]-() RETURN count(DISTINCT n) + count(DISTINCT r) AS c",
            u=user,
        )
    return records[0]["c"]


def test_forget_and_forget_user_leave_nothing_behind(stack):
    client, user = stack.client, uid()
    first, _ = ingest(client, user, ["I have a dog named Rex.", "I enjoy chess."])
    client.recall(user, "dog", k=3)
    removed = client.forget(user, first.message_id)
    assert removed.facts == 1 and removed.episodes == 1
    facts = client.get_graph(user).facts
    assert [f.statement for f in facts] == ["User enjoys chess"]
    index = client.reader.keeper.vectors.load(user)
    assert not set(removed.removed_fact_ids) & index.node_ids()
    assert not set(removed.removed_entity_ids) & index.node_ids()
    assert removed.removed_chunk_ids and not set(removed.removed_chunk_ids) & index.node_ids()
    assert all("Rex" not in i.statement for i in client.recall(user, "dog", k=5).items)

    client.forget_user(user)
    assert _neo4j_count(client, user) == 0
    assert not client.reader.keeper.vectors.path_for(user).exists()
    assert user not in client.reader.cache.users()
    leftovers = [k for p in keys.user_keys_pattern(user) for k in client.redis.scan_iter(match=p)]
    assert leftovers == [] and client.redis.get(keys.user_version(user)) is None
    assert client.stats(user).facts == 0 and client.recall(user, "dog", k=3).items == []


@pytest.mark.parametrize(
    "read",
    [
        lambda c: c.recall("r_down", "where does the user live?"),
        lambda c: c.get_context("r_down", "where does the user live?"),
        lambda c: c.history("r_down", "user", "LIVES_IN"),
        lambda c: c.stats("r_down"),
    ],
    ids=["recall", "get_context", "history", "stats"],
)
def test_reads_with_the_graph_store_down_raise_store_unavailable(redis_url, tmp_path, read):
    """A graph store that does not answer is a typed error naming it, never an empty answer or a cached one."""
    from engram_api import MemoryClient, StoreUnavailableError

    down = Settings(neo4j_uri="bolt://127.0.0.1:1", data_dir=tmp_path)
    with MemoryClient(settings=down, redis_url=redis_url) as client:
        with pytest.raises(StoreUnavailableError, match=re.escape("bolt://127.0.0.1:1")):
            read(client)
        assert client.reader.cache.users() == set()


@pytest.mark.parametrize(
    "read",
    [
        lambda c, u: c.recall(u, "where does the user live?"),
        lambda c, u: c.get_context(u, "where does the user live?"),
        lambda c, u: c.history(u, "user", "LIVES_IN"),
        lambda c, u: c.stats(u),
    ],
    ids=["recall", "get_context", "history", "stats"],
)
def test_reads_after_another_write_with_the_graph_store_down_raise_never_serve_what_was_held(
    redis_url, neo4j_uri, tmp_path, monkeypatch, read
):
    """A reader whose cache and snapshot are warm for a user, then another process writes that user (the
    published stamp moves) and the store goes down: what the reader holds is now stale, so the read is a
    typed error naming the store, never the held answer."""
    from engram_api import MemoryClient, StoreUnavailableError
    from engram_api.storage.graph.neo4j import connection as neo4j_connection

    monkeypatch.setattr(neo4j_connection, "MAX_RETRY_TIME_S", 2.0)  # the driver's retries while it is down
    host, port = neo4j_uri.removeprefix("bolt://").rsplit(":", 1)
    link = CuttableLink(host, int(port))
    user = uid()
    through_link = Settings(neo4j_uri=f"bolt://127.0.0.1:{link.port}", data_dir=tmp_path / "reader")
    direct = Settings(neo4j_uri=neo4j_uri, data_dir=tmp_path / "worker")
    with (
        MemoryClient(settings=through_link, redis_url=redis_url) as reader,
        MemoryClient(settings=direct, redis_url=redis_url) as worker,
    ):
        apply_in_process(worker, user, "m0", "I live in Tampa.", T0)
        read(reader, user)
        reader.recall(user, "where does the user live?")
        assert reader.recall(user, "where does the user live?").cached  # warm: the premise
        assert user in reader.reader.cache.users()
        reader.signals.stop()  # the reader can learn the write from the store only: no signal, ...
        apply_in_process(worker, user, "m1", "I live in Austin.", T0 + timedelta(days=30))
        worker.redis.delete(keys.change_feed(user))  # ... no change feed (expired)
        link.cut()
        with pytest.raises(StoreUnavailableError, match=re.escape(f"127.0.0.1:{link.port}")):
            read(reader, user)
