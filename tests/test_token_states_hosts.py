"""Token states travel with their vectors: graph (both stores), change feed, FAISS copies, files, erasure.

A chunk's packed token states (late interaction, ``storage.embedding.states``) are a property of its record
beside its embedding. Every process's FAISS copy holds them by vector id with the vector, from whichever
source brought the vector: a whole read of the graph (``stamped_vectors``), a catch-up by version
(``vector_changes``), another host's change-feed entry, its own write (``UserWrite.finish``), its local file and
delta log; a forgotten chunk's states leave every copy with its vector. Two apply hosts and a reader, each
with its own directory, over one real graph store (SQLite, then Neo4j) and one real Redis.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import redis

from engram_api.models import ChunkRecord, EpisodeRecord, WritePlan
from engram_api.storage import GraphStore
from engram_api.storage.embedding.states import pack
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.episodes import chunk_episode
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from tests.support.builders import DIM, at, new_user, random_encode
from tests.support.stores import backend as backend  # the fixtures, brought in under their names
from tests.support.stores import store as store


def _states(text: str) -> bytes:
    """Deterministic packed states for a text (a few tokens of synthetic signs)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return pack(np.random.default_rng(seed).standard_normal((3 + seed % 5, DIM)).astype(np.float32))


def _keeper(root: Path, graph: GraphStore) -> IndexKeeper:
    return IndexKeeper(graph=graph, vectors=VectorStore(root=root, dim=DIM))


def _writes(keeper: IndexKeeper, graph: GraphStore, client: redis.Redis) -> UserWrites:
    return UserWrites(graph=graph, keeper=keeper, redis_client=client, lease_ttl_s=30)


def _say(writes: UserWrites, graph: GraphStore, user: str, step: int) -> list[ChunkRecord]:
    """One message with its chunks, embedded and with states, written as apply writes it (the index read
    first: a copy behind catches up from the feed)."""
    episode = EpisodeRecord(
        id=f"m-{step}", user_id=user, content=f"I went to place {step} with Alex.", event_time=at(step)
    )
    chunks = chunk_episode(episode)
    for chunk in chunks:
        chunk.embedding = random_encode([chunk.indexed_text])[0].tolist()
        chunk.token_states = _states(chunk.indexed_text)

    def work(write: UserWrite) -> None:
        write.index()
        assert graph.apply(WritePlan(user_id=user, episode=episode, chunks=chunks)).applied
        write.finish(
            upserts=[(c.id, "episode", c.embedding or []) for c in chunks],
            states={c.id: c.token_states for c in chunks if c.token_states is not None},
        )

    writes.run(user, work, wait=10)
    return chunks


def _held(keeper: IndexKeeper, user: str, chunks: list[ChunkRecord]) -> dict[str, bytes]:
    index = keeper.held(user)
    assert index is not None
    return index.states_for(c.id for c in chunks)


def test_states_reach_every_hosts_copy_by_every_route_and_leave_with_a_forget(
    store: GraphStore, tmp_path: Path, redis_client: redis.Redis
) -> None:
    graph, user = store, new_user()
    a, b = _keeper(tmp_path / "a", graph), _keeper(tmp_path / "b", graph)
    wa, wb = _writes(a, graph, redis_client), _writes(b, graph, redis_client)
    said = _say(wa, graph, user, 0)
    said += _say(wb, graph, user, 1)  # b's first load: a whole read of the graph, then its own write
    assert b.rebuilds == 1 and _held(b, user, said) == {c.id: c.token_states for c in said}
    said += _say(wa, graph, user, 2)  # a is one write behind: b's entry in the change feed brings it up
    assert a.feed_catchups == 1 and a.rebuilds == 0
    want = {c.id: c.token_states for c in said}
    assert _held(a, user, said) == want

    # The graph holds them beside the embedding (the whole read's source).
    items, _ = graph.stamped_vectors(user)
    assert {i.node_id: i.states for i in items if i.kind == "episode"} == want

    reader = _keeper(tmp_path / "reader", graph)
    reader.current(user, graph.user_stamp(user))  # a whole read, saved to its file
    said += _say(wb, graph, user, 3)
    reader.current(user, graph.user_stamp(user))  # a catch-up by version, appended to its delta log
    assert reader.catchups == 1
    want = {c.id: c.token_states for c in said}
    assert _held(reader, user, said) == want
    restarted = _keeper(tmp_path / "reader", graph)  # the reader's next process: its file and log
    loaded = restarted.vectors.load(user)
    assert loaded is not None and loaded.states_for(want) == want
    assert loaded.compacted(flat_max=10).states_for(want) == want

    # A forget on a: the forgotten chunk's states leave every copy with its vector.
    gone = said[0]

    def forget(write: UserWrite) -> None:
        removed = graph.forget_message(user, gone.episode_id)
        write.finish(removals=[*removed.removed_fact_ids, *removed.removed_entity_ids, *removed.removed_chunk_ids])

    wa.run(user, forget, wait=10)
    want.pop(gone.id)
    for keeper in (a, b, reader):
        index = keeper.current(user, graph.user_stamp(user))
        assert gone.id not in index.node_ids() and index.states_for(c.id for c in said) == want
    items, _ = graph.stamped_vectors(user)
    assert {i.node_id: i.states for i in items if i.kind == "episode"} == want
