"""The re-embedding pass (``engram_workers.maintenance.reembed``) on both stores, with a real Redis and MiniLM:
a conversation stored under ``ENGRAM_CHUNK_EMBED_CONTEXT=none``, then the setting changed to ``other_turn``.
After the pass every chunk's stored vector is what apply writes today (the same messages ingested afresh
under ``other_turn``, as another user) and recall answers as for the fresh ingest; a pass that dies after a
batch leaves the rest to the next run, which does only the rest; a second run does nothing; another host's
reader catches up by version, with no full rebuild; a chunk apply wrote under the policy keeps its vector.

The conversation is ingested turn by turn, each message carrying the two turns before it as ``earlier`` (as
``ops/bench/quality_locomo.py`` does): the store's message before each then stands in for them exactly.
"""

# ruff: noqa: F811 - ``embedder`` is the suite's fixture, imported below

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from engram_api import keys
from engram_api.errors import InvalidInputError
from engram_api.models import ChatMessage, Envelope, Extraction
from engram_api.settings import Settings
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.graph.episodes import EmbedContext
from engram_workers.maintenance import ReembedReport, reembed_users, run_reembed
from engram_workers.maintenance.fanout import Chunk, drive, release
from tests.support.factories import at, new_user, open_store
from tests.support.memory import apply_message

from .test_hybrid_recall import NO_KEYWORD, Memory, embedder  # noqa: F401 - ``embedder``: the fixture
from .test_reader_signals import _host, _warm

TURNS = [
    ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
    ("Melanie", "That sounds great! Where did you move to after the city?"),
    ("Caroline", "Austin."),
    ("Melanie", "What do you do to relax on weekends?"),
    ("Caroline", "Painting, mostly sunsets over the lake."),
    ("Melanie", "Which instrument did your brother pick up?"),
    ("Caroline", "The violin, he practises every evening."),
    ("Melanie", "How old is your dog now?"),
    ("Caroline", "Seven."),
]
QUESTIONS = ["where did Caroline move?", "what instrument does her brother play?", "how old is the dog?"]
SETTINGS = Settings(chunk_embed_context="other_turn", maintenance_batch=3)


def _say(memory: Memory, user: str, context: EmbedContext, turns: list[tuple[str, str]], start: int = 0) -> None:
    """Each turn a message of ``user`` (its speaker in the metadata), the two turns before it as ``earlier``,
    applied as the apply stage does under ``context``."""
    for i, (who, text) in enumerate(turns, start=start):
        earlier = [ChatMessage(role="user", name=w, content=t) for w, t in TURNS[max(0, i - 2) : i]]
        envelope = Envelope(
            user_id=user, message_id=f"turn-{i}", messages=[ChatMessage(content=text)], timestamp=at(i),
            metadata={"speaker": who}, earlier=earlier,
        )  # fmt: skip
        apply_message(memory.writes, memory.graph, memory.embedder, (), envelope, Extraction(), embed_context=context)


def _vectors(graph: GraphStore, user: str) -> dict[tuple[str, int], np.ndarray]:
    """The user's stored chunk vectors by (message, seq): the same key for two users' same messages."""
    place = {
        c.id: (c.episode_id, c.seq) for c in graph.get_chunks(user, [], episode_ids=[f"turn-{i}" for i in range(20)])
    }
    items, _ = graph.stamped_vectors(user)
    return {place[i.node_id]: np.asarray(i.embedding, dtype=np.float32) for i in items if i.kind == "episode"}


def _same_vectors(graph: GraphStore, user: str, oracle: str) -> bool:
    got, want = _vectors(graph, user), _vectors(graph, oracle)
    return got.keys() == want.keys() and all(np.allclose(got[k], want[k], atol=1e-5) for k in want)


def _states(graph: GraphStore, user: str) -> dict[tuple[str, int], bytes | None]:
    """The user's stored chunk token states by (message, seq), as ``_vectors``."""
    place = {
        c.id: (c.episode_id, c.seq) for c in graph.get_chunks(user, [], episode_ids=[f"turn-{i}" for i in range(20)])
    }
    items, _ = graph.stamped_vectors(user)
    return {place[i.node_id]: i.states for i in items if i.kind == "episode"}


def _answers(reader: Any, graph: GraphStore, user: str) -> list[list[tuple[str, int, float]]]:
    """Each question's chunk hits as (message, seq, score), in recall's order. Without the keyword channel:
    the two users' keyword hits of equal BM25 are ordered by chunk id, which differs by user; the vectors
    are what the pass changes."""
    out = []
    for question in QUESTIONS:
        items = reader.recall(user, question, k=10, recipe=NO_KEYWORD).items
        chunks = {c.id: c for c in graph.get_chunks(user, [i.id for i in items], episode_ids=[])}
        out.append([(chunks[i.id].episode_id, chunks[i.id].seq, round(i.score, 4)) for i in items if i.id in chunks])
    return out


class Encodings:
    """The real embedder, counting the texts it encodes; ``fail_after`` calls it raises (a crash)."""

    def __init__(self, real: Embedder, fail_after: int | None = None) -> None:
        self.real, self.fail_after, self.calls, self.texts = real, fail_after, 0, 0
        self.dim = real.dim

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("worker killed mid-pass")
        self.calls += 1
        self.texts += len(texts)
        return self.real.encode(texts)

    def encode_states(self, texts: list[str], ends: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """``encode`` with the token states from the same pass (the re-embedding pass's call)."""
        self.encode([])  # counted (and failing) as one call, encoding nothing
        self.texts += len(texts)
        return self.real.encode_states(texts, ends)


def _run(memory: Memory, user: str, encoder: Any) -> ReembedReport:
    return run_reembed(
        graph=memory.graph, embedder=encoder, settings=SETTINGS,
        guard=lambda u: memory.writes.open(u, wait=30.0), user_ids=[user],
    )  # fmt: skip


@pytest.fixture
def memory(graph_store: GraphStore, tmp_path: Path, embedder: Embedder, redis_client: redis.Redis) -> Iterator[Memory]:
    memory = Memory(graph_store, tmp_path / "writer", embedder, redis_client)
    yield memory
    memory.reader.flush()


def test_after_the_pass_every_vector_and_recall_are_a_fresh_ingests(memory: Memory, tmp_path: Path) -> None:
    old, fresh = new_user(), new_user()
    _say(memory, old, "none", TURNS)
    _say(memory, fresh, "other_turn", TURNS)
    assert not _same_vectors(memory.graph, old, fresh)  # the answers' vectors lack their questions
    reader = _host(memory, tmp_path / "reader")  # another host, holding the old user's index and snapshot
    _warm(reader, old)
    rebuilds = reader.keeper.rebuilds

    report = _run(memory, old, Encodings(memory.embedder))

    assert (report.users, report.chunks, report.batches, report.failed) == (1, len(TURNS), 3, [])
    assert _same_vectors(memory.graph, old, fresh)
    # The token states travel with the vectors: the pass writes apply's, from the same pass.
    states = _states(memory.graph, old)
    assert all(states.values()) and states == _states(memory.graph, fresh)
    oracle = _host(memory, tmp_path / "oracle")
    assert _answers(reader, memory.graph, old) == _answers(oracle, memory.graph, fresh)
    reader.flush()
    assert reader.keeper.rebuilds == rebuilds and reader.keeper.catchups >= 1  # caught up by version
    index = reader.keeper.held(old)
    stamp = memory.graph.user_stamp(old)
    assert index is not None and index.stamp == stamp and stamp.version == report.per_user[0].version
    oracle.flush()


def test_a_pass_killed_after_a_batch_is_finished_by_the_next_and_a_second_run_does_nothing(memory: Memory) -> None:
    old, fresh = new_user(), new_user()
    _say(memory, old, "none", TURNS[:7])
    _say(memory, fresh, "other_turn", TURNS)

    killed = _run(memory, old, Encodings(memory.embedder, fail_after=1))
    assert killed.chunks == 3 and [f.user_id for f in killed.failed] == [old]
    # Meanwhile apply writes the last turns under the new policy: the rerun leaves them as apply made them.
    _say(memory, old, "other_turn", TURNS[7:], start=7)
    rerun = Encodings(memory.embedder)
    finished = _run(memory, old, rerun)
    assert (finished.chunks, rerun.texts, finished.failed) == (4, 4, [])  # only what the killed run left
    assert _same_vectors(memory.graph, old, fresh)

    version = memory.graph.user_stamp(old)
    again = Encodings(memory.embedder)
    second = _run(memory, old, again)
    assert (second.chunks, second.batches, again.calls) == (0, 0, 0)
    assert memory.graph.user_stamp(old) == version


def test_a_chunk_written_under_the_policy_keeps_its_vector(graph_store: GraphStore, memory: Memory) -> None:
    user = new_user()
    _say(memory, user, "other_turn", TURNS[:2])
    chunk = graph_store.get_chunks(user, [], episode_ids=["turn-1"])[0]
    before, version = _vectors(graph_store, user), graph_store.user_stamp(user)
    stale = [0.0] * memory.embedder.dim

    assert graph_store.reembed_chunks(user, "other_turn", [(chunk.id, stale)]) == []
    assert graph_store.chunks_to_reembed(user, "other_turn", after="", batch=10) == []
    assert graph_store.user_stamp(user) == version
    assert all(np.array_equal(before[k], v) for k, v in _vectors(graph_store, user).items())
    # Under another policy the same chunks are left to do, by id.
    todo = graph_store.chunks_to_reembed(user, "dated", after="", batch=10)
    assert [c.id for c in todo] == sorted(
        c.id for c in graph_store.get_chunks(user, [], episode_ids=["turn-0", "turn-1"])
    )


def test_the_store_records_the_policy_and_refuses_an_unknown_one(graph_store: GraphStore) -> None:
    before = graph_store.recorded_chunk_context()
    with pytest.raises(InvalidInputError, match="context"):
        graph_store.record_chunk_context("sideways")
    with pytest.raises(InvalidInputError, match="context"):
        graph_store.reembed_chunks(new_user(), "sideways", [("chk_x", [0.0])])
    assert graph_store.recorded_chunk_context() == before
    graph_store.record_chunk_context("dated")
    assert graph_store.recorded_chunk_context() == "dated"
    graph_store.record_chunk_context(before or "other_turn")


def test_the_driver_fans_out_the_users_left_then_records_the_policy(
    tmp_path: Path,
    embedder: Embedder,
    redis_client: redis.Redis,
) -> None:
    """On a store of its own (the shared Neo4j holds other tests' chunks of every policy): Beat's driver,
    its tasks and the next driver run, which records the policy; then a changed setting starts it again."""
    store = open_store("sqlite", str(tmp_path / "own.sqlite3"))
    store.ensure_schema()
    memory = Memory(store, tmp_path / "writer", embedder, redis_client)
    users = sorted([new_user(), new_user()])
    for user in users:
        _say(memory, user, "none", TURNS[:3])
    redis_client.delete(keys.maintenance_todo("reembed"))
    guard = lambda u: memory.writes.open(u, wait=30.0)  # noqa: E731

    def drive_once(settings: Settings) -> list[list[str]]:
        sent: list[Chunk] = []
        due = reembed_users(store, settings)
        drive(job="reembed", client=redis_client, graph=store, send=sent.append, claim_s=60, due=due)
        for chunk in sent:
            report = run_reembed(
                graph=store, embedder=embedder, settings=settings, guard=guard, user_ids=chunk.user_ids
            )
            release(redis_client, chunk, report.failed)
        return [chunk.user_ids for chunk in sent]

    assert drive_once(SETTINGS) == [users] and store.recorded_chunk_context() is None
    assert drive_once(SETTINGS) == [] and store.recorded_chunk_context() == "other_turn"  # nothing left: recorded
    versions = [store.user_stamp(u) for u in users]
    assert drive_once(SETTINGS) == [] and [store.user_stamp(u) for u in users] == versions

    dated = Settings(chunk_embed_context="dated", maintenance_batch=3)
    assert drive_once(dated) == [users]
    austin = next(c for c in store.get_chunks(users[0], [], episode_ids=["turn-2"]))
    want = embedder.encode([f"[{at(2).date().isoformat()}] Caroline: Austin."])[0]
    assert np.allclose(_vectors(store, users[0])[("turn-2", 0)], want, atol=1e-5) and austin.text == "Austin."
    assert drive_once(dated) == [] and store.recorded_chunk_context() == "dated"
    memory.reader.flush()
    store.close()
