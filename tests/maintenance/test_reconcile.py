"""Reconcile: a damaged, other-lifetime, ahead or id-mismatched local index file is rebuilt to match the
graph; a behind one is caught up, and a user with no file on this host gets none (a host's files are a
cache of the users it serves)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from engram_api import keys
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.erasure import TextSweep
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.writer.userwrite import UserWrites
from engram_workers.maintenance import ReconcileReport, reconcile
from tests.support.builders import GuardSpy, UserGraph, new_user, random_encode

FACTS = [
    ("Alex", "WORKS_AT", "Dell", "Alex works at Dell"),
    ("Alex", "LIVES_IN", "Austin", "Alex lives in Austin"),
    ("Alex", "PLAYS", "guitar", "Alex plays guitar"),
]


def _corrupt(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    keeper.vectors.path_for(user).write_bytes(b"\x00garbage, not a FAISS index" * 7)


def _truncate(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    path = keeper.vectors.path_for(user)
    path.write_bytes(path.read_bytes()[:100])


def _drop_one_id(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    index = keeper.vectors.load(user)
    assert index is not None
    index.remove([next(iter(sorted(index.node_ids())))])
    keeper.vectors.save(user, index)


def _add_stray_id(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    index = keeper.vectors.load(user)
    assert index is not None
    index.upsert([("fact-forgotten", "fact", random_encode(["forgotten"])[0].tolist())])
    keeper.vectors.save(user, index)


def _write_behind_its_back(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    # An apply whose process died after the graph commit, before the index write.
    UserGraph(store, user).say([("Alex", "DRIVES", "bike", "Alex rides a bike to work")])


DAMAGE: dict[str, tuple[Callable[[GraphStore, IndexKeeper, str], None], str, int, int]] = {
    "garbage": (_corrupt, "unreadable", 0, 0),
    "truncated": (_truncate, "unreadable", 0, 0),
    "one id removed": (_drop_one_id, "ids differ", 1, 0),
    "stray id": (_add_stray_id, "ids differ", 0, 1),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_index_is_rebuilt_to_match_the_graph(
    store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str, damage: str
) -> None:
    healthy = new_user()
    for u in (user, healthy):
        UserGraph(store, u).say(FACTS)
        keeper.rebuild(u)
    harm, problem, missing, extra = DAMAGE[damage]
    harm(store, keeper, user)

    report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user, healthy])

    assert not report.failed
    assert (report.users, report.ok, report.rebuilt) == (2, 1, 1)
    fixed = report.fixed[0]
    assert (fixed.user_id, fixed.problem, fixed.missing_ids, fixed.extra_ids) == (user, problem, missing, extra)
    items, version = store.vectors(user)
    assert fixed.graph_version == version and fixed.rebuilt_rows == len(items)
    index = keeper.vectors.load(user)
    assert index is not None and index.version == version
    assert index.node_ids() == {item.node_id for item in items}
    assert guard.entered == [user, healthy]
    print(f"\n{damage}: {fixed.problem} ({fixed.detail})")

    again = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user, healthy])
    assert (again.ok, again.rebuilt) == (2, 0)


def test_an_index_ahead_of_the_graph_is_rebuilt(
    store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say(FACTS)
    index = keeper.rebuild(user)
    index.version += 5  # e.g. the graph was restored from an older backup
    keeper.vectors.save(user, index)

    report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user])

    assert report.fixed[0].problem == "ahead"
    assert keeper.vectors.file_stamp(user) == store.user_stamp(user)


def test_a_missing_file_stays_missing_and_a_behind_one_is_caught_up(
    store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    absent = new_user()
    for u in (user, absent):
        UserGraph(store, u).say(FACTS)
    keeper.rebuild(user)
    _write_behind_its_back(store, keeper, user)  # e.g. another host applied a message since
    rebuilds = keeper.rebuilds

    report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user, absent])

    assert (report.users, report.ok, report.rebuilt, report.failed) == (2, 2, 0, [])
    assert not keeper.vectors.path_for(absent).exists()
    index = keeper.vectors.load(user)
    assert index is not None and index.stamp == store.user_stamp(user)
    assert index.node_ids() == {item.node_id for item in store.vectors(user)[0]}
    assert (keeper.rebuilds, keeper.catchups) == (rebuilds, 1)


# Runs on SQLite only: on the shared Neo4j database every test's users and feedback are visible.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_full_run_visits_every_user_and_the_report_serializes(
    backend: str, store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    other = new_user()
    for u in (user, other):
        UserGraph(store, u).say(FACTS)
    keeper.rebuild(user)  # ``other`` has no index file on this host: no fault, and none is made
    keeper.vectors.path_for(user).write_bytes(b"\x00garbage")

    report = reconcile(graph=store, keeper=keeper, guard=guard)

    assert (report.users, report.ok, report.rebuilt) == (2, 1, 1)
    assert report.fixed[0].user_id == user and report.fixed[0].problem == "unreadable"
    assert not keeper.vectors.path_for(other).exists()
    assert ReconcileReport.model_validate_json(report.model_dump_json()) == report


def test_artefacts_of_users_the_graph_does_not_know_are_removed(
    store: GraphStore, keeper: IndexKeeper, user: str, redis_client: redis.Redis
) -> None:
    """A reader's rebuild that raced ``forget_user`` wrote the forgotten user's file again, and a late
    publish (or an erasure whose ``finish`` never ran) left its stamp in Redis: reconcile removes both, files
    the erased lifetime's tombstone (every host's sweep deletes its files of it, every process's encoder cache
    drops the user's texts), and keeps every known user's."""
    guard = GuardSpy(UserWrites(graph=store, keeper=keeper, redis_client=redis_client, lease_ttl_s=30))
    gone = new_user()
    for u in (user, gone):
        UserGraph(store, u).say(FACTS)
        redis_client.set(keys.user_version(u), str(store.user_stamp(u)))
    erased = store.user_stamp(gone)
    racing_rebuild = keeper.rebuild(gone)
    store.forget_user(gone)
    keeper.vectors.save(gone, racing_rebuild)
    keeper.rebuild(user)

    report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user], redis_client=redis_client)

    assert report.orphan_files == 1 and report.orphan_stamps >= 1, report
    assert not keeper.vectors.path_for(gone).exists()
    assert redis_client.get(keys.user_version(gone)) is None
    assert redis_client.zscore(keys.erased_indexes(), f"{VectorStore.stem(gone)}:{erased.epoch}") is not None
    assert not [m for m in redis_client.zrange(keys.erased_indexes(), 0, -1) if m.startswith(VectorStore.stem(user))]
    assert keeper.vectors.path_for(user).exists()
    assert redis_client.get(keys.user_version(user)) == str(store.user_stamp(user))
    assert (report.ok, report.rebuilt) == (1, 0)


def _forget_whose_writer_died(store: GraphStore, keeper: IndexKeeper, user: str) -> None:
    # A forget committed in the graph by a writer that died before its ``finish`` (nothing filed, no index write).
    fact_id = next(item.node_id for item in store.vectors(user)[0] if item.kind == "fact")
    assert store.forget_fact(user, fact_id).removed_fact_ids == [fact_id]


ORPHANS: dict[str, Callable[[GraphStore, IndexKeeper, str], None]] = {
    "a forget whose writer died before its finish": _forget_whose_writer_died,
    "stray id": _add_stray_id,
}


@pytest.mark.parametrize("orphan", list(ORPHANS))
def test_a_row_reconcile_finds_the_graph_lost_files_the_users_removal_for_every_encoder_cache(
    store: GraphStore, keeper: IndexKeeper, user: str, redis_client: redis.Redis, orphan: str
) -> None:
    """Records a host's copy holds and the graph no longer has (a forget whose writer died between the graph
    commit and ``finish``, which filed nothing; a stray row): reconcile's fix files the user's removal
    (``record_removal``, as any removing write), so another process's erasure sweep drops the user's cached
    texts; another user's stay."""
    other = new_user()
    for u in (user, other):
        UserGraph(store, u).say(FACTS)
        keeper.rebuild(u)
    encoder, texts = Embedder(model="all-MiniLM-L6-v2"), TextSweep()  # another process's cache and place
    encoder.encode_cached(["Alex plays guitar", "guitar"], user_id=user)
    encoder.encode_cached(["Alex works at Dell"], user_id=other)
    texts(redis_client, encoder)  # its first sweep: its place is now the record's end
    ORPHANS[orphan](store, keeper, user)

    guard = GuardSpy(UserWrites(graph=store, keeper=keeper, redis_client=redis_client, lease_ttl_s=30))
    report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=[user, other], redis_client=redis_client)

    assert not report.failed
    assert redis_client.zscore(keys.forgotten_texts(), VectorStore.stem(user)) is not None
    assert redis_client.zscore(keys.forgotten_texts(), VectorStore.stem(other)) is None
    assert texts(redis_client, encoder) == 2
    assert encoder.cached_users() == {other} and set(encoder._recent) == {"Alex works at Dell"}
    index = keeper.vectors.load(user)
    assert index is not None and index.node_ids() == {item.node_id for item in store.vectors(user)[0]}
