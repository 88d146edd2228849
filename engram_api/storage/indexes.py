"""Keeps each user's FAISS index in step with the graph store (the source of truth).

Writers (the apply stage, forget, maintenance) call ``advance`` after a graph write with the versions
before and after: when the file is exactly at the version before, the change is applied as a delta;
otherwise (missing, older, corrupt) the index is rebuilt from the graph. Readers call ``current`` with the
version they expect; an index behind it is rebuilt before answering, never used stale.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from engram_api.storage.base import GraphStore
from engram_api.storage.vectors import Kind, UserIndex, VectorStore

__all__ = ["IndexKeeper"]


class IndexKeeper:
    def __init__(self, *, graph: GraphStore, vectors: VectorStore, cache: bool = True) -> None:
        self.graph = graph
        self.vectors = vectors
        self._cache_enabled = cache
        self._cache: dict[str, UserIndex] = {}
        self._lock = threading.Lock()
        self.rebuilds = 0  # observable by tests and health checks

    def _remember(self, user_id: str, index: UserIndex) -> UserIndex:
        if self._cache_enabled:
            with self._lock:
                self._cache[user_id] = index
        return index

    def forget(self, user_id: str) -> None:
        with self._lock:
            self._cache.pop(user_id, None)

    def rebuild(self, user_id: str) -> UserIndex:
        """Rebuild from the graph's embeddings and save; returns the fresh index."""
        items, version = self.graph.vectors(user_id)
        index = self.vectors.new()
        index.upsert((item.node_id, item.kind, item.embedding) for item in items)
        index.version = version
        if version == 0 and not items:
            # A user the graph has never seen: answer empty, but do not let read traffic create files.
            return index
        with self.vectors.lock(user_id):
            self.vectors.save(user_id, index)
        self.rebuilds += 1
        return self._remember(user_id, index)

    def _loaded(self, user_id: str) -> UserIndex | None:
        with self._lock:
            cached = self._cache.get(user_id)
        disk_version = self.vectors.file_version(user_id)
        if cached is not None and disk_version == cached.version:
            return cached
        return self.vectors.load(user_id)

    def advance(
        self,
        user_id: str,
        *,
        from_version: int,
        to_version: int,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
    ) -> UserIndex:
        """Move the index from ``from_version`` to ``to_version`` (delta if possible, else rebuild)."""
        index = self._loaded(user_id)
        if index is None or index.version != from_version:
            return self.rebuild(user_id)
        if index.version >= to_version:
            return self._remember(user_id, index)
        index.remove(removals)
        index.upsert(upserts)
        index.version = to_version
        with self.vectors.lock(user_id):
            self.vectors.save(user_id, index)
        return self._remember(user_id, index)

    def current(self, user_id: str, expected_version: int) -> UserIndex:
        """The index at ``expected_version`` or newer; rebuilt from the graph when behind or missing."""
        index = self._loaded(user_id)
        if index is not None and index.version >= expected_version:
            return self._remember(user_id, index)
        return self.rebuild(user_id)
