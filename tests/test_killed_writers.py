"""What a writer killed between its graph commit and its ``finish`` leaves is finished by whoever comes next,
on every host (issue 42: "forgotten means gone everywhere, bytes on disk included").

Two hosts (an ``IndexKeeper`` over a directory of its own each, as in ``test_many_hosts``) against one real
graph store (SQLite, Neo4j) and one real Redis; host b also has an encoder cache and its place in the
removals record, as a worker or reader process does:
- a ``forget_user`` killed after its commit left the user's stamp, change feed and every host's files. Reconcile's
  orphan sweep, the ``forget_user`` run again, or the user's next lifetime files the erased lifetime's tombstone,
  and host b's erasure sweep then deletes its files and texts of it. A user created again between reconcile's
  listing and its check keeps its stamp and its new files;
- ``engram reindex`` (``reindex_user``) after a killed ``forget`` files the removal (host b's sweep drops the
  user's texts), scrubs the change feed of the forgotten fact and publishes the graph's stamp; after a killed
  apply it publishes the stamp (host b catches up) and files no removal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

from engram_api import keys
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.erasure import TextSweep, sweep_erased
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.writer.userwrite import UserWrite
from engram_api.versions import read_stamp
from engram_workers.maintenance import reindex_user, remove_orphans
from tests.support.builders import UserGraph, new_user, random_encode, write_step
from tests.support.stores import backend as backend  # the fixtures, brought in under their names
from tests.support.stores import store as store
from tests.test_many_hosts import Host, files_of, host, whole, write_on
from tests.test_many_hosts import graph as graph


def two_hosts(graph: GraphStore, tmp_path: Path, client: redis.Redis) -> tuple[Host, Host]:
    return host("a", graph, tmp_path, client), host("b", graph, tmp_path, client)


def guard_of(h: Host) -> Callable[[str], object]:
    """The maintenance guard of host ``h`` (the workers' ``UserWrites.open``); a busy user fails at once."""
    return lambda user_id: h.writes.open(user_id, wait=0)


def forget_user_again(a: Host, graph: GraphStore, user: str) -> None:
    def erase(write: UserWrite) -> None:  # ``Reader.forget_user``'s write, run again by the caller
        graph.forget_user(user)
        write.finish()

    a.writes.run(user, erase, wait=10)


def reconcile_on(a: Host, graph: GraphStore, user: str) -> None:
    report = remove_orphans(graph=graph, keeper=a.keeper, redis_client=a.writes.redis, guard=guard_of(a))
    assert user not in {f.user_id for f in report.failed} and report.orphan_stamps >= 1, report


def next_lifetime(a: Host, graph: GraphStore, user: str) -> None:
    """The user's next message, as the apply stage writes it: fenced first on the stamp Redis publishes (the
    lost lifetime's: refused, nothing written), then planned again on the graph's."""

    def body(write: UserWrite) -> None:  # a fresh plan each attempt (a refused one wrote nothing)
        write_step(write, UserGraph(graph, user), 0, [])

    a.writes.run(user, body, wait=10, published=True)


FINISHERS: dict[str, Callable[[Host, GraphStore, str], None]] = {
    "reconcile": reconcile_on,
    "forget_user again": forget_user_again,
    "the next lifetime": next_lifetime,
}


@pytest.mark.parametrize("finisher", list(FINISHERS))
def test_a_forget_user_killed_before_its_finish_leaves_no_file_or_text_on_any_host(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, finisher: str
) -> None:
    a, b = two_hosts(graph, tmp_path, redis_client)
    user, other = new_user(), new_user()
    said = UserGraph(graph, user, encode=lambda texts: random_encode([f"{user} {t}" for t in texts]))
    for written in (said, UserGraph(graph, other)):
        messages: list[str] = []
        write_on(a, written, 0, messages)
        write_on(b, written, 1, messages)  # b loads the user (its file), then both hold a copy
    encoder, texts = Embedder(model="all-MiniLM-L6-v2"), TextSweep()  # host b's process
    encoder.encode_cached(["Alex likes thing 1", "thing 1"], user_id=user)
    encoder.encode_cached(["Alex likes thing 0"], user_id=other)
    sweep_erased(redis_client, b.keeper, encoder, texts)
    stem, erased = VectorStore.stem(user), graph.user_stamp(user)
    marker = np.asarray(said.entities["alex"].embedding, dtype=np.float32).tobytes()
    assert len(files_of([a.root, b.root], stem)) == 4 and redis_client.exists(keys.change_feed(user))

    graph.forget_user(user)  # the writer dies here: its ``finish`` (tombstone, stamp, feed) never runs
    assert read_stamp(redis_client, user) == erased
    FINISHERS[finisher](a, graph, user)

    assert redis_client.zscore(keys.erased_indexes(), f"{stem}:{erased.epoch}") is not None
    assert not redis_client.exists(keys.change_feed(user))
    assert read_stamp(redis_client, user) == (None if finisher != "the next lifetime" else graph.user_stamp(user))
    for h in (a, b):
        sweep_erased(redis_client, h.keeper, encoder if h is b else None, texts if h is b else None)
    assert files_of([b.root], stem) == []
    assert not any(marker in p.read_bytes() for root in (a.root, b.root) for p in root.iterdir())
    assert len(files_of([a.root], stem)) == (2 if finisher == "the next lifetime" else 0)
    assert encoder.cached_users() == {other} and set(encoder._recent) == {"Alex likes thing 0"}
    assert len(files_of([a.root, b.root], VectorStore.stem(other))) == 4


def test_a_user_created_again_between_reconciles_listing_and_its_check_keeps_its_stamp_and_files(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconcile lists the stamps, then the graph's users; the user is created again right after that listing
    (a new lifetime, its stamp published). The check under the user's lease finds it in the graph and leaves
    its stamp; the new lifetime's files stay on every host's sweep. The lost lifetime's tombstone was filed by
    the write that created the new one."""
    a, b = two_hosts(graph, tmp_path, redis_client)
    user = new_user()
    messages: list[str] = []
    write_on(a, UserGraph(graph, user), 0, messages)
    write_on(b, UserGraph(graph, user), 1, messages)
    lost = graph.user_stamp(user)
    graph.forget_user(user)  # killed before its ``finish``
    listed = graph.list_users

    def listing() -> list[str]:
        known = listed()
        next_lifetime(a, graph, user)  # right after the listing
        return known

    monkeypatch.setattr(graph, "list_users", listing)
    report = remove_orphans(graph=graph, keeper=a.keeper, redis_client=redis_client, guard=guard_of(a))

    assert user not in {f.user_id for f in report.failed}
    now, stem = graph.user_stamp(user), VectorStore.stem(user)
    assert now.epoch != lost.epoch and read_stamp(redis_client, user) == now
    assert redis_client.zscore(keys.erased_indexes(), f"{stem}:{now.epoch}") is None
    assert redis_client.zscore(keys.erased_indexes(), f"{stem}:{lost.epoch}") is not None
    for h in (a, b):
        sweep_erased(redis_client, h.keeper)
    assert files_of([b.root], stem) == [] and len(files_of([a.root], stem)) == 2
    assert a.keeper.current(user, now).stamp == now


def test_reindex_after_a_killed_forget_files_the_removal_scrubs_the_feed_and_publishes_the_stamp(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis
) -> None:
    a, b = two_hosts(graph, tmp_path, redis_client)
    user, other = new_user(), new_user()
    said, messages = UserGraph(graph, user), []
    for step, h in ((0, a), (1, b), (3, a)):  # no step forgets (every third does): the feed holds steps 1 and 3
        facts = {i.node_id for i in graph.vectors(user)[0] if i.kind == "fact"}
        write_on(h, said, step, messages)
    (fact,) = {i.node_id for i in graph.vectors(user)[0] if i.kind == "fact"} - facts  # "Alex likes thing 3"
    encoder, texts = Embedder(model="all-MiniLM-L6-v2"), TextSweep()  # host b's process
    encoder.encode_cached(["Alex likes thing 3"], user_id=user)
    encoder.encode_cached(["Alex likes thing 0"], user_id=other)
    sweep_erased(redis_client, b.keeper, encoder, texts)
    assert any(fact in entry for entry in redis_client.zrange(keys.change_feed(user), 0, -1))

    assert graph.forget_fact(user, fact).removed_fact_ids == [fact]  # the writer dies before its ``finish``
    assert read_stamp(redis_client, user) != graph.user_stamp(user)
    rebuilt = a.writes.run(user, lambda write: reindex_user(a.keeper, write), wait=10)  # ``engram reindex``

    truth = whole(graph, user, tmp_path).rebuild(user)
    assert rebuilt.stamp == truth.stamp == read_stamp(redis_client, user) and fact not in rebuilt.node_ids()
    assert not any(fact in entry for entry in redis_client.zrange(keys.change_feed(user), 0, -1))
    assert b.keeper.current(user, truth.stamp).node_ids() == truth.node_ids()
    sweep_erased(redis_client, b.keeper, encoder, texts)
    assert encoder.cached_users() == {other} and set(encoder._recent) == {"Alex likes thing 0"}


def test_reindex_after_a_killed_apply_publishes_the_stamp_and_files_no_removal(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis
) -> None:
    a, b = two_hosts(graph, tmp_path, redis_client)
    user = new_user()
    said, messages = UserGraph(graph, user), []
    write_on(a, said, 0, messages)
    write_on(b, said, 1, messages)
    said.say([("Alex", "DRIVES", "bike", "Alex rides a bike to work")])  # committed; the writer dies here
    published = read_stamp(redis_client, user)
    assert published is not None and published < graph.user_stamp(user)

    a.writes.run(user, lambda write: reindex_user(a.keeper, write), wait=10)

    truth = whole(graph, user, tmp_path).rebuild(user)
    assert read_stamp(redis_client, user) == truth.stamp
    assert b.keeper.current(user, truth.stamp).node_ids() == truth.node_ids()
    assert redis_client.zscore(keys.forgotten_texts(), VectorStore.stem(user)) is None
