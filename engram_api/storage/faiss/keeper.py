"""Keeps this process's copy of each user's FAISS index in step with the graph store (the only source of
vectors; ``vectorsync`` states the model: FAISS is a per-process cache caught up from the graph).

Every index carries the graph stamp (epoch, version) it reflects. Writers (through ``UserWrite``) call
``advance`` after a graph write with the stamps before and after and the batch's upserts and removals:
when this process's copy is exactly at the stamp before, the batch is one delta (appended to the local
delta log, ``VectorStore.append``); when the copy is behind (another host wrote meanwhile), it is caught up
from the graph by version (``GraphStore.vector_changes``: only what changed since its version), which
already holds this write. Readers call ``current`` with the stamp they expect; a copy behind it is caught
up the same way before answering, never used stale (a reader that also holds the user's snapshot reads
both changes in one round trip, ``GraphStore.user_changes``, and hands the vectors' part to ``apply``). A
full read of the user's vectors (``rebuild``) happens only when a catch-up is impossible: no copy at all,
another lifetime of the user, a copy older than the user's catch-up horizon, or a graph behind the copy.
A copy is labelled with the stamp its read returned, never with the one asked for: a read that lags the
published stamp (a Neo4j follower the write has not reached) moves it only that far, and ``current``
reads again a bounded number of times, then hands the copy out below the stamp asked (the reader answers
at the copy's stamp and caches nothing under the newer one).

Counters (read by tests, benchmarks and health): ``rebuilds`` counts full reads, ``catchups`` reads of
only what changed, ``feed_catchups`` those of them a writer took from the change feed in Redis instead of
the graph (the ``feed`` of ``current`` and ``advance``: a host whose copy is behind because the other host
wrote last catches up from what that writer published, removals included). A process that writes a user's index with no copy of it (a forget from a reader that
never recalled the user, a maintenance job) does not load one: the next reader catches up or loads.

Local files: with ``persist`` (the default) a copy is also kept in this process's data directory as a
warm start (a rebuild saves it, deltas and catch-ups append to its log); any process may drop those files
at any time (the erasure sweep does), no other process reads them unless it shares the directory. With
``persist=False`` nothing is written (maintenance runs over every user keep only what they touch, in
memory): a whole read is held as the copy's base (``UserIndex.whole``, exact) and a catch-up clones only
the changes since (``VectorStore.moved``, folding them into a new base now and then), never every vector.

Thread safety: an index handed out (cached, or returned to a reader) is never mutated; ``advance`` and a
catch-up change a copy and swap it into the cache, so concurrent searches always see one whole version.

Freshness of a cached copy against its local file: current while the base file's token and its log's
size are unchanged (one header read and one stat); when only the log grew (another process sharing the
directory wrote), just the new records are read and applied to a copy.

Memory: the cache holds at most ``cache_size`` users' indexes, least recently used dropped first. A
dropped index is only a cache miss: the next call loads its local file or the graph.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from engram_api.storage.faiss.files import Kind, UserIndex, VectorStore
from engram_api.storage.faiss.sync import VectorChanges
from engram_api.storage.graph.contract import GraphStore
from engram_api.versions import ABSENT, Stamp

__all__ = ["LAG_PAUSE_S", "LAG_READS", "Feed", "IndexKeeper"]

# Catch-up reads ``current`` makes before it settles for a copy below the stamp asked (a Neo4j follower
# behind the leader catches up in milliseconds), and the pause between two of them.
LAG_READS = 3
LAG_PAUSE_S = 0.01

# What changed since a version, from somewhere cheaper than the graph (None: it cannot say).
Feed = Callable[[int], VectorChanges | None]


class IndexKeeper:
    def __init__(
        self,
        *,
        graph: GraphStore,
        vectors: VectorStore,
        cache: bool = True,
        cache_size: int = 256,
        persist: bool = True,
        on_load: Callable[[str], None] | None = None,
    ) -> None:
        self.graph = graph
        self.vectors = vectors
        self.persist = persist
        self._cache_enabled = cache
        self._cache_size = cache_size
        self._cache: OrderedDict[str, UserIndex] = OrderedDict()
        self._lock = threading.Lock()
        self.rebuilds = 0  # full reads of a user's vectors from the graph
        self.catchups = 0  # reads of only what changed since a copy's version
        self.feed_catchups = 0  # of those, the ones the change feed answered (``feed``)
        self.catchup_vector_bytes = 0  # float32 bytes those catch-ups brought in (benchmarks report it)
        self._on_load = on_load  # told "rebuild" or "catchup" at each (a worker's Prometheus counter)

    def _remember(self, user_id: str, index: UserIndex) -> UserIndex:
        if self._cache_enabled:
            with self._lock:
                self._cache[user_id] = index
                self._cache.move_to_end(user_id)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return index

    def _loaded_by(self, how: str) -> None:
        if self._on_load is not None:
            self._on_load(how)

    def forget(self, user_id: str, *, up_to_epoch: int | None = None) -> None:
        """Drop the cached copy (with ``up_to_epoch``: only a copy of that lifetime or an earlier one)."""
        with self._lock:
            cached = self._cache.get(user_id)
            if cached is not None and (up_to_epoch is None or cached.epoch <= up_to_epoch):
                del self._cache[user_id]

    def cached_users(self) -> list[str]:
        """The users whose copy this process holds in memory (the erasure sweep checks them)."""
        with self._lock:
            return list(self._cache)

    def _read_whole(self, user_id: str) -> UserIndex:
        """The user's vectors read from the graph whole (bounded: ``stamped_vectors``), kept nowhere."""
        items, stamp = self.graph.stamped_vectors(user_id)
        # Held as the base (shared by every later copy), not as an overlay a catch-up would clone whole.
        index = UserIndex.whole(
            self.vectors.dim,
            ((item.node_id, item.kind, item.embedding) for item in items),
            {item.node_id: item.states for item in items if item.states is not None},
        )
        index.stamp = stamp
        if stamp != ABSENT:
            self.rebuilds += 1
            self._loaded_by("rebuild")
        return index

    def rebuild(self, user_id: str) -> UserIndex:
        """Read the user's vectors from the graph whole, keep the index as this process's copy (and its
        local file with ``persist``); returns it."""
        index = self._read_whole(user_id)
        if index.stamp == ABSENT:
            # A user the graph does not hold: answer empty, but never let read traffic create files.
            self.forget(user_id)
            return index
        if self.persist:
            with self.vectors.lock(user_id):
                index = self.vectors.save(user_id, index)
        return self._remember(user_id, index)

    def peek(self, user_id: str, expected: Stamp) -> UserIndex:
        """``current`` when this process holds a copy; else the user's vectors read from the graph whole and
        kept nowhere: a job that visits every user (the hierarchy) does not fill this host's memory and
        disk with copies of users it does not serve."""
        if self._loaded(user_id) is None:
            return self._read_whole(user_id)
        return self.current(user_id, expected)

    def _loaded(self, user_id: str) -> UserIndex | None:
        """This process's copy: the cached one, moved on by its local log when that grew; the local file
        when nothing is cached; None without either."""
        with self._lock:
            cached = self._cache.get(user_id)
        probe = self.vectors.probe(user_id) if self.persist else None
        if probe is None:
            return cached  # no local file (never written, or swept): the memory copy is still a copy
        token, log_size = probe
        if cached is not None and cached.token == token:
            if cached.log_end in (0, log_size):
                return cached
            if log_size > cached.log_end:
                return self.vectors.catch_up(user_id, cached)
        loaded = self.vectors.load(user_id)
        if loaded is not None and cached is not None and cached.stamp > loaded.stamp:
            return cached  # the file fell behind this process's copy (another process replaced it)
        return loaded or cached

    def _moved(
        self,
        user_id: str,
        index: UserIndex,
        to_stamp: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]],
        removals: Iterable[str],
        *,
        durable: bool = True,
        states: Mapping[str, bytes] | None = None,
    ) -> UserIndex:
        """``index`` moved to ``to_stamp`` by one delta (``states``: the upserted rows' token states):
        appended to the local log with ``persist`` (fsynced unless ``durable`` is False: a catch-up the
        graph can give again)."""
        if self.persist:
            with self.vectors.lock(user_id):
                index = self.vectors.append(
                    user_id,
                    index,
                    to_stamp=to_stamp,
                    upserts=upserts,
                    removals=removals,
                    durable=durable,
                    states=states,
                )
        else:
            index = self.vectors.moved(index, to_stamp=to_stamp, upserts=upserts, removals=removals, states=states)
        return self._remember(user_id, index)

    def held(self, user_id: str) -> UserIndex | None:
        """This process's copy when it holds one in memory (moved on by its local log as ``current``
        does); None otherwise, and nothing loaded: a reader's catch-up on a signal serves only the users
        it holds (``engram_api.reader.catchup``)."""
        with self._lock:
            if user_id not in self._cache:
                return None
        return self._loaded(user_id)

    def held_stamp(self, user_id: str) -> Stamp | None:
        """The stamp of the copy this process holds in memory, as it is: no local file probed (``held``
        moves the copy on by its log); None without one. A recall asks it every time, and a probe (an
        open, a read and a stat) was ~2 % of its wall time."""
        with self._lock:
            cached = self._cache.get(user_id)
        return None if cached is None else cached.stamp

    def _caught_up(self, user_id: str, index: UserIndex) -> UserIndex | None:
        """``index`` brought to the graph's stamp by what changed since its version; None when that is
        impossible (``VectorChanges.usable_from``)."""
        return self.apply(user_id, index, self.graph.vector_changes(user_id, index.version))

    def apply(self, user_id: str, index: UserIndex, changes: VectorChanges) -> UserIndex | None:
        """``index`` brought to ``changes.stamp`` by ``changes`` (read from any version up to the index's:
        a removal or an upsert applied again is harmless) and kept as this process's copy; None when that
        is impossible (``VectorChanges.usable_from``)."""
        if not changes.usable_from(index.stamp):
            return None
        if changes.stamp == index.stamp:
            return self._remember(user_id, index)
        self.catchups += 1
        self.catchup_vector_bytes += changes.vector_bytes
        self._loaded_by("catchup")
        return self._moved(
            user_id, index, changes.stamp, changes.upserts, changes.removed, durable=False, states=changes.states
        )

    def advance(
        self,
        user_id: str,
        *,
        from_stamp: Stamp,
        to_stamp: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
        feed: Feed | None = None,
        states: Mapping[str, bytes] | None = None,
    ) -> UserIndex | None:
        """Move this process's copy from ``from_stamp`` to ``to_stamp``: one delta for the whole batch of
        ``upserts`` and ``removals`` when the copy is at ``from_stamp`` (or the user is new, or ``feed``
        brings a copy behind there: the writes another host published before this one), a catch-up from
        the graph when it is behind, a rebuild when neither can. None when this process holds no copy of an
        existing user: it loads none just to write it (the next reader catches up)."""
        if to_stamp == ABSENT:
            self.forget(user_id)
            self.vectors.delete(user_id)
            return self.vectors.new()
        index = self._loaded(user_id)
        if from_stamp == ABSENT and (index is None or index.epoch != to_stamp.epoch):
            index = self.vectors.new()  # the write created the user (a copy left is an earlier lifetime's)
        if index is None:
            return None
        if index.stamp == to_stamp:
            return self._remember(user_id, index)
        if index.stamp < from_stamp:  # another host wrote since: what it published brings the copy to ours
            index = self._fed(user_id, index, from_stamp, feed)
        if index.stamp == from_stamp:
            return self._moved(user_id, index, to_stamp, upserts, removals, states=states)
        if index.epoch == to_stamp.epoch and index.stamp < to_stamp:
            caught = self._caught_up(user_id, index)  # the graph already holds this write
            if caught is not None and caught.stamp >= to_stamp:
                return caught
        return self.rebuild(user_id)

    def _fed(self, user_id: str, index: UserIndex, expected: Stamp, feed: Feed | None) -> UserIndex:
        """``index`` brought to ``expected`` (or past it) by ``feed``'s changes since its version, tried once;
        ``index`` itself without a feed, or when its changes cannot bring it there (the graph is read)."""
        if feed is None or index.epoch != expected.epoch or index.version >= expected.version:
            return index
        changes = feed(index.version)
        if changes is None or changes.stamp < expected or not changes.usable_from(index.stamp):
            return index
        self.feed_catchups += 1
        return self.apply(user_id, index, changes) or index

    def current(self, user_id: str, expected: Stamp, *, feed: Feed | None = None) -> UserIndex:
        """The index of ``expected``'s lifetime at its version or newer: this process's copy, caught up from
        the graph when behind; rebuilt when there is none or it cannot be caught up. A catch-up read that
        does not reach ``expected`` (a lagging replica) moves the copy as far as it read and is read again,
        ``LAG_READS`` reads in all; then the copy is returned below ``expected``, labelled with what it holds
        (the caller answers at its stamp), never rebuilt for the lag.

        ``feed(version)``: the changes since ``version`` from a cheaper source than the graph (a writer's
        read of the change feed in Redis, ``UserWrite.index``), tried once before the graph; None, or
        changes that cannot bring the copy to ``expected``, and the graph is read as without it."""
        with self._lock:
            cached = self._cache.get(user_id)
        if cached is not None and cached.epoch == expected.epoch and cached.version >= expected.version:
            # At ``expected`` already: the local file could only move the copy on past it, and probing it
            # (an open, a read and a stat) was a measurable share of a recall's CPU.
            return self._remember(user_id, cached)
        index = self._loaded(user_id)
        if index is None or index.epoch != expected.epoch:
            return self.rebuild(user_id)
        index = self._fed(user_id, index, expected, feed)
        for attempt in range(LAG_READS + 1):
            if index.version >= expected.version:
                return self._remember(user_id, index)
            if attempt == LAG_READS:
                break
            if attempt:
                time.sleep(LAG_PAUSE_S)
            caught = self._caught_up(user_id, index)
            if caught is None:
                return self.rebuild(user_id)
            index = caught
        return index
