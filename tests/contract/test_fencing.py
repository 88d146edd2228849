"""The stamp and fence part of the graph-store contract, on both backends: a user's (epoch, version) is
never reused across lifetimes, and a fenced write commits only on the stamp it was planned on."""

from __future__ import annotations

import threading

import pytest

from engram_api.errors import StaleWriteError
from engram_api.models import ChatMessage, Envelope, WritePlan
from engram_api.storage import GraphStore
from engram_api.storage.graph.episodes import chunk_envelope, keyword_terms
from engram_api.versions import ABSENT, Stamp, new_epoch
from tests.support.factories import T0, open_store, plan


def _chatty(user: str, message_id: str, text: str) -> WritePlan:
    """A plan carrying the message's episode chunks (as the apply stage writes them)."""
    envelope = Envelope(user_id=user, message_id=message_id, messages=[ChatMessage(content=text)], timestamp=T0)
    return plan(user, message_id, content=text).model_copy(update={"chunks": chunk_envelope(envelope)})


def test_a_new_lifetime_gets_a_new_epoch_and_never_an_old_stamp(graph_store: GraphStore, user: str) -> None:
    assert graph_store.user_stamp(user) == ABSENT
    graph_store.apply(plan(user, "m1"))
    graph_store.apply(plan(user, "m2"))
    first = graph_store.user_stamp(user)
    assert first.version == 2 and first.epoch > 0
    graph_store.forget_user(user)
    assert graph_store.user_stamp(user) == ABSENT

    graph_store.apply(plan(user, "m3"))
    second = graph_store.user_stamp(user)
    assert second.version == 1 and second.epoch not in (0, first.epoch)
    assert second > first  # epochs are time-ordered: a published stamp only moves forward
    assert graph_store.stamped_vectors(user)[1] == second and graph_store.user_version(user) == 1


def test_a_fenced_write_commits_only_on_the_planned_stamp(graph_store: GraphStore, user: str) -> None:
    graph_store.apply(plan(user, "m1"))
    planned_on = graph_store.user_stamp(user)
    graph_store.apply(plan(user, "m2"))  # another writer got in after the plan was built
    moved = graph_store.user_stamp(user)

    with graph_store.fenced(user, planned_on, planned_on.epoch), pytest.raises(StaleWriteError):
        graph_store.apply(plan(user, "m3"))
    for refused in (
        lambda: graph_store.forget_message(user, "m1"),
        lambda: graph_store.forget_user(user),
        lambda: graph_store.replace_clusters(user, []),
    ):
        with graph_store.fenced(user, planned_on, planned_on.epoch), pytest.raises(StaleWriteError):
            refused()
    assert graph_store.user_stamp(user) == moved and not graph_store.is_applied(user, "m3")
    assert graph_store.is_applied(user, "m1")

    with graph_store.fenced(user, moved, moved.epoch) as fence:
        graph_store.apply(plan(user, "m3"))
        graph_store.apply(plan(user, "m4"))  # the fence follows its own commits
        assert fence.expected == Stamp(moved.epoch, moved.version + 2) == graph_store.user_stamp(user)


def test_a_stale_plan_is_refused_before_anything_else_is_checked(graph_store: GraphStore, user: str) -> None:
    """The fence is checked first (on Neo4j, in the apply's own first statement): a stale plan of a message
    the graph already holds is refused, not answered "already applied" from a view that moved."""
    graph_store.apply(plan(user, "m1"))
    planned_on = graph_store.user_stamp(user)
    graph_store.apply(plan(user, "m2"))
    moved = graph_store.user_stamp(user)
    with graph_store.fenced(user, planned_on, planned_on.epoch), pytest.raises(StaleWriteError):
        graph_store.apply(plan(user, "m2"))
    with graph_store.fenced(user, ABSENT, new_epoch()), pytest.raises(StaleWriteError):
        graph_store.apply(plan(user, "m3"))  # planned as a new user: it exists
    assert graph_store.user_stamp(user) == moved and not graph_store.is_applied(user, "m3")


def test_two_writers_creating_one_user_cannot_both_commit(graph_store: GraphStore, user: str) -> None:
    """Nothing can be locked before the user exists: each creator fences on ABSENT with its own epoch,
    and whichever commits second finds another epoch and is refused."""
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def create(message_id: str) -> None:
        with graph_store.fenced(user, ABSENT, new_epoch()):
            barrier.wait()
            try:
                graph_store.apply(plan(user, message_id))
                outcomes.append("committed")
            except StaleWriteError:
                outcomes.append("refused")

    threads = [threading.Thread(target=create, args=(m,)) for m in ("m1", "m2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["committed", "refused"]
    assert graph_store.user_stamp(user).version == 1


def test_the_fence_covers_episode_chunks_and_the_keyword_index(graph_store: GraphStore, user: str) -> None:
    """Chunks (and their keyword entries) are written and deleted in the fenced transaction: a refused
    write adds none and removes none."""
    graph_store.apply(_chatty(user, "m1", "The ferry to the island leaves at seven."))
    planned_on = graph_store.user_stamp(user)
    graph_store.apply(plan(user, "m2"))  # another writer got in

    with graph_store.fenced(user, planned_on, planned_on.epoch), pytest.raises(StaleWriteError):
        graph_store.apply(_chatty(user, "m3", "The lighthouse keeper plays the violin."))
    with graph_store.fenced(user, planned_on, planned_on.epoch), pytest.raises(StaleWriteError):
        graph_store.forget_message(user, "m1")

    assert graph_store.get_chunks(user, episode_ids=["m3"]) == []
    assert not graph_store.keyword_search(user, keyword_terms("lighthouse violin"), 5)
    assert [c.episode_id for c in graph_store.get_chunks(user, episode_ids=["m1"])] == ["m1"]
    assert [h.node_id for h in graph_store.keyword_search(user, keyword_terms("ferry island"), 5)] == [
        c.id for c in graph_store.get_chunks(user, episode_ids=["m1"])
    ]


def test_a_batched_block_reads_its_own_writes_and_commits_all_or_nothing(
    graph_store: GraphStore, store_spec: tuple[str, str], user: str
) -> None:
    """``batched``: inside the block this thread reads what the block wrote; where the backend shares one
    transaction (Neo4j) nobody else sees any of it until the block ends, and an error rolls all of it back
    and puts the fence where the block found it. SQLite commits each write on its own (yields False)."""
    graph_store.apply(plan(user, "m0"))
    start = graph_store.user_stamp(user)
    other = open_store(*store_spec)
    try:
        with graph_store.fenced(user, start, start.epoch) as fence, graph_store.batched() as shared:
            assert shared is (store_spec[0] == "neo4j")
            graph_store.apply(plan(user, "m1"))
            graph_store.apply(plan(user, "m2"))
            assert graph_store.is_applied(user, "m1") and graph_store.user_version(user) == start.version + 2
            assert fence.expected.version == start.version + 2
            assert other.is_applied(user, "m1") is not shared  # uncommitted where shared
        assert other.is_applied(user, "m2") and other.user_stamp(user) == fence.expected

        moved = graph_store.user_stamp(user)
        with (
            graph_store.fenced(user, moved, moved.epoch) as fence,
            pytest.raises(RuntimeError, match="boom"),
            graph_store.batched() as shared,
        ):
            graph_store.apply(plan(user, "m3"))
            raise RuntimeError("boom")
        if shared:
            assert not other.is_applied(user, "m3") and other.user_stamp(user) == moved
            assert fence.expected == moved
        else:
            assert other.is_applied(user, "m3") and fence.expected.version == moved.version + 1
    finally:
        other.close()


def test_a_batched_block_keeps_the_fence(graph_store: GraphStore, user: str) -> None:
    graph_store.apply(plan(user, "m0"))
    planned_on = graph_store.user_stamp(user)
    graph_store.apply(plan(user, "m1"))  # another writer moves the user
    with (
        graph_store.fenced(user, planned_on, planned_on.epoch),
        pytest.raises(StaleWriteError),
        graph_store.batched(),
    ):
        graph_store.apply(plan(user, "m2"))
    assert not graph_store.is_applied(user, "m2")


def test_a_fence_holds_the_writes_of_its_own_store_object_only(
    graph_store: GraphStore, store_spec: tuple[str, str], user: str
) -> None:
    """The fence is per store object and thread: another handle on the same database (a test's second
    store, another component's) is not fenced by it, and a thread without the fence writes as before."""
    graph_store.apply(plan(user, "m1"))
    planned_on = graph_store.user_stamp(user)
    graph_store.apply(plan(user, "m2"))
    other = open_store(*store_spec)
    try:
        with graph_store.fenced(user, planned_on, planned_on.epoch):
            with pytest.raises(StaleWriteError):
                graph_store.apply(plan(user, "m3"))
            other.apply(plan(user, "m4"))  # not this store's fence
            elsewhere = threading.Thread(target=graph_store.apply, args=(plan(user, "m5"),))
            elsewhere.start()
            elsewhere.join()  # not this thread's fence
    finally:
        other.close()
    assert [graph_store.is_applied(user, m) for m in ("m3", "m4", "m5")] == [False, True, True]
