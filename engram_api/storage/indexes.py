"""Keeps each user's FAISS index in step with the graph store (the source of truth).

Every index carries the graph stamp (epoch, version) it reflects. Writers (through ``UserWrite``) call
``advance`` after a graph write with the stamps before and after and the batch's upserts and removals:
when the stored index is exactly at the stamp before, the batch is appended to its delta log as one
record (``VectorStore.append``; the file is not rewritten); otherwise (missing, older, corrupt, another
lifetime of the user) the index is rebuilt from the graph. Readers call ``current`` with the stamp they expect; an index
of another epoch or behind it is rebuilt before answering, never used stale.

Thread safety: an index handed out (cached, or returned to a reader) is never mutated; ``advance``
changes a copy and swaps it into the cache, so concurrent searches always see one whole version.

Freshness: a cached index is current while its base file's token and its log's size are unchanged (one
header read and one stat); when only the log grew (another process wrote), just the new records are
read and applied to a copy.

Memory: the cache holds at most ``cache_size`` users' indexes, least recently used dropped first. A
dropped index is only a cache miss: the next call loads it from its file (the file is the truth).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from engram_api.storage.base import GraphStore
from engram_api.storage.vectors import Kind, UserIndex, VectorStore
from engram_api.versions import ABSENT, Stamp

__all__ = ["IndexKeeper"]


class IndexKeeper:
    def __init__(self, *, graph: GraphStore, vectors: VectorStore, cache: bool = True, cache_size: int = 256) -> None:
        self.graph = graph
        self.vectors = vectors
        self._cache_enabled = cache
        self._cache_size = cache_size
        self._cache: OrderedDict[str, UserIndex] = OrderedDict()
        self._lock = threading.Lock()
        self.rebuilds = 0  # observable by tests and health checks

    def _remember(self, user_id: str, index: UserIndex) -> UserIndex:
        if self._cache_enabled:
            with self._lock:
                self._cache[user_id] = index
                self._cache.move_to_end(user_id)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return index

    def forget(self, user_id: str) -> None:
        with self._lock:
            self._cache.pop(user_id, None)

    def rebuild(self, user_id: str) -> UserIndex:
        """Rebuild from the graph's embeddings and save; returns the fresh index."""
        items, stamp = self.graph.stamped_vectors(user_id)
        index = self.vectors.new()
        index.upsert((item.node_id, item.kind, item.embedding) for item in items)
        index.stamp = stamp
        if stamp == ABSENT:
            # A user the graph does not hold: answer empty, but never let read traffic create files.
            self.forget(user_id)
            return index
        with self.vectors.lock(user_id):
            index = self.vectors.save(user_id, index)
        self.rebuilds += 1
        return self._remember(user_id, index)

    def _loaded(self, user_id: str) -> UserIndex | None:
        with self._lock:
            cached = self._cache.get(user_id)
        probe = self.vectors.probe(user_id)
        if probe is None:
            return None
        token, log_size = probe
        if cached is not None and cached.token == token:
            if cached.log_end in (0, log_size):
                return cached
            if log_size > cached.log_end:
                return self.vectors.catch_up(user_id, cached)
        return self.vectors.load(user_id)

    def advance(
        self,
        user_id: str,
        *,
        from_stamp: Stamp,
        to_stamp: Stamp,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
    ) -> UserIndex:
        """Move the index from ``from_stamp`` to ``to_stamp``: one delta record for the whole batch of
        ``upserts`` and ``removals`` when the stored index is at ``from_stamp``, else a rebuild."""
        if to_stamp == ABSENT:
            self.forget(user_id)
            self.vectors.delete(user_id)
            return self.vectors.new()
        index = self._loaded(user_id)
        if index is None or index.stamp != from_stamp:
            return self.rebuild(user_id)
        if index.stamp == to_stamp:
            return self._remember(user_id, index)
        with self.vectors.lock(user_id):
            index = self.vectors.append(user_id, index, to_stamp=to_stamp, upserts=upserts, removals=removals)
        return self._remember(user_id, index)

    def current(self, user_id: str, expected: Stamp) -> UserIndex:
        """The index of ``expected``'s lifetime at its version or newer; rebuilt when behind or missing."""
        index = self._loaded(user_id)
        if index is not None and index.epoch == expected.epoch and index.version >= expected.version:
            return self._remember(user_id, index)
        return self.rebuild(user_id)
