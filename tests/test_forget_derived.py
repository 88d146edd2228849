"""Forgetting a message takes back what it added to entities that outlive it (aliases, the summary it gave)
and the topic clusters that held its facts; every other message's facts, aliases and entities stay, and
the export shows the same, and so do the bytes under the data directory. Both graph stores, real Redis,
FAISS; memory written by the apply stage's own write with scripted model answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engram_workers.maintenance import rebuild_hierarchy
from tests.support.extractions import entity, fact
from tests.support.memory import apply_in_process
from tests.support.scan import file_hits
from tests.support.stack import Stack, engram_stack

T0 = datetime(2024, 8, 1, 9, 0, tzinfo=UTC)
SECRET = ("rehab", "opioid", "addict")

MESSAGES = [
    ("I live in Tampa and like hiking.", {
        "entities": [entity("e1", "Tampa", "City")],
        "facts": [fact("user", "LIVES_IN", "e1", "User lives in Tampa"), fact("user", "LIKES", None, "User likes hiking")],
    }),
    ("Bob is in rehab for opioid addiction.", {  # the message to forget: it creates Bob, alias and summary
        "entities": [entity("e1", "Bob", "Person", aliases=["Bobby the addict"], summary="in rehab for opioid addiction")],
        "facts": [fact("e1", "IS_IN", None, "Bob is in rehab for opioid addiction")],
    }),
    ("Rob plays chess with me.", {  # mentions Bob by name: Bob outlives the forget; adds the alias Rob
        "entities": [entity("e1", "Bob", "Person", aliases=["Rob"])],
        "facts": [fact("e1", "PLAYS", None, "Bob plays chess")],
    }),
    ("I work at Acme.", {
        "entities": [entity("e1", "Acme", "Company")],
        "facts": [fact("user", "WORKS_AT", "e1", "User works at Acme")],
    }),
]  # fmt: skip


@pytest.fixture(params=["sqlite", "neo4j"])
def stack(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=neo4j_uri, llm_url=None, workers=False) as s:
        yield s


def bob(stack: Stack, user: str) -> Any:
    return next(e for e in stack.client.get_graph(user, 1, 100).entities if e.name == "Bob")


def test_forgetting_a_message_takes_back_its_aliases_summary_and_clusters(stack: Stack) -> None:
    client, user = stack.client, f"d_{uuid.uuid4().hex[:10]}"
    for i, (text, answer) in enumerate(MESSAGES):
        apply_in_process(client, user, f"{user}-m{i}", text, T0 + timedelta(days=i), extraction=answer)
    assert (bob(stack, user).aliases, bob(stack, user).summary) == (
        ["Bobby the addict", "Rob"],
        "in rehab for opioid addiction",
    ), "premise: the forgotten message's alias and summary are on an entity another message keeps"
    reader = client.reader
    report = rebuild_hierarchy(
        graph=client.graph, keeper=reader.keeper, embedder=reader.embedder, settings=client.settings,
        guard=lambda uid: reader.writes.open(uid, wait=30.0), user_ids=[user],
    )  # fmt: skip
    assert not report.failed and report.clusters >= 1
    assert any("rehab" in c.summary for c in client.graph.clusters(user)), "premise: a cluster quotes the fact"

    if stack.settings.neo4j_uri is None:  # Neo4j keeps its files with its server, not here
        assert "addict" in file_hits(stack.data_dir, ["addict"]), "premise: the scan sees the store's bytes"

    client.forget(user, f"{user}-m1")

    kept = bob(stack, user)
    assert (kept.aliases, kept.summary) == (["Rob"], "")
    assert client.graph.lookup_entities(user, entity_ids=[], norm_names=["bobby the addict"]) == []
    assert [e.id for e in client.graph.lookup_entities(user, entity_ids=[], norm_names=["rob"])] == [kept.id]
    assert all(not any(word in c.summary for word in SECRET) for c in client.graph.clusters(user))
    broad = client.search(user, "rehab addiction", detail_level="broad")
    assert all(not any(word in (c.summary + c.label).lower() for word in SECRET) for c in broad.clusters)
    exported = "\n".join(client.export_memory(user)).lower()
    assert not any(word in exported for word in SECRET)
    assert "bob plays chess" in exported and "user works at acme" in exported
    statements = {f.statement for f in client.get_graph(user, 1, 100).facts}
    assert statements == {"User lives in Tampa", "User likes hiking", "Bob plays chess", "User works at Acme"}
    # Nor on disk: the SQLite store (file and WAL) and the FAISS files under the data directory.
    assert file_hits(stack.data_dir, [*SECRET, "bobby"]) == {}
