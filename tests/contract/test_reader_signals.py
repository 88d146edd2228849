"""A reader host's copies of a user (FAISS index, snapshot) after another host's write, on both backends
with a real Redis: one read of the graph catches both up (``engram_api.reader.catchup``), and a writer's
stamp signal (``engram_api.reader.signals``) lets the reader do it before the next recall.

The writer is the apply stage's path (``Memory``: plan, one transaction, FAISS delta, published stamp) with
its own index directory; the reader host has its own ``IndexKeeper`` over another directory. The oracle is
a fresh reader (nothing held) over a third directory: same ids, channels and scores (the keyword channel
left out, as in test_hybrid_recall: a snapshot ranks keywords with the user's own statistics).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api import keys
from engram_api.reader.reader import Reader
from engram_api.reader.signals import StampSignals, parse_signal
from engram_api.settings import Settings
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.versions import Stamp
from tests.support.factories import at, new_user

from .test_hybrid_recall import FILLER, NO_KEYWORD, Memory, embedder  # noqa: F401 - ``embedder``: the fixture

# What a reader reads of the graph to answer or to catch up.
READS = (
    "user_changes", "vector_changes", "stamped_vectors", "snapshot", "refresh_snapshot", "graph_step",
    "keyword_search", "get_facts", "get_chunks",
)  # fmt: skip
READER_THREADS = "engram-recall-io"  # where a reader's catch-ups run (``ReaderThreads``)


class Reads:
    """The graph reads made while installed, as (method, user id): by any thread, or with ``threads`` only
    by the threads whose name starts so (the reader's: the writer's own reads are not the reader's)."""

    def __init__(self, graph: GraphStore, threads: str = "") -> None:
        self.graph = graph
        self.threads = threads
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Reads:
        for name in READS:
            real = getattr(self.graph, name)

            def counted(*args: Any, _name: str = name, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
                user = args[0] if isinstance(args[0], str) else args[0].user_id  # a snapshot refreshes by itself
                if threading.current_thread().name.startswith(self.threads):
                    with self._lock:
                        self.calls.append((_name, user))
                return _real(*args, **kwargs)

            setattr(self.graph, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in READS:
            delattr(self.graph, name)

    def users(self) -> set[str]:
        with self._lock:
            return {user for _, user in self.calls}


def _host(memory: Memory, root: Path, **settings: Any) -> Reader:
    keeper = IndexKeeper(graph=memory.graph, vectors=VectorStore(root=root, dim=memory.embedder.dim))
    return Reader(
        settings=Settings(**settings), graph=memory.graph, keeper=keeper, embedder=memory.embedder,
        redis_client=memory.redis,
    )  # fmt: skip


def _until(done: Callable[[], bool], what: str) -> None:
    """Wait for ``done`` (another thread's work); fail, naming ``what``, if it never comes."""
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _answer(reader: Reader, user: str, question: str) -> list[tuple[str, tuple[str, ...], float]]:
    items = reader.recall(user, question, k=10, recipe=NO_KEYWORD).items
    return [(i.id, tuple(i.channels), round(i.score, 4)) for i in items]


def _warm(reader: Reader, user: str) -> None:
    """Three recalls: the index loaded, the snapshot loaded (on the second recall at a stamp) and used."""
    for question in ("first question", "second question", "third question"):
        reader.recall(user, question)
        reader.flush()
    assert reader.snapshots.peek(user) is not None


@pytest.fixture
def memory(graph_store: GraphStore, tmp_path: Path, embedder: Embedder, redis_client: redis.Redis) -> Memory:  # noqa: F811
    return Memory(graph_store, tmp_path / "writer", embedder, redis_client)


@pytest.fixture
def listening(memory: Memory, tmp_path: Path) -> Iterator[tuple[Reader, StampSignals]]:
    """A reader host listening for stamps, subscribed before the test writes anything."""
    reader = _host(memory, tmp_path / "reader")
    signals = StampSignals(memory.redis, reader.catchups.signalled_stamp).start()
    _until(signals.subscribed.is_set, "subscribed")
    yield reader, signals
    signals.stop()
    reader.flush()


def _chatter(memory: Memory, user: str, start: int = 0) -> None:
    for i, text in enumerate(FILLER):
        memory.say(user, f"filler-{i}", f"{text} ({user[-4:]})", at(start + i))


def test_a_signal_catches_the_reader_up_before_the_recall_which_then_reads_nothing(
    memory: Memory, listening: tuple[Reader, StampSignals], tmp_path: Path
) -> None:
    reader, _ = listening
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(20))
    stamp = memory.graph.user_stamp(user)
    _until(lambda: (s := reader.snapshots.peek(user)) is not None and s.stamp == stamp, "the snapshot caught up")
    reader.flush()
    index = reader.keeper.held(user)
    assert index is not None and index.stamp == stamp and reader.catchups.signalled >= 1
    with Reads(memory.graph) as reads:
        got = _answer(reader, user, "aurora borealis trip")
    assert reads.calls == []  # both copies were current: no read of the graph at all
    assert got == _answer(_host(memory, tmp_path / "fresh"), user, "aurora borealis trip")
    again = reader.recall(user, "aurora borealis trip", k=10, recipe=NO_KEYWORD)  # the result cache's copy
    assert "aurora" in {source for item in again.items for source in item.source_ids}  # the new message


def test_a_lost_signal_still_gives_the_right_answer_with_one_read(memory: Memory, tmp_path: Path) -> None:
    reader = _host(memory, tmp_path / "reader")  # never subscribed: every signal is lost to it
    user = new_user()
    _chatter(memory, user)
    _warm(reader, user)
    memory.say(user, "move", "We moved to Denver this spring.", at(20))
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(21))
    memory.redis.delete(keys.change_feed(user))  # the writers' feed gone (expired): the graph it is
    with Reads(memory.graph) as reads:
        got = _answer(reader, user, "where does the user live now?")
        reader.flush()
    assert reads.calls == [("user_changes", user)]  # the index and the snapshot: one read
    stamp = memory.graph.user_stamp(user)
    held, index = reader.snapshots.peek(user), reader.keeper.held(user)
    assert held is not None and held.stamp == stamp and index is not None and index.stamp == stamp
    assert got == _answer(_host(memory, tmp_path / "fresh"), user, "where does the user live now?")

    # Signals that do not parse are dropped; one ahead of the graph (forged, or from a restored graph's
    # writer) moves the copies to the graph's stamp at most: the next answer is still the graph's.
    for data in ("", "no-stamp", f"{user} x:y", f"{user} 1:0"):
        assert parse_signal(data) is None
    memory.say(user, "later", "Nothing much happened today.", at(22))
    reader.catchups.signalled_stamp(user, memory.graph.user_stamp(user)._replace(version=stamp.version + 5))
    reader.flush()
    assert reader.snapshots.peek(user).stamp == memory.graph.user_stamp(user)  # type: ignore[union-attr]
    assert _answer(reader, user, "what happened today?") == _answer(
        _host(memory, tmp_path / "fresh-2"), user, "what happened today?"
    )


def test_a_signal_for_another_user_changes_nothing_of_this_users(
    memory: Memory, listening: tuple[Reader, StampSignals]
) -> None:
    reader, signals = listening
    mine, other = new_user(), new_user()
    _chatter(memory, mine)
    _chatter(memory, other, start=10)
    _warm(reader, mine)
    _warm(reader, other)
    my_index, my_snapshot = reader.keeper.held(mine), reader.snapshots.peek(mine)
    before = signals.received
    with Reads(memory.graph, threads=READER_THREADS) as reads:
        memory.say(other, "news", "My brother got a new job in Lisbon.", at(30))
        stamp = memory.graph.user_stamp(other)
        _until(lambda: (s := reader.snapshots.peek(other)) is not None and s.stamp == stamp, "the other caught up")
        reader.flush()
    assert signals.received > before
    assert mine not in reads.users()  # nothing of this user's was read ...
    assert reader.keeper.held(mine) is my_index and reader.snapshots.peek(mine) is my_snapshot  # ... nor moved


def test_a_users_signal_never_loads_a_user_the_reader_does_not_hold(
    memory: Memory, listening: tuple[Reader, StampSignals]
) -> None:
    reader, signals = listening
    held_user, stranger = new_user(), new_user()
    _chatter(memory, held_user)
    _warm(reader, held_user)
    with Reads(memory.graph, threads=READER_THREADS) as reads:
        before = signals.received
        _chatter(memory, stranger, start=10)  # six writes, six signals: none for a user this reader holds
        memory.say(held_user, "news", "My brother got a new job in Lisbon.", at(30))
        stamp = memory.graph.user_stamp(held_user)
        _until(lambda: signals.received >= before + 7, "every signal received")
        _until(lambda: (s := reader.snapshots.peek(held_user)) is not None and s.stamp == stamp, "caught up")
        reader.flush()
    # The stranger's signals read nothing, not even of the stranger; the held user's was caught up from the
    # writers' change feed (no read) or, had it expired, by one read of the graph.
    assert reads.users() == ({held_user} if reader.catchups.from_feed == 0 else set())
    assert reader.keeper.held(stranger) is None and reader.snapshots.peek(stranger) is None
    assert not list((Path(reader.keeper.vectors.root)).glob(f"{VectorStore.stem(stranger)}*"))


def test_a_writer_sends_each_stamp_that_moves_forward(memory: Memory, redis_client: redis.Redis) -> None:
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.stamps_channel())
    try:
        user = new_user()
        memory.say(user, "one", "Hello there.", at(1))
        memory.say(user, "two", "Hello again.", at(2))
        got: list[tuple[str, Stamp]] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1.0)
            if message is not None and (parsed := parse_signal(message["data"])) is not None and parsed[0] == user:
                got.append(parsed)
        stamp = memory.graph.user_stamp(user)
        assert got == [(user, stamp._replace(version=stamp.version - 1)), (user, stamp)]
    finally:
        pubsub.close()


def test_a_snapshot_too_far_behind_for_the_recall_is_refreshed_off_its_path_across_a_forget(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held snapshot farther behind than a recall refreshes (``CATCH_UP_VERSIONS``, here 1) is refreshed by
    a reader thread (``SnapshotCache.missed``: the count-checked ``refresh_snapshot``), which takes a
    forget's removed records out by the ids of the graph's removal records: no whole load, and the snapshot
    then holds what a whole load reads."""
    monkeypatch.setattr("engram_api.reader.snapshots.CATCH_UP_VERSIONS", 1)
    user = new_user()
    _chatter(memory, user)
    reader = _host(memory, tmp_path / "reader")  # not listening: only its recalls catch up
    _warm(reader, user)
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(20))
    gone = memory.graph.forget_message
    memory.writes.run(user, lambda w: (gone(user, "filler-1"), w.finish()), wait=0)
    stamp = memory.graph.user_stamp(user)
    with Reads(memory.graph, READER_THREADS) as reads:
        reader.recall(user, "after the forget")  # two writes behind: the store answers, a thread refreshes
        reader.flush()
    assert ("refresh_snapshot", user) in reads.calls and ("snapshot", user) not in reads.calls
    held, whole = reader.snapshots.peek(user), memory.graph.snapshot(user, max_records=10_000)
    assert held is not None and whole is not None and held.stamp == whole.stamp == stamp
    assert dict(held.facts) == dict(whole.facts) and dict(held.chunks) == dict(whole.chunks)
    assert not any(c.episode_id == "filler-1" for c in held.chunks.values())
    assert {e: tuple(held.entity_facts(e)) for e in whole.touching} == whole.touching
