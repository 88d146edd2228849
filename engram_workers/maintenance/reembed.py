"""Re-embedding stored chunks made under another chunk-vector policy (``ENGRAM_CHUNK_EMBED_CONTEXT``).

A chunk's vector is made from its words and, by the policy, the turn it answers (``episodes.embedded_texts``).
Apply records with every chunk the policy its vector was made with, and the store records the policy of
all its chunk vectors once none is left under another (``GraphStore.recorded_chunk_context``). After an
upgrade from before the record, or a changed setting, this job brings every chunk to the settings' policy:

- ``reembed_users`` (the driver): nothing when the store records this policy (one read); else the users
  with a chunk of another or an unrecorded policy, and, once there is none, it records the policy.
- ``run_reembed``: per user, batches of ``ENGRAM_MAINTENANCE_BATCH`` chunks by id, each its own
  ``UserWrite`` under the user's guard (the lease and the fence: apply waits at most one batch, never the
  whole user). A batch reads its chunks, the rest of their messages and the message before each
  (``episodes.stored_texts``: the client's ``earlier`` turns are not stored, so the stored message before
  stands in for them), encodes them and writes each vector with the policy, only where the chunk is still
  another policy's (a chunk apply wrote meanwhile under this policy keeps its own); the write bumps the
  user's version marking those chunks, and ``finish`` moves this process's FAISS copy by the batch's
  upserts and publishes the stamp: every other copy (FAISS, a held snapshot) catches up by version from
  the graph (``vector_changes`` upserts a re-marked chunk's new vector over its old one), never rebuilt.

Invariants: idempotent (a chunk written under the policy is never read again, so a second run reads the
record only) and crash-safe (a batch is one transaction; the record is written last, by the driver, once
no chunk is left: a run that died midway leaves the old record and the next run does what is left).
``finish(changed=False)``: other maintenance jobs need not revisit a user for new vectors of the same
words; such a write deletes the user's change feed, so readers behind read the graph's changes instead.
The encoder is the worker's own (loaded after the fork, ``WorkerResources.embedder``).
"""

from __future__ import annotations

from functools import partial

from pydantic import BaseModel, Field

from engram_api.models import ChunkRecord
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.states import pack
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import EmbedContext, chunk_id, own_end, stored_texts
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.maintenance._common import Guard, UserFailure, guarded, isolate, target_users

__all__ = ["ReembedReport", "ReembedUser", "reembed_users", "run_reembed"]


class ReembedUser(BaseModel):
    user_id: str
    chunks: int = Field(0, description="chunks given a vector of the policy")
    batches: int = Field(0, description="transactions (each one version)")
    version: int = Field(0, description="the user's graph version after the run")


class ReembedReport(BaseModel):
    context: str = Field(description="the policy the chunk vectors are brought to (ENGRAM_CHUNK_EMBED_CONTEXT)")
    recorded: str | None = Field(description="the policy the store recorded before this run (None: none)")
    users: int = 0
    chunks: int = 0
    batches: int = 0
    finished: bool = Field(False, description="no chunk is left under another policy, and the store records it")
    per_user: list[ReembedUser] = Field(default_factory=list)
    failed: list[UserFailure] = Field(default_factory=list)


def reembed_users(graph: GraphStore, settings: Settings) -> list[str]:
    """The users the pass has work for: none when the store records the settings' policy (one read); else
    those with a chunk of another or an unrecorded policy. With none left, records the policy."""
    context = settings.chunk_embed_context
    if graph.recorded_chunk_context() == context:
        return []
    users = graph.users_to_reembed(context)
    if not users:
        graph.record_chunk_context(context)
    return users


def run_reembed(
    *,
    graph: GraphStore,
    embedder: Embedder,
    settings: Settings,
    guard: Guard,
    user_ids: list[str] | None = None,
) -> ReembedReport:
    """Bring the chunk vectors of ``user_ids`` (None: every user with work, ``reembed_users``, and then
    the store's record when none is left) to ``settings.chunk_embed_context``."""
    context = settings.chunk_embed_context
    report = ReembedReport(context=context, recorded=graph.recorded_chunk_context())
    users = reembed_users(graph, settings) if user_ids is None else target_users(graph, user_ids)
    for user_id in users:
        done = ReembedUser(user_id=user_id)
        with isolate("reembed", user_id, report.failed):
            _reembed_user(graph, embedder, settings, guard, done)
        # A user that failed midway is counted with the batches it committed (the next run does the rest).
        report.users += 1
        report.chunks += done.chunks
        report.batches += done.batches
        report.per_user.append(done)
    if user_ids is None and not report.failed:
        reembed_users(graph, settings)  # records the policy when nothing is left
    report.finished = graph.recorded_chunk_context() == context
    return report


def _reembed_user(graph: GraphStore, embedder: Embedder, settings: Settings, guard: Guard, done: ReembedUser) -> None:
    """Every chunk of the user under another policy, a batch (one ``UserWrite``) at a time, by id; ``done``
    counts each batch as it commits."""
    context, size = settings.chunk_embed_context, settings.maintenance_batch
    done.version = graph.user_stamp(done.user_id).version
    after = ""
    while True:
        step = partial(_batch, graph, embedder, context, after, size)
        chunks, written, version = guarded(guard, done.user_id, step)
        done.chunks += len(written)
        done.batches += bool(written)
        done.version = version or done.version
        if len(chunks) < size:
            return
        after = chunks[-1].id


def _batch(
    graph: GraphStore, embedder: Embedder, context: EmbedContext, after: str, size: int, write: UserWrite
) -> tuple[list[ChunkRecord], list[str], int | None]:
    """One batch: the next ``size`` chunks of another policy after ``after`` (read under the guard, so no
    apply writes the user between this read and the write), their new vectors written and published.
    Returns the chunks read, the ids written and the version after (None: nothing read)."""
    chunks = graph.chunks_to_reembed(write.user_id, context, after=after, batch=size)
    if not chunks:
        return [], [], None
    # The token states from the vector's own pass, as apply keeps them: the chunk's own words in context.
    texts = _texts(graph, write.user_id, chunks, context)
    vectors, kept_tokens = embedder.encode_states(texts, [own_end(t) for t in texts])
    pairs = [(c.id, v.tolist()) for c, v in zip(chunks, vectors, strict=True)]
    states = {c.id: pack(s) for c, s in zip(chunks, kept_tokens, strict=True)}
    written = graph.reembed_chunks(write.user_id, context, pairs, states)
    kept = set(written)
    stamp = write.finish(
        upserts=[(c, "episode", v) for c, v in pairs if c in kept],
        changed=False,
        states={c: states[c] for c in kept},
    )
    return chunks, written, stamp.version


def _texts(graph: GraphStore, user_id: str, chunks: list[ChunkRecord], context: EmbedContext) -> list[str]:
    """What apply embeds for each of ``chunks`` under ``context``, from the store (``episodes.stored_texts``):
    two reads, the chunk before each message's first (the end of the message before it) and every chunk of
    those messages and of the messages the chunks are in."""
    if context in ("none", "dated"):  # the chunk's own record is all they take
        return stored_texts(chunks, [], context)
    episodes = sorted({c.episode_id for c in chunks})
    near = graph.neighbour_chunks(user_id, [chunk_id(user_id, e, 0) for e in episodes], 1)
    read = graph.get_chunks(user_id, [], episode_ids=sorted({*episodes, *(c.episode_id for c in near)}))
    by_episode: dict[str, list[ChunkRecord]] = {}
    for chunk in sorted(read, key=lambda c: c.conversation_order):
        by_episode.setdefault(chunk.episode_id, []).append(chunk)
    text: dict[str, str] = {}
    for episode in episodes:
        own = by_episode.get(episode, [])
        if not own:
            continue
        # The message before: the chunk nearest before this message's first (``near`` holds it).
        earlier = [c for c in near if c.conversation_order < own[0].conversation_order]
        before = by_episode.get(max(earlier, key=lambda c: c.conversation_order).episode_id, []) if earlier else []
        text.update(zip((c.id for c in own), stored_texts(own, before, context), strict=True))
    return [text[c.id] for c in chunks]
