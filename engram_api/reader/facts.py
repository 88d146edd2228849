"""Fact and chunk records for one recall: per-user in-process caches keyed by the user's stamp, and the
graph step.

Invariants:
- a cached record (a fact, or an episode chunk) is only ever served at the stamp (epoch, version) it was
  cached under: every write that can change a fact moves the user's stamp (``GraphStore`` contract), so a
  warm reader never re-reads an unchanged record and never serves a changed one (a chunk is never updated;
  a forget moves the stamp). A record read at a newer graph state than the stamp (a write committed, its
  stamp not yet published) is what an uncached read would have returned too;
- an older stamp never replaces a newer one's entries (a slow reader cannot roll the cache back); a user's
  entries of a stamp ``outdated`` by one the reader learns (a recall's, a writer's signal: ``drop_outdated``)
  or asks for (older, or any once the user is absent) are dropped then: another host's forget leaves no
  text of it here past that;
- bounded: at most ``users`` users and ``per_user`` records each, least recently used dropped first;
- the graph step (hydrate the vector and keyword hits, expand from the seeds) is ONE store round trip
  (``GraphStore.graph_step``); records the cache holds are named in ``known`` and not sent back, and the
  chunks it does not hold come in the same round trip, with the facts extracted from them;
- given the user's held snapshot (``reader.snapshots``: its whole graph at the stamp), the step, every
  record read and the neighbouring turns are answered from it with no store call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from engram_api.models import ChunkRecord, FactRecord
from engram_api.reader.snapshots import CATCH_UP_VERSIONS, SnapshotCache
from engram_api.storage.graph.contract import GraphStep, GraphStepQuery, GraphStore
from engram_api.storage.snapshot.graph import HeldStep, UserSnapshot
from engram_api.storage.snapshot.rows import AnyChunk, AnyFact, conversation_order
from engram_api.versions import Stamp, outdated

__all__ = [
    "CATCH_UP_VERSIONS",
    "ChunkCache",
    "EpisodeChunkIds",
    "FactCache",
    "RecordCache",
    "SnapshotCache",
    "UserChunks",
    "UserFacts",
]


@dataclass(frozen=True, slots=True)
class EpisodeChunkIds:
    """Which chunks one episode has (none when it has none at the stamp): a message's chunks are written
    with it, and only a forget, which moves the stamp, removes them."""

    id: str  # the episode's
    chunk_ids: tuple[str, ...]


R = TypeVar("R", FactRecord, ChunkRecord, EpisodeChunkIds)


class RecordCache(Generic[R]):
    """Per-user records, each user's tagged with the stamp they were read at. Thread-safe."""

    def __init__(self, users: int = 256, per_user: int = 2048) -> None:
        self.users = users
        self.per_user = per_user
        self._data: OrderedDict[str, tuple[Stamp, OrderedDict[str, R]]] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, user_id: str, stamp: Stamp) -> OrderedDict[str, R] | None:
        """The user's records at ``stamp`` (call with the lock held); those of a stamp it outdates are
        dropped, a newer one's kept (a slow reader cannot roll the cache back)."""
        entry = self._data.get(user_id)
        if entry is not None and outdated(entry[0], stamp):
            del self._data[user_id]
            return None
        if entry is None or entry[0] != stamp:
            return None
        self._data.move_to_end(user_id)
        return entry[1]

    def get(self, user_id: str, stamp: Stamp, ids: Iterable[str]) -> dict[str, R]:
        with self._lock:
            records = self._entry(user_id, stamp)
            if not records:
                return {}
            return {i: records[i] for i in ids if i in records}

    def held(self, user_id: str, stamp: Stamp) -> dict[str, R]:
        """A copy of every record held for the user at ``stamp``."""
        with self._lock:
            records = self._entry(user_id, stamp)
            return dict(records) if records else {}

    def put(self, user_id: str, stamp: Stamp, records_in: Iterable[R]) -> None:
        with self._lock:
            entry = self._data.get(user_id)
            if entry is not None and entry[0] > stamp:
                return
            if entry is None or entry[0] != stamp:
                entry = (stamp, OrderedDict())
                self._data[user_id] = entry
            records = entry[1]
            for record in records_in:
                records[record.id] = record
                records.move_to_end(record.id)
            while len(records) > self.per_user:
                records.popitem(last=False)
            self._data.move_to_end(user_id)
            while len(self._data) > self.users:
                self._data.popitem(last=False)

    def through(
        self, user_id: str, stamp: Stamp, ids: Sequence[str], read: Callable[[list[str]], list[R]]
    ) -> dict[str, R]:
        """The records among ``ids``: those held at ``stamp``, and one ``read`` of the rest (kept), if any."""
        ids = list(dict.fromkeys(ids))
        found = self.get(user_id, stamp, ids)
        missing = [i for i in ids if i not in found]
        if missing:
            fresh = read(missing)
            self.put(user_id, stamp, fresh)
            found.update((r.id, r) for r in fresh)
        return found

    def drop_outdated(self, user_id: str, stamp: Stamp) -> None:
        """Drop the user's records if ``stamp`` (one learned: another host's forget or ``forget_user`` moved
        it) ``outdated`` the stamp they were read at: their texts go with them; a lookup."""
        with self._lock:
            entry = self._data.get(user_id)
            if entry is not None and outdated(entry[0], stamp):
                del self._data[user_id]

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            self._data.pop(user_id, None)


class FactCache(RecordCache[FactRecord]):
    """The reader's fact records."""


class ChunkCache(RecordCache[ChunkRecord]):
    """The reader's episode chunks: a recall reads ~70, the same ones again and again for a user
    (on Neo4j each read is a round trip); fewer users than facts, chunks being larger. ``episodes``
    holds which chunks each episode has, so a fact's source episodes need no read when held."""

    def __init__(self, users: int = 128, per_user: int = 1024) -> None:
        super().__init__(users, per_user)
        self.episodes: RecordCache[EpisodeChunkIds] = RecordCache(users, per_user)
        # user -> (stamp, a held snapshot's chunk ids in conversation order, positions): sorted once a stamp.
        self._orders: dict[str, tuple[Stamp, list[str], dict[str, int]]] = {}

    def conversation(self, snapshot: UserSnapshot) -> tuple[list[str], dict[str, int]]:
        """The snapshot's chunk ids in conversation order (``conversation_order``) and their positions."""
        held = self._orders.get(snapshot.user_id)
        if held is None or held[0] != snapshot.stamp:
            rows = snapshot.chunks.rows()
            order = sorted(rows, key=lambda c: conversation_order(rows[c]))
            held = (snapshot.stamp, order, {c: i for i, c in enumerate(order)})
            with self._lock:
                if snapshot.user_id not in self._orders and len(self._orders) >= self.users:
                    self._orders.pop(next(iter(self._orders)))
                self._orders[snapshot.user_id] = held
        return held[1], held[2]

    def drop_outdated(self, user_id: str, stamp: Stamp) -> None:
        super().drop_outdated(user_id, stamp)
        self.episodes.drop_outdated(user_id, stamp)
        with self._lock:
            held = self._orders.get(user_id)
            if held is not None and outdated(held[0], stamp):
                del self._orders[user_id]

    def drop_user(self, user_id: str) -> None:
        super().drop_user(user_id)
        self.episodes.drop_user(user_id)
        with self._lock:
            self._orders.pop(user_id, None)


@dataclass(slots=True)
class UserFacts:
    """One recall's access to the user's facts at ``stamp``: cache first, the store for the rest."""

    graph: GraphStore
    cache: FactCache
    user_id: str
    stamp: Stamp
    snapshot: UserSnapshot | None = None  # the user's whole graph at ``stamp``: no store call at all

    def load(self, ids: Sequence[str]) -> Mapping[str, AnyFact]:
        """The user's facts among ``ids`` (another user's or unknown ids are absent): one store read
        for those the cache does not hold, none when it holds them all."""
        if self.snapshot is not None:
            return self.snapshot.facts.views(ids)
        return self.cache.through(self.user_id, self.stamp, ids, partial(self.graph.get_facts, self.user_id))

    def step(self, query: GraphStepQuery) -> GraphStep | HeldStep:
        """Hydrate ``query.fact_ids`` (and the chunks named) and expand, in one store round trip, none
        when the cache holds every fact asked and nothing else is. Returns the records of every asked or
        reached fact of the user, the reached facts as (id, hops), nearest first, and the chunks asked."""
        if self.snapshot is not None:
            return self.snapshot.graph_step(query)
        # A copy, not a second lookup after the query: another thread may move the cache on meanwhile.
        records = self.cache.held(self.user_id, self.stamp)
        asked = [i for i in dict.fromkeys(query.fact_ids) if i not in records]
        if not asked and not query.expanding and not query.chunk_ids and not query.chunk_facts:
            return GraphStep(facts=[records[i] for i in dict.fromkeys(query.fact_ids) if i in records])
        result = self.graph.graph_step(
            self.user_id, query.model_copy(update={"fact_ids": asked, "known": list(records)})
        )
        self.cache.put(self.user_id, self.stamp, result.facts)
        held = {f.id for f in result.facts}
        records.update((f.id, f) for f in result.facts)
        wanted = dict.fromkeys([*query.fact_ids, *held, *(fid for fid, _ in result.hops)])
        facts = [records[i] for i in wanted if i in records]
        return result.model_copy(update={"facts": facts})


@dataclass(slots=True)
class UserChunks:
    """One recall's access to the user's episode chunks at ``stamp``: cache first, the store for the rest."""

    graph: GraphStore
    cache: ChunkCache
    user_id: str
    stamp: Stamp
    snapshot: UserSnapshot | None = None  # the user's whole graph at ``stamp``: no store call at all

    def load(self, ids: Sequence[str]) -> Mapping[str, AnyChunk]:
        """The user's chunks among ``ids`` (another user's, unknown or since forgotten ids are absent):
        one store read for those the cache does not hold, none when it holds them all."""
        if self.snapshot is not None:
            return self.held(ids)
        return self.cache.through(self.user_id, self.stamp, ids, partial(self.graph.get_chunks, self.user_id))

    def held(self, ids: Iterable[str]) -> Mapping[str, AnyChunk]:
        """Those of ``ids`` the cache holds; no read."""
        if self.snapshot is not None:
            return self.snapshot.chunks.views(ids)
        return self.cache.get(self.user_id, self.stamp, ids)

    def keep(self, step: GraphStep | HeldStep) -> None:
        """The chunks a graph step read at this stamp (a held snapshot's are held already)."""
        if isinstance(step, GraphStep):
            self.cache.put(self.user_id, self.stamp, step.chunks)

    def of_episodes(self, episode_ids: Sequence[str]) -> list[AnyChunk]:
        """Every chunk of the user's episodes among ``episode_ids``, in conversation order (as
        ``GraphStore.get_chunks`` returns them): none read when the cache holds them all."""
        if self.snapshot is not None:
            return self.snapshot.episode_chunks(episode_ids)
        listed = self.cache.episodes.through(self.user_id, self.stamp, episode_ids, self._list_episodes)
        chunks = self.load([cid for e in listed.values() for cid in e.chunk_ids])
        return sorted(chunks.values(), key=lambda c: c.conversation_order)

    def neighbours(self, anchor_ids: Sequence[str], window: int) -> list[AnyChunk]:
        """``GraphStore.neighbour_chunks``'s answer; from a held snapshot with no store call."""
        if self.snapshot is None:
            return list(self.graph.neighbour_chunks(self.user_id, list(anchor_ids), window))
        order, at = self.cache.conversation(self.snapshot)
        spans = [
            (i, range(max(0, i - window), min(len(order), i + window + 1)))
            for i in map(at.get, anchor_ids)
            if i is not None
        ]
        near = dict.fromkeys(order[j] for i, span in spans for j in span if j != i)
        return list(self.snapshot.chunks.views(near).values())

    def _list_episodes(self, episode_ids: list[str]) -> list[EpisodeChunkIds]:
        fresh = self.graph.get_chunks(self.user_id, episode_ids=episode_ids)
        self.cache.put(self.user_id, self.stamp, fresh)
        by_episode: dict[str, list[str]] = {e: [] for e in episode_ids}
        for chunk in fresh:
            by_episode[chunk.episode_id].append(chunk.id)
        return [EpisodeChunkIds(id=e, chunk_ids=tuple(ids)) for e, ids in by_episode.items()]
