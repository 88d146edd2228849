"""``GraphStore.vector_changes``: what changed in a user's vectors after a version, the read a FAISS copy
catches up by (``engram_api.storage.faiss.sync``), on both backends."""

from __future__ import annotations

import pytest

from engram_api.errors import InvalidInputError
from engram_api.models import ChunkRecord, EntityRecord, FactRecord
from engram_api.storage import GraphStore
from engram_api.versions import ABSENT
from tests.support.factories import T0, make_entity, make_fact, new_id, plan, vec


def _chunk(user: str, episode: str, text: str) -> ChunkRecord:
    return ChunkRecord(
        id=new_id("chunk"), user_id=user, episode_id=episode, seq=0, text=text, speaker="Ana", event_time=T0,
        created_at=T0, updated_at=T0, embedding=vec(f"chunk:{text}"),
    )  # fmt: skip


def _ids(graph_store: GraphStore, user: str, since: int) -> tuple[set[str], set[str]]:
    changes = graph_store.vector_changes(user, since)
    return {node for node, _, _ in changes.upserts}, set(changes.removed)


def _lives_in_oslo(graph_store: GraphStore, user: str) -> tuple[EntityRecord, EntityRecord, FactRecord, ChunkRecord]:
    """Message m1: Ana lives in Oslo, with its chunk; returns (Ana, Oslo, the fact, the chunk)."""
    ana, oslo = make_entity(user, "Ana"), make_entity(user, "Oslo")
    first = make_fact(user, ana, "LIVES_IN", oslo)
    chunk = _chunk(user, "m1", "I live in Oslo")
    graph_store.apply(plan(user, "m1", entities=[ana, oslo], facts=[first]).model_copy(update={"chunks": [chunk]}))
    return ana, oslo, first, chunk


def test_a_copy_reads_only_the_vectors_written_and_removed_after_its_version(
    graph_store: GraphStore, user: str
) -> None:
    ana, oslo, first, chunk = _lives_in_oslo(graph_store, user)
    v1 = graph_store.user_stamp(user)
    rome = make_entity(user, "Rome")
    second = make_fact(user, ana, "VISITED", rome)
    graph_store.apply(plan(user, "m2", entities=[rome], facts=[second], mentioned=[ana.id]))
    v2 = graph_store.user_stamp(user)

    changes = graph_store.vector_changes(user, v1.version)
    assert (changes.stamp, changes.removed) == (v2, ())
    assert {(node, kind) for node, kind, _ in changes.upserts} == {(rome.id, "entity"), (second.id, "fact")}
    assert [float(x) for x in dict((n, v) for n, _, v in changes.upserts)[rome.id]] == rome.embedding
    assert changes.usable_from(v1) and changes.vector_bytes == 2 * 4 * len(vec("x"))
    assert _ids(graph_store, user, 0)[0] == {ana.id, oslo.id, first.id, chunk.id, rome.id, second.id}
    assert _ids(graph_store, user, v2.version) == (set(), set())

    # A forget deletes the message's fact, its chunk and the entity only it kept: one removal record.
    gone = graph_store.forget_message(user, "m1")
    v3 = graph_store.user_stamp(user)
    assert _ids(graph_store, user, v2.version) == (set(), {first.id, chunk.id, oslo.id})
    assert set(gone.removed_entity_ids) == {oslo.id}
    # From before the forget, the removals come with the records written since (re-added ones stay upserts).
    upserts, removed = _ids(graph_store, user, v1.version)
    assert (upserts, removed) == ({rome.id, second.id}, {first.id, chunk.id, oslo.id})
    assert graph_store.vector_changes(user, v3.version).upserts == []


def test_removed_chunks_are_recorded_and_a_lifetime_ends_with_its_history(graph_store: GraphStore, user: str) -> None:
    ana = make_entity(user, "Ana")
    chunk = _chunk(user, "m1", "hello there")
    graph_store.apply(plan(user, "m1", entities=[ana]).model_copy(update={"chunks": [chunk]}))
    before = graph_store.user_stamp(user)
    assert graph_store.remove_chunks(user, [chunk.id]) == [chunk.id]
    assert _ids(graph_store, user, before.version) == (set(), {chunk.id})

    graph_store.forget_user(user)
    absent = graph_store.vector_changes(user, before.version)
    assert (absent.stamp, absent.horizon, absent.removed, list(absent.upserts)) == (ABSENT, None, (), [])
    assert not absent.usable_from(before)
    # A new lifetime starts with an empty history: the old one's removal records went with the user.
    graph_store.apply(plan(user, "m9", entities=[make_entity(user, "Bo")]))
    fresh = graph_store.vector_changes(user, 0)
    assert fresh.removed == () and fresh.horizon == 0
    assert not fresh.usable_from(before)  # another epoch: only a rebuild can bring that copy here


def test_the_removal_history_is_pruned_and_the_horizon_follows(
    graph_store: GraphStore, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engram_api.storage.graph.neo4j.connection.REMOVAL_RETAIN", 2)
    monkeypatch.setattr("engram_api.storage.graph.sqlite.rows.REMOVAL_RETAIN", 2)
    ana = make_entity(user, "Ana")
    facts = [make_fact(user, ana, f"LIKES thing {i}") for i in range(4)]
    graph_store.apply(plan(user, "m0", entities=[ana], facts=facts[:1]))
    for i, fact in enumerate(facts[1:], start=1):
        graph_store.apply(plan(user, f"m{i}", facts=[fact], mentioned=[ana.id]))
    start = graph_store.user_stamp(user)
    assert graph_store.vector_changes(user, start.version).horizon == 0
    for fact in facts:
        graph_store.forget_fact(user, fact.id)
    now = graph_store.user_stamp(user)
    changes = graph_store.vector_changes(user, 0)
    assert changes.horizon == now.version - 2
    assert set(changes.removed) == {f.id for f in facts[2:]}  # the two oldest removals were pruned
    assert not changes.usable_from(start) and changes.usable_from(now._replace(version=now.version - 2))


def test_one_read_brings_the_vector_changes_and_the_records_marked_since(graph_store: GraphStore, user: str) -> None:
    """``user_changes``: what ``vector_changes`` reads, plus the facts and chunks marked after ``since`` and
    the version of the last removal, for a reader catching up its index and its snapshot in one read."""
    ana, _, first, chunk = _lives_in_oslo(graph_store, user)
    v1 = graph_store.user_stamp(user)
    tea = make_entity(user, "tea")
    second = make_fact(user, ana, "LIKES", tea)
    graph_store.apply(plan(user, "m2", entities=[tea], facts=[second], mentioned=[ana.id]))
    graph_store.forget_fact(user, first.id)
    now = graph_store.user_stamp(user)
    for since in (0, v1.version, now.version):
        both, alone = graph_store.user_changes(user, since), graph_store.vector_changes(user, since)
        assert (both.vectors.stamp, both.vectors.horizon, both.vectors.settled) == (alone.stamp, alone.horizon, True)
        assert set(both.vectors.removed) == set(alone.removed)
        assert {n for n, _, _ in both.vectors.upserts} == {n for n, _, _ in alone.upserts}
        assert both.removed == now.version  # the forget of ``first``
    everything = graph_store.user_changes(user, 0)
    assert {f.id for f in everything.facts} == {second.id} and [c.id for c in everything.chunks] == [chunk.id]
    assert everything.facts == graph_store.get_facts(user, [second.id])
    assert everything.chunks == graph_store.get_chunks(user, [chunk.id])
    later = graph_store.user_changes(user, v1.version)
    assert [f.id for f in later.facts] == [second.id] and list(later.chunks) == []
    assert graph_store.user_changes(new_id("nobody"), 0).vectors.stamp == ABSENT
    with pytest.raises(InvalidInputError):
        graph_store.user_changes(user, -1)


def test_a_negative_version_is_refused(graph_store: GraphStore, user: str) -> None:
    with pytest.raises(InvalidInputError, match="since"):
        graph_store.vector_changes(user, -1)
