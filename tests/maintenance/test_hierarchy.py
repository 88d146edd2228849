"""Hierarchy: topic clusters over real MiniLM embeddings make sense, and an unchanged user is skipped."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest

from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder, get_embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_workers.maintenance import rebuild_hierarchy
from engram_workers.maintenance.hierarchy import cluster_count, member_signature
from tests.support.builders import GuardSpy, UserGraph, at

SETTINGS = Settings(maintenance_batch=5)  # several get_facts batches per user
ME = "User"  # the extractor's name for the speaker
# Six facts per topic, phrased as the extractor phrases statements: k = round(sqrt(18 / 2)) = 3 (with
# four each, sqrt(6) rounds to 2 topics).
TOPICS: dict[str, list[tuple[str, str, str | None, str]]] = {
    "work": [
        (ME, "WORKS_AT", "Dell", "User works at Dell"),
        (ME, "WORKS_AS", "software engineer", "User is a senior software engineer"),
        (ME, "HAS_MANAGER", "Priya", "User's manager at work is Priya"),
        (ME, "LEADS", "storage firmware team", "User leads the storage firmware team"),
        (ME, "WORKS_FROM", "Round Rock office", "User works from the Round Rock office"),
        (ME, "PREPARES", "roadmap", "User is preparing the quarterly product roadmap"),
    ],
    "hobby": [
        (ME, "PLAYS", "guitar", "User plays acoustic guitar"),
        (ME, "ENJOYS", "rock climbing", "User goes rock climbing on weekends"),
        (ME, "TRAINS_FOR", "half marathon", "User is training for a half marathon"),
        (ME, "PLAYS", "chess", "User plays chess online"),
        (ME, "PAINTS", "watercolor", "User paints watercolor landscapes"),
        (ME, "COLLECTS", "film cameras", "User collects vintage film cameras"),
    ],
    "family": [
        (ME, "MARRIED_TO", "Sarah", "User is married to Sarah"),
        (ME, "HAS_DAUGHTER", "Emma", "User has a daughter named Emma"),
        (ME, "HAS_SON", "Leo", "User's son Leo is seven years old"),
        (ME, "HAS_MOTHER", "Linda", "User's mother Linda lives in Ohio"),
        (ME, "HAS_BROTHER", "Tom", "User's brother Tom visits every Thanksgiving"),
        (ME, "CALLS", "parents", "User calls his parents every Sunday"),
    ],
}


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("all-MiniLM-L6-v2")


def _write_topics(store: GraphStore, user: str, embedder: Embedder) -> dict[str, str]:
    """One message per topic; returns fact id -> topic."""
    memory = UserGraph(store, user, encode=embedder.encode)
    topic_of = {}
    for day, (topic, facts) in enumerate(TOPICS.items()):
        for fact in memory.say(facts, when=at(day)):
            topic_of[fact.id] = topic
    return topic_of


def test_cluster_count_follows_sqrt_half_n() -> None:
    assert [cluster_count(n) for n in (0, 2, 3, 12, 15, 18, 288, 10_000)] == [0, 0, 1, 2, 3, 3, 12, 12]


def test_work_hobby_and_family_facts_fall_into_pure_topics(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, embedder: Embedder, user: str
) -> None:
    topic_of = _write_topics(store, user, embedder)
    keeper.rebuild(user)
    keeper.rebuilds = 0

    report = rebuild_hierarchy(
        graph=graph, keeper=keeper, embedder=embedder, settings=SETTINGS, guard=guard, user_ids=[user], now=at(9)
    )

    assert not report.failed
    assert (report.rebuilt, report.clusters) == (1, 3)
    clusters = store.clusters(user)
    assert len(clusters) == 3
    assert sorted(fid for c in clusters for fid in c.member_fact_ids) == sorted(topic_of)
    entity_names = {e.id: e.name for e in store.page(user, 1, 100).entities}
    for cluster in clusters:
        topics = Counter(topic_of[fid] for fid in cluster.member_fact_ids)
        topic, count = topics.most_common(1)[0]
        purity = count / len(cluster.member_fact_ids)
        print(f"\n[{topic} purity {purity:.2f}] label={cluster.label!r}\n  {cluster.summary}")
        assert purity >= 0.75, (cluster.label, topics)
        assert cluster.summary.startswith(f"{cluster.label}: ")
        assert cluster.label != ME, "the user's own entity names no topic"
        assert len(cluster.centroid) == 384 and sum(x * x for x in cluster.centroid) == pytest.approx(1.0)
        members = store.get_facts(user, cluster.member_fact_ids)
        assert cluster.signature == member_signature(members)
        assert set(cluster.member_entity_ids) == {eid for f in members for eid in (f.subject_id, f.object_id) if eid}
        assert {entity_names[eid] for eid in cluster.member_entity_ids} >= {ME}
    # Clusters are not in the FAISS index: the write only re-stamps it.
    assert keeper.vectors.file_stamp(user) == store.user_stamp(user)
    assert keeper.rebuilds == 0


def test_a_second_run_without_changes_is_skipped_and_a_change_rebuilds(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, embedder: Embedder, user: str
) -> None:
    _write_topics(store, user, embedder)
    run = partial(rebuild_hierarchy, graph=graph, keeper=keeper, embedder=embedder, settings=SETTINGS, guard=guard)
    run(user_ids=[user], now=at(9))
    before = (store.clusters(user), store.user_version(user))

    again = run(user_ids=[user], now=at(10))

    assert (again.rebuilt, again.skipped) == (0, 1)
    assert again.per_user[0].status == "skipped" and again.per_user[0].clusters == 3
    assert (store.clusters(user), store.user_version(user)) == before

    UserGraph(store, user, encode=embedder.encode).say(
        [(ME, "PLAYS", "piano", "User is learning to play the piano")], when=at(11)
    )
    changed = run(user_ids=[user], now=at(12))

    assert changed.rebuilt == 1
    assert sum(len(c.member_fact_ids) for c in store.clusters(user)) == 19


def test_fewer_than_three_current_facts_get_no_clusters(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, embedder: Embedder, user: str
) -> None:
    memory = UserGraph(store, user, encode=embedder.encode)
    memory.say(TOPICS["work"][:2], when=at(0))
    run = partial(rebuild_hierarchy, graph=graph, keeper=keeper, embedder=embedder, settings=SETTINGS, guard=guard)

    few = run(user_ids=[user])
    assert few.per_user[0].status == "skipped" and store.clusters(user) == []

    memory.say(TOPICS["work"][2:3], when=at(1))
    three = run(user_ids=[user])
    assert three.rebuilt == 1 and len(store.clusters(user)) == 1

    # Forgetting a message takes the user back under three facts: the forget drops the cluster that held
    # its fact at once, and the next run has nothing to build.
    message = store.page(user, 1, 10).facts[0].source_ids[0]
    store.forget_message(user, message)
    assert store.clusters(user) == []
    after = run(user_ids=[user])
    assert after.per_user[0].status == "skipped" and store.clusters(user) == []
