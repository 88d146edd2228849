"""Many hosts, one memory: every process keeps its own FAISS copy in its own data directory, caught up
from the graph by version (``engram_api.storage.faiss.sync``); nothing is shared but the graph and Redis.

Two apply "hosts" and one reader host, each an ``IndexKeeper`` over its own directory against one real
graph store (SQLite and Neo4j) and one real Redis. Writes for one user alternate between the apply hosts;
after each one the reader's index answers exactly what an index read whole from the graph answers, and no
host reads the user whole again after its first load. A ``forget_user`` in the middle leaves no file and
no byte of the user's vectors on any host once each has swept (``engram_api.storage.faiss.erasure``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis

from engram_api import keys
from engram_api.settings import Settings
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.erasure import TextSweep, record_removal, sweep_erased
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_api.versions import ABSENT, Stamp
from engram_workers.consolidation.resolution import Vectors
from tests.support.builders import DIM, UserGraph, new_user, random_encode, write_step
from tests.support.stores import backend as backend  # the fixtures, brought in under their names
from tests.support.stores import store as store


@dataclass
class Host:
    name: str
    root: Path
    keeper: IndexKeeper
    writes: UserWrites


@pytest.fixture
def graph(store: GraphStore) -> GraphStore:
    """One real graph store every host shares (the maintenance suite's: SQLite, then Neo4j)."""
    return store


def host(name: str, graph: GraphStore, tmp_path: Path, client: redis.Redis) -> Host:
    root = tmp_path / name / "indexes"
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=root, dim=DIM))
    return Host(name, root, keeper, UserWrites(graph=graph, keeper=keeper, redis_client=client, lease_ttl_s=30))


def whole(graph: GraphStore, user: str, tmp_path: Path) -> IndexKeeper:
    """A single-host reader's answer: the user's index read whole from the graph, nothing kept."""
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=tmp_path / "whole", dim=DIM), cache=False, persist=False)
    keeper.rebuild(user)
    return keeper


def write_on(h: Host, said: UserGraph, step: int, messages: list[str]) -> None:
    """One message through ``h``'s UserWrite (``write_step``: every third also forgets one)."""
    h.writes.run(said.user_id, lambda write: write_step(write, said, step, messages), wait=10)
    messages[:] = [e.id for e in said.graph.episodes(said.user_id)]


def assert_reader_matches_whole(reader: Host, graph: GraphStore, user: str, tmp_path: Path) -> None:
    got = reader.keeper.current(user, graph.user_stamp(user))
    truth = whole(graph, user, tmp_path).rebuild(user)
    assert got.stamp == truth.stamp and got.node_ids() == truth.node_ids()
    for query in random_encode([f"query {i}" for i in range(5)]):
        assert [h.node_id for h in got.search(query, 10)] == [h.node_id for h in truth.search(query, 10)]


def files_of(roots: list[Path], stem: str) -> list[Path]:
    return [p for root in roots if root.is_dir() for p in root.iterdir() if p.name.startswith(stem)]


def test_writes_alternating_hosts_never_rebuild_and_erasure_reaches_every_host(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis
) -> None:
    user = new_user()
    a, b, reader = (host(n, graph, tmp_path, redis_client) for n in ("apply-a", "apply-b", "reader"))
    said = UserGraph(graph, user)
    messages: list[str] = []
    for step in range(8):
        write_on((a, b)[step % 2], said, step, messages)
        assert_reader_matches_whole(reader, graph, user, tmp_path)
        assert reader.keeper.rebuilds == 1  # its first load only
    # The user was created by a's write (no read at all); b loaded it once at its first write, then every
    # host only caught up: the whole user is never read again, whichever host wrote last.
    assert (a.keeper.rebuilds, b.keeper.rebuilds, reader.keeper.rebuilds) == (0, 1, 1)
    assert a.keeper.catchups >= 3 and b.keeper.catchups >= 3 and reader.keeper.catchups >= 7

    # A restarted process finds its local file behind the graph: it catches up, it does not rebuild.
    restarted = host("apply-a", graph, tmp_path, redis_client)
    write_on(b, said, 8, messages)
    assert restarted.keeper.current(user, graph.user_stamp(user)).stamp == graph.user_stamp(user)
    assert (restarted.keeper.rebuilds, restarted.keeper.catchups) == (0, 1)

    # forget_user from the reader host; every host sweeps (what each process's IndexSweeper does on its timer).
    marker = np.asarray(said.entities["alex"].embedding, dtype=np.float32).tobytes()
    roots = [a.root, b.root, reader.root]
    stem = VectorStore.stem(user)
    assert len(files_of(roots, stem)) == 6 and all(marker in p.read_bytes() for p in roots[0].glob("*.faiss"))

    def erase(write: UserWrite) -> None:
        graph.forget_user(user)
        write.finish()

    reader.writes.run(user, erase, wait=10)
    for h in (a, b, reader):
        sweep_erased(redis_client, h.keeper)
        assert user not in h.keeper.cached_users()
    assert files_of(roots, stem) == []
    assert not any(marker in p.read_bytes() for root in roots for p in root.iterdir())
    for h in (a, b, reader):
        assert len(h.keeper.current(user, graph.user_stamp(user))) == 0

    # A new lifetime of the user: files of it survive the old lifetime's tombstone; each host loads it once.
    said = UserGraph(graph, user)
    messages = []
    before = {h.name: h.keeper.rebuilds for h in (a, b, reader)}
    for step in range(4):
        write_on((b, a)[step % 2], said, step, messages)
        assert_reader_matches_whole(reader, graph, user, tmp_path)
    for h in (a, b):
        sweep_erased(redis_client, h.keeper)
    assert len(files_of(roots, stem)) == 6
    assert {h.name: h.keeper.rebuilds - before[h.name] for h in (a, b, reader)} == {
        "apply-a": 1, "apply-b": 0, "reader": 1,
    }  # fmt: skip
    assert graph.user_stamp(user) != ABSENT


def test_an_apply_hosts_encoder_cache_loses_an_erased_users_texts_at_its_sweep(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis
) -> None:
    """Issue 42 in a worker process: the apply stage caches a user's names and statements in its process's
    encoder cache (``Vectors``); after ``forget_user`` on another host, that process's erasure sweep drops
    every text the user cached (one both users had too) and keeps the other user's own."""
    apply, reader = host("apply", graph, tmp_path, redis_client), host("reader", graph, tmp_path, redis_client)
    user, other = new_user(), new_user()
    write_on(apply, UserGraph(graph, user), 0, [])
    encoder = Embedder(model="all-MiniLM-L6-v2")  # this apply process's own cache
    Vectors(encoder, user, ["Tampa", f"{user} lives in Tampa", "User"])
    Vectors(encoder, other, ["Denver", f"{other} lives in Denver", "User"])
    sweep_erased(redis_client, apply.keeper, encoder)  # nothing erased yet: nothing goes
    assert encoder.cached_users() == {user, other}

    def erase(write: UserWrite) -> None:
        graph.forget_user(user)
        write.finish()

    reader.writes.run(user, erase, wait=10)
    sweep_erased(redis_client, apply.keeper, encoder)
    assert encoder.cached_users() == {other}
    assert set(encoder._recent) == {"Denver", f"{other} lives in Denver"}


def test_an_apply_hosts_encoder_cache_loses_a_users_texts_at_its_sweep_after_another_hosts_forget(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single ``forget`` on another host: that write files the user's removal (``record_removal``), and this
    process's next sweep drops every text the user cached (its place in the record, ``TextSweep``, moves on:
    a later sweep drops nothing new); the other user's texts stay. A sweep that finds removals trimmed past
    its place, or the sequence restarted, cannot tell whose texts went: it drops them all."""
    apply, other_host = host("apply", graph, tmp_path, redis_client), host("other", graph, tmp_path, redis_client)
    user, other = new_user(), new_user()
    said, messages = UserGraph(graph, user), []
    write_on(apply, said, 0, messages)
    encoder, texts = Embedder(model="all-MiniLM-L6-v2"), TextSweep()  # this apply process's own cache and place
    Vectors(encoder, user, ["Tampa", f"{user} lives in Tampa", "User"])
    Vectors(encoder, other, ["Denver", f"{other} lives in Denver"])
    sweep_erased(redis_client, apply.keeper, encoder, texts)
    assert encoder.cached_users() == {user, other}

    def forget_one(write: UserWrite) -> None:  # a forget's write (``Reader.forget``)
        gone = graph.forget_message(user, messages[0])
        write.finish(removals=[*gone.removed_fact_ids, *gone.removed_entity_ids, *gone.removed_chunk_ids])

    other_host.writes.run(user, forget_one, wait=10)
    sweep_erased(redis_client, apply.keeper, encoder, texts)
    assert set(encoder._recent) == {"Denver", f"{other} lives in Denver"}
    Vectors(encoder, user, ["Austin"])  # the user's next message, after the forget
    sweep_erased(redis_client, apply.keeper, encoder, texts)
    assert "Austin" in encoder._recent  # no removal since this process's place: nothing more goes

    monkeypatch.setattr("engram_api.storage.faiss.erasure.REMOVALS_KEPT", 1)
    for someone in (new_user(), new_user()):  # two users' removals: the record keeps one, the other is lost
        record_removal(redis_client, someone)
    sweep_erased(redis_client, apply.keeper, encoder, texts)
    assert encoder.cached_users() == set()
    Vectors(encoder, other, ["Denver"])
    redis_client.delete(keys.forgotten_texts(), keys.forgotten_texts_sequence())  # Redis lost the record
    sweep_erased(redis_client, apply.keeper, encoder, texts)
    assert encoder.cached_users() == set()


def test_a_writer_whose_copy_is_behind_catches_up_from_the_feed_not_the_graph(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes alternating hosts: each writer finds its copy one write behind (the other host wrote last) and
    brings it up from the change feed that host published with its stamp, reading none of the graph's
    vectors, also when that write removed records (every third step forgets a message: its entry lists the
    removed ids); its copy then equals a whole read, and a reader host still answers as a single-host reader.
    A forget whose host holds a copy behind catches it up from the feed too (``IndexKeeper.advance``)."""
    user = new_user()
    a, b, reader = (host(n, graph, tmp_path, redis_client) for n in ("apply-a", "apply-b", "reader"))
    said = UserGraph(graph, user)
    messages: list[str] = []
    write_on(a, said, 0, messages)
    write_on(b, said, 1, messages)  # b's first load of the user (a rebuild)
    vector_reads: list[str] = []
    real = graph.vector_changes
    monkeypatch.setattr(graph, "vector_changes", lambda *args, **kw: vector_reads.append(args[0]) or real(*args, **kw))

    def write_and_check(h: Host, step: int) -> None:
        write_on(h, said, step, messages)
        held = h.keeper.held(user)
        truth = whole(graph, user, tmp_path).rebuild(user)
        assert held is not None and held.stamp == truth.stamp and held.node_ids() == truth.node_ids()

    for i, step in enumerate(range(2, 14)):  # steps 2, 5, 8, 11 also forget a message
        write_and_check((a, b)[i % 2], step)
        assert vector_reads == []
        assert_reader_matches_whole(reader, graph, user, tmp_path)
        vector_reads.clear()  # the reader's own catch-up reads
    assert (a.keeper.feed_catchups, b.keeper.feed_catchups) == (6, 6)
    assert (a.keeper.rebuilds, b.keeper.rebuilds, reader.keeper.rebuilds) == (0, 1, 1)

    def forget_only(write: UserWrite) -> None:  # a forget's write: no index read before, its removals after
        gone = graph.forget_message(user, messages.pop(0))
        write.finish(removals=[*gone.removed_fact_ids, *gone.removed_entity_ids, *gone.removed_chunk_ids])

    a.writes.run(user, forget_only, wait=10)  # a is one write behind (b wrote step 13)
    held = a.keeper.held(user)
    assert held is not None and held.node_ids() == whole(graph, user, tmp_path).rebuild(user).node_ids()
    assert vector_reads == [] and a.keeper.feed_catchups == 7 and a.keeper.rebuilds == 0
    assert_reader_matches_whole(reader, graph, user, tmp_path)


def test_a_copy_behind_the_removal_horizon_is_rebuilt_once(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engram_api.storage.graph.neo4j.connection.REMOVAL_RETAIN", 2)
    monkeypatch.setattr("engram_api.storage.graph.sqlite.rows.REMOVAL_RETAIN", 2)
    user = new_user()
    a, reader = host("apply-a", graph, tmp_path, redis_client), host("reader", graph, tmp_path, redis_client)
    said = UserGraph(graph, user)
    messages: list[str] = []
    write_on(a, said, 0, messages)
    assert_reader_matches_whole(reader, graph, user, tmp_path)
    for step in range(1, 9):  # forgets at steps 2, 5, 8 move the horizon past the reader's copy
        write_on(a, said, step, messages)
    assert reader.keeper.rebuilds == 1
    assert_reader_matches_whole(reader, graph, user, tmp_path)
    assert (reader.keeper.rebuilds, reader.keeper.catchups) == (2, 0)
    write_on(a, said, 9, messages)
    assert_reader_matches_whole(reader, graph, user, tmp_path)
    assert (reader.keeper.rebuilds, reader.keeper.catchups) == (2, 1)


@pytest.mark.parametrize("fold_min", [None, 2], ids=["overlay", "folded"])
def test_a_copy_held_in_memory_only_catches_up_by_what_changed(
    graph: GraphStore, tmp_path: Path, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, fold_min: int | None
) -> None:
    """``IndexKeeper(persist=False)`` (a maintenance run's copies): the whole read is held as the copy's base,
    shared by every copy after it, so a catch-up clones only what changed since the load, never the user's
    vectors; past the fold threshold (``folded``) the changes are folded into a new exact base. Every copy
    answers exactly (ids, kinds, scores, order) what the same vectors upserted into an empty index answer,
    which is how such a copy was held before. Writes alternate additions and message forgets."""
    if fold_min is not None:
        monkeypatch.setattr("engram_api.storage.faiss.files._FOLD_MIN_ROWS", fold_min)
    user = new_user()
    a = host("apply-a", graph, tmp_path, redis_client)
    said = UserGraph(graph, user)
    messages: list[str] = []
    for step in range(3):
        write_on(a, said, step, messages)
    memory = IndexKeeper(
        graph=graph, vectors=VectorStore(root=tmp_path / "memory", dim=DIM, compact_ratio=0.05), persist=False
    )
    loaded = memory.current(user, graph.user_stamp(user))
    assert loaded.overlay_size == 0 and len(loaded.base_rows) == len(loaded) > 0
    folds = 0
    for step in range(3, 12):  # steps 5, 8 and 11 also forget a message
        write_on(a, said, step, messages)
        got = memory.current(user, graph.user_stamp(user))
        assert got.stamp == graph.user_stamp(user)
        shared = all(got.base.get(kind) is index for kind, index in loaded.base.items())
        if fold_min is None:
            # The base is the load's, shared; the overlay holds only vectors the catch-ups brought in.
            assert shared and len(got.rows) <= memory.catchup_vector_bytes // (4 * DIM)
        else:
            folds += not shared
            assert got.overlay_size <= max(fold_min, 0.05 * len(got.base_rows))
            loaded = got
        items, _ = graph.vectors(user)
        before = memory.vectors.new()
        before.upsert((item.node_id, item.kind, item.embedding) for item in items)
        assert got.node_ids() == before.node_ids()
        for query in random_encode([f"query {step} {i}" for i in range(4)]):
            for k in (5, len(before)):
                for kind in (None, "fact", "episode"):
                    assert got.search(query, k, kind) == before.search(query, k, kind)
    assert (memory.rebuilds, memory.catchups) == (1, 9)
    assert fold_min is None or folds >= 2
    assert not (tmp_path / "memory").exists()


def test_the_health_probe_lists_no_index_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engram_api.client import MemoryClient
    from engram_api.health import check_all

    settings = Settings(data_dir=tmp_path)
    settings.index_dir.mkdir(parents=True)
    (settings.index_dir / f"{VectorStore.stem('someone')}.faiss").write_bytes(b"cache")

    def listing(*_: object, **__: object) -> None:
        raise AssertionError("the health probe listed a directory")

    for name in ("glob", "iterdir", "rglob"):
        monkeypatch.setattr(Path, name, listing)
    monkeypatch.setattr("os.scandir", listing)
    monkeypatch.setattr("os.listdir", listing)
    with MemoryClient(settings=settings) as client:
        row = check_all(client).checks["index_dir"]
    assert row.ok and str(settings.index_dir) in row.detail, row


def test_each_reader_process_sweeps_on_its_own_timer(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    """The reader library's sweeper (started with the reader when Redis is configured) deletes this host's
    files of a user erased by another host, and the user's queries from its encoder cache, with no call from
    the application."""
    from engram_api.client import MemoryClient
    from engram_api.storage.faiss.erasure import record_erasure
    from tests.support.operator_processes import wait_until

    settings = Settings(data_dir=tmp_path, index_sweep_interval_s=0.05)
    with MemoryClient(settings=settings, redis_url=redis_url) as client:
        keeper = client.reader.keeper
        assert client.sweeper is not None and client.sweeper.keeper is keeper
        user, other = new_user(), new_user()
        for u, epoch in ((user, 7), (other, 7)):
            index = keeper.vectors.new()
            index.upsert([(f"{u}-fact", "fact", random_encode([u])[0])])
            index.stamp = Stamp(epoch, 3)
            keeper.vectors.save(u, index)
        queries = {u: f"where did {u} park?" for u in (user, other)}
        for u, query in queries.items():
            client.recall(u, query)
        recent = client.reader.embedder._recent
        assert set(queries.values()) <= set(recent)  # premise: this process's encoder cache holds the queries
        record_erasure(redis_client, user, 7)  # what another host's forget_user leaves
        wait_until(lambda: not keeper.vectors.path_for(user).exists(), timeout=30, what="the reader's sweep")
        assert keeper.vectors.path_for(other).exists() and client.sweeper.sweeps >= 1
        assert queries[user] not in recent and queries[other] in recent  # dropped before the files go
        record_erasure(redis_client, other, 6)  # an earlier lifetime's tombstone: the newer files stay
        sweeps = client.sweeper.sweeps
        wait_until(lambda: client.sweeper.sweeps > sweeps + 1, timeout=30, what="two more sweeps")
        assert keeper.vectors.path_for(other).exists()
