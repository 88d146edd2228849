"""An apply worker SIGKILLed in the middle of a batch (after two members' writes committed, or with members
written inside the batch's one Neo4j transaction, before its commit; on SQLite, whose members commit one
by one, a kill between members): real extract and apply worker processes, real Redis, the LLM stand-in,
on both stores (the embedded SQLite default in the fast loop, Neo4j with the slow tests). After redelivery
every message is applied exactly once (lost 0, duplicated 0), and the index any process takes from the
user's FAISS file, caught up by version, holds exactly what the graph holds."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engram_api import keys
from engram_api.models import MessageState
from engram_api.storage.faiss.files import VectorStore
from engram_testing.llm_standin import Reply
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.extractions import entity, fact, message_text
from tests.support.operator_processes import wait_until
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 6, 1, tzinfo=UTC)
# Unrelated interests: no statement is near enough another one to be taken as its restatement.
TOPICS = ["jazz", "chess", "sailing", "gardening", "astronomy", "pottery", "cycling", "origami"]
N = len(TOPICS)


def topic_fact(request: dict[str, Any]) -> Reply:
    """``I like <topic>.``: one entity and one fact of its own per message."""
    topic = message_text(request).removeprefix("I like ").rstrip(".")
    return Reply.json(
        {"entities": [entity("N1", topic, "Thing")], "facts": [fact("user", "LIKES", "N1", f"User likes {topic}")]}
    )


@pytest.mark.parametrize("backend", ["sqlite", "neo4j"])
@pytest.mark.parametrize("fault", ["KillMidBatch", "KillInsideBatch"], ids=["after-commits", "before-the-commit"])
def test_sigkill_mid_batch_then_redelivery_applies_every_message_exactly_once(
    request: pytest.FixtureRequest, redis_url: str, llm_standin: Any, tmp_path: Path, fault: str, backend: str
) -> None:
    llm_standin.script(topic_fact)
    neo4j_uri = request.getfixturevalue("neo4j_uri") if backend == "neo4j" else None
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path, neo4j_uri=neo4j_uri, llm_url=llm_standin.url, workers=False,
        middleware=f"tests.support.faults:{fault}", apply_batch=N,
        extract_in_order=False,  # all N ready at once: extraction turns would let one model-path message be ready
    ) as stack:  # fmt: skip
        client, user = stack.client, f"kb_{uuid.uuid4().hex[:8]}"
        stack.start_worker("extract", EXTRACT_WORKER, concurrency=4)
        receipts = [
            client.enqueue(user, f"I like {topic}.", message_id=f"m{i}", timestamp=T0 + timedelta(hours=i))
            for i, topic in enumerate(TOPICS)
        ]
        # Every message extracted before any apply worker runs: all N are ready when the first apply starts.
        wait_until(lambda: client.redis.zcard(keys.ready(user)) == N, timeout=SETTLE_S, what="all extracted")
        stack.start_worker("apply", APPLY_WORKER)
        result = client.wait(receipts, timeout=SETTLE_S)

        marker = tmp_path / "faults" / "killed-mid-batch"
        assert marker.exists(), "the apply worker was never killed mid-batch"
        assert sorted(result.applied) == sorted(r.message_id for r in receipts) and not result.dead_lettered
        graph = client.graph
        assert [e.id for e in graph.episodes(user)] == sorted(f"m{i}" for i in range(N))  # lost 0
        items, _ = graph.vectors(user)
        facts = graph.get_facts(user, [i.node_id for i in items if i.kind == "fact"])
        by_statement = Counter(f.statement for f in facts)
        assert by_statement == Counter(f"User likes {topic}" for topic in TOPICS)  # duplicated 0
        assert sorted(s for f in facts for s in f.source_ids) == sorted(f"m{i}" for i in range(N))
        for r in receipts:
            assert client.redis.hget(keys.status(user, r.message_id), "state") == MessageState.APPLIED
        assert client.redis.exists(keys.ready(user)) == 0
        # The index file on this host is a cache of the graph: a worker killed between its commit and its index
        # write leaves it behind, or leaves none when no write of this user finished here (architecture: "FAISS
        # is a per-process cache of the graph"). It never holds a vector the graph does not, and the copy a
        # process takes from it, caught up by version (read whole only when there is no file), holds exactly
        # the graph's vectors.
        graph_ids = {i.node_id for i in items}
        on_disk = VectorStore(root=stack.settings.index_dir, dim=client.reader.embedder.dim).load(user)
        assert on_disk is None or on_disk.node_ids() <= graph_ids
        keeper = client.reader.keeper
        rebuilds = keeper.rebuilds
        copy = keeper.current(user, graph.user_stamp(user))
        assert copy.node_ids() == graph_ids and keeper.rebuilds == rebuilds + (on_disk is None)
