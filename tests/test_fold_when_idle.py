"""A held snapshot's fold after a removal waits for this process's recalls to pause
(``ReaderThreads.when_idle``): no fold starts while a recall is in flight, unless it has waited its deadline
(``ENGRAM_SNAPSHOT_FOLD_DEADLINE_S``); an idle reader folds at once, and ``flush`` starts a waiting fold at once
and waits for it; a refresh off the path that applied a removal hands its fold over the same way. No wall clock:
the deadline's timer is one the test fires itself, and "at once" is an event set with no flush.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from engram_api.errors import ConfigError
from engram_api.reader.background import ReaderThreads
from engram_api.reader.facts import SnapshotCache
from engram_api.reader.recall import RecallReader
from engram_api.settings import load_settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.snapshot.removal import without
from engram_api.versions import Stamp
from tests.test_snapshot_overlay import USER, _world


class _Armed:
    """One deadline a ``_Deadlines`` timer armed: fired by the test, never by time."""

    def __init__(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.delay_s, self.fn, self.cancelled = delay_s, fn, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.fn()


class _Deadlines:
    """``ReaderThreads``' timer: keeps what it arms."""

    def __init__(self) -> None:
        self.armed: list[_Armed] = []

    def __call__(self, delay_s: float, fn: Callable[[], None]) -> _Armed:
        self.armed.append(_Armed(delay_s, fn))
        return self.armed[-1]


@pytest.fixture
def deadlines() -> _Deadlines:
    return _Deadlines()


@pytest.fixture
def threads(deadlines: _Deadlines) -> Iterator[ReaderThreads]:
    held = ReaderThreads(threads=2, timer=deadlines)
    yield held
    held.close()


def _removed() -> tuple[SnapshotCache, UserSnapshot]:
    """A cache holding a snapshot that hides a removed fact (due for its fold at once)."""
    _, facts, chunks = _world(random.Random(41), 60)
    held = without(UserSnapshot.of(USER, Stamp(1, 1), facts, chunks), [facts[0].id])
    assert held.fold_due and not held.merge_due
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    cache._keep(held, answering=False)
    return cache, held


def test_a_fold_handed_over_during_a_recall_starts_when_the_last_recall_of_the_process_ends(
    threads: ReaderThreads, deadlines: _Deadlines
) -> None:
    cache, held = _removed()
    other = ReaderThreads(threads=1)  # another reader of the process: its recalls count too (one GIL)
    with other.recalling():
        with threads.recalling():
            cache.fold_soon(USER, threads.when_idle)  # as the recall's catch-up hands it over
            cache.fold_soon(USER, threads.when_idle)  # one of a user in flight: no second
            assert threads.waiting() == 1 and cache.peek(USER) is held
        assert threads.waiting() == 1 and cache.peek(USER) is held  # the other reader's recall is in flight
        assert [a.delay_s for a in deadlines.armed] == [threads.deadline_s]
    assert threads.waiting() == 0 and deadlines.armed[0].cancelled  # started: its deadline is off
    threads.flush()
    folded = cache.peek(USER)
    assert folded is not None and folded is not held and not folded.fold_due and not folded.keywords.holes
    other.close()


def test_a_fold_waiting_for_recalls_that_never_pause_starts_at_its_deadline(
    threads: ReaderThreads, deadlines: _Deadlines
) -> None:
    cache, held = _removed()
    with threads.recalling():
        cache.fold_soon(USER, threads.when_idle)
        assert threads.waiting() == 1 and cache.peek(USER) is held
        deadlines.armed[0].fire()  # the deadline passes with the recall still in flight
        assert threads.waiting() == 0  # started by the deadline, not by a flush
        threads.flush()  # waits for it (nothing left waiting to start)
        folded = cache.peek(USER)
        assert folded is not None and not folded.fold_due and not folded.keywords.holes
    deadlines.armed[0].fire()  # a deadline after its start starts nothing again
    assert threads.waiting() == 0


def test_an_idle_reader_folds_at_once_and_flush_starts_a_waiting_fold(
    threads: ReaderThreads, deadlines: _Deadlines
) -> None:
    ran = threading.Event()
    threads.when_idle(ran.set)  # no recall in flight: started now, no deadline armed
    assert ran.wait(30) and deadlines.armed == [] and threads.waiting() == 0
    cache, held = _removed()
    cache.fold_soon(USER, threads.when_idle)
    threads.flush()
    assert cache.peek(USER) is not held and not cache.peek(USER).fold_due  # type: ignore[union-attr]
    again, _ = _removed()
    with threads.recalling():
        again.fold_soon(USER, threads.when_idle)
        assert threads.waiting() == 1
        threads.flush()  # ``Reader.flush``'s wait: the waiting fold started at once, and done
        assert threads.waiting() == 0 and not again.peek(USER).fold_due  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_fold_deadline_stops_the_process_naming_its_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_SNAPSHOT_FOLD_DEADLINE_S", value)
    with pytest.raises(ConfigError, match="ENGRAM_SNAPSHOT_FOLD_DEADLINE_S"):
        load_settings()


def test_the_fold_deadline_setting_is_the_one_a_readers_waiting_fold_is_armed_with(
    tmp_path: Path, deadlines: _Deadlines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGRAM_SNAPSHOT_FOLD_DEADLINE_S", "0.25")
    graph = SqliteGraphStore(path=tmp_path / "graph.db")
    reader = RecallReader(
        settings=load_settings(),
        graph=graph,
        keeper=IndexKeeper(graph=graph, vectors=VectorStore(root=tmp_path, dim=8)),
        embedder=Embedder(model="all-MiniLM-L6-v2"),  # never loaded: no recall runs
        redis_client=None,
    )
    reader._threads._timer = deadlines  # the reader's own threads, with a timer the test holds
    cache, held = _removed()
    try:
        with reader._threads.recalling():
            cache.fold_soon(USER, reader._threads.when_idle)
            assert [a.delay_s for a in deadlines.armed] == [0.25] and cache.peek(USER) is held
    finally:
        reader._threads.close()
        graph.close()
    assert not cache.peek(USER).fold_due  # type: ignore[union-attr]


class _Refreshing:
    """The store's count-checked refresh (``GraphStore.refresh_snapshot``) of a held snapshot, answered with
    ``fresh``."""

    def __init__(self, fresh: UserSnapshot) -> None:
        self.fresh = fresh

    def refresh_snapshot(self, held: UserSnapshot, *, max_records: int) -> UserSnapshot:
        return self.fresh


def _inline(fn: Callable[..., object], *args: Any) -> None:
    """``missed``'s ``submit``, run on the caller's thread: the refresh done when ``missed`` returns."""
    fn(*args)


def test_an_off_path_refresh_that_applied_a_removal_holds_it_hidden_and_hands_its_fold_over(
    threads: ReaderThreads, deadlines: _Deadlines
) -> None:
    """A snapshot too far behind for the recall is refreshed while that recall reads the store: the refresh
    holds the snapshot that hides the removed fact (it answers the next recalls) and its fold waits for the
    recalls to pause, as a catch-up's does, instead of running beside the recall."""
    _, facts, chunks = _world(random.Random(43), 60)
    base = UserSnapshot.of(USER, Stamp(1, 1), facts, chunks)
    fresh = base.refreshed(Stamp(1, 2), 2, [], [], max_records=1000, gone=[facts[0].id])
    assert fresh is not None and fresh.fold_due and facts[0].id not in fresh.facts
    cache = SnapshotCache(max_records=1000, budget_records=10_000)
    cache._keep(base, answering=True)  # it answered a recall: the next miss refreshes at once
    graph = cast(GraphStore, _Refreshing(fresh))
    with threads.recalling():  # the recall that missed, still in flight
        cache.missed(graph, USER, Stamp(1, 2), base.size, _inline, threads.when_idle)
        assert cache.peek(USER) is fresh and threads.waiting() == 1
        assert [a.delay_s for a in deadlines.armed] == [threads.deadline_s]
    assert threads.waiting() == 0 and deadlines.armed[0].cancelled  # the recall ended: started
    threads.flush()
    folded = cache.peek(USER)
    assert folded is not None and folded is not fresh and folded.stamp == Stamp(1, 2)
    assert not folded.fold_due and not folded.keywords.holes and facts[0].id not in dict(folded.facts)
