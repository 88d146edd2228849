"""Index reconciliation: make this host's FAISS files agree with the graph store again.

The graph is the source of truth and every process's index is a cache of it (``vectorsync``). Writers
keep their copies in step (``IndexKeeper.advance``) and any copy behind the graph catches up by version,
but a damaged disk file or a bug can leave a copy wrong. This job compares each local file of the users
it is given (a user with no file on this host is no fault: a host keeps copies of the users it served
only, and this job never writes one for the others) with the graph's vectors and stamp (epoch, version):
a file behind is caught up (then checked like any other), one that disagrees is rebuilt, and the fixed
users' stamps are published. A copy that held records the graph no longer has (removed since it was
written, e.g. by a writer that died between its commit and its ``finish``) files the user's removal like
any removing write (``UserWrite.finish``'s ``removals``: every process's encoder cache drops the user's
texts at its sweep). It also removes the artefacts of users the graph does not know: index
files (a reader's rebuild racing ``forget_user`` can leave one) and published stamps in Redis. Those are
listed *before* the graph's users, and every writer commits the graph before it writes a file or a
stamp, so an artefact of a user being created right now is never mistaken for an orphan; a file is
erased up to the lifetime its header held when listed, so a user created again since (its files keep
their names) keeps the new lifetime's (a later epoch). A published
stamp of a user the graph does not know is the mark of a ``forget_user`` killed between its graph commit
and its ``finish``: that erasure is finished in the user's guard (its lease), where the graph is read
again, so a user created since the listing keeps its stamp, and one still unknown gets what a finished
``forget_user`` leaves (``UserWrite.finish``): the tombstone every host's erasure sweep deletes its files
and drops its cached texts by, its stamp, change feed and change marks deleted.

Backfill: given an embedder, it also gives chunks (vectors and keyword entries) to every episode that
has none (messages applied before hybrid memory existed), built from the stored text by
``episodes.chunk_episode`` with the same derived ids, in the user's ``UserWrite`` like any other write.
Episodes past ``episode_max_age_days`` are left alone while ``decay_episodes`` is on: decay removed their
chunks on purpose (``decay.episode_cutoff``).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Literal

import redis
from pydantic import BaseModel, Field

from engram_api import keys
from engram_api.models import utcnow
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.states import pack
from engram_api.storage.faiss.files import UserIndex
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import chunk_episode, own_end
from engram_api.storage.writer.userwrite import UserWrite
from engram_api.versions import ABSENT
from engram_workers.maintenance._common import Guard, UserFailure, guarded, isolate, target_users
from engram_workers.maintenance.decay import episode_cutoff

__all__ = ["BackfillUser", "ReconcileReport", "ReconcileUser", "reconcile", "reindex_user", "remove_orphans"]

Problem = Literal["unreadable", "another lifetime", "ahead", "ids differ"]
# A temp file this old is a crashed writer's leftover (a save takes milliseconds to seconds).
_STALE_TMP_S = 3600.0


class ReconcileUser(BaseModel):
    """A user whose index was wrong, what was wrong, and that it was rebuilt."""

    user_id: str
    problem: Problem
    detail: str
    graph_version: int
    index_version: int | None = None
    missing_ids: int = Field(0, description="graph vectors the index lacked")
    extra_ids: int = Field(0, description="index rows the graph no longer has")
    rebuilt_rows: int = 0


class BackfillUser(BaseModel):
    """A user whose episodes without chunks got them."""

    user_id: str
    episodes: int
    chunks: int


class ReconcileReport(BaseModel):
    users: int = 0
    ok: int = 0
    rebuilt: int = 0
    orphan_files: int = Field(default=0, description="index files of users the graph does not know, removed")
    orphan_stamps: int = Field(
        default=0, description="users with a published stamp the graph did not know, their erasure finished"
    )
    fixed: list[ReconcileUser] = Field(default_factory=list)
    backfilled: list[BackfillUser] = Field(default_factory=list, description="episodes given chunks")
    failed: list[UserFailure] = Field(default_factory=list)


def reconcile(
    *,
    graph: GraphStore,
    keeper: IndexKeeper,
    guard: Guard,
    user_ids: list[str] | None = None,
    redis_client: redis.Redis | None = None,
    embedder: Embedder | None = None,
    settings: Settings | None = None,
    orphans: bool = True,
) -> ReconcileReport:
    """Rebuild every local index file that is unreadable, of another lifetime, ahead of the graph or holds
    other node ids (once caught up), remove the artefacts of users the graph does not know (``orphans``;
    the fan-out's tasks leave that to their driver) and, given an ``embedder``, backfill the chunks of
    episodes that have none (see the module docstring)."""
    report = (
        remove_orphans(graph=graph, keeper=keeper, redis_client=redis_client, guard=guard)
        if orphans
        else ReconcileReport()
    )
    cutoff = episode_cutoff(settings or Settings(), utcnow())

    def check(write: UserWrite) -> tuple[ReconcileUser | None, BackfillUser | None]:
        # Under the guard no writer moves the graph or the file between the comparison and the fix.
        fault, gone = _diagnose(graph, keeper, write.user_id)
        if fault is not None:
            fault.rebuilt_rows = len(keeper.rebuild(write.user_id))
        if fault is not None or gone:
            # Publish the graph's stamp (a writer that lost its lease may not have); nothing to revisit. Rows
            # the copy held that the graph lost are removals (a writer may have died before its ``finish``
            # filed them): every process's encoder cache drops the user's texts at its sweep.
            write.finish(removals=sorted(gone), changed=False)
        filled = None if embedder is None else _backfill(graph, embedder, write, cutoff)
        return fault, filled

    for user_id in target_users(graph, user_ids):
        with isolate("reconcile", user_id, report.failed):
            fault, filled = guarded(guard, user_id, check)
            report.users += 1
            if filled is not None:
                report.backfilled.append(filled)
            if fault is None:
                report.ok += 1
                continue
            report.rebuilt += 1
            report.fixed.append(fault)
    return report


def remove_orphans(
    *, graph: GraphStore, keeper: IndexKeeper, redis_client: redis.Redis | None, guard: Guard
) -> ReconcileReport:
    """Remove this host's index files of users the graph does not know and crashed writers' temp files, and
    finish the erasure of each user whose stamp is published though the graph does not know it, in the
    user's ``guard`` (``_finish_erasure``; a user busy there is a failure, tried again next run: the stamp
    stays until then); a report with only the orphan counts and those failures set. Lists every file, stamp
    and user (no vectors): the fan-out's driver runs it once per run."""
    report = ReconcileReport()
    # Artefacts first, the graph's users second (see the module docstring for why this order is safe).
    listed = keeper.vectors.lifetimes()
    stamps = [] if redis_client is None else list(redis_client.scan_iter(match=keys.user_version("*"), count=500))
    known = set(graph.list_users())
    owned = {keeper.vectors.stem(user_id) for user_id in known}
    # Up to the lifetime listed: a user created again since keeps its new files (a later epoch).
    report.orphan_files += sum(keeper.vectors.erase(s, epoch) for s, epoch in listed.items() if s not in owned)
    for tmp in keeper.vectors.root.glob("*.tmp") if keeper.vectors.root.is_dir() else []:
        if time.time() - tmp.stat().st_mtime > _STALE_TMP_S:
            tmp.unlink(missing_ok=True)
    if redis_client is None:
        return report
    prefix = keys.user_version("")
    for user_id in (key[len(prefix) :] for key in stamps):
        if user_id not in known:
            with isolate("reconcile", user_id, report.failed):
                report.orphan_stamps += guarded(guard, user_id, _finish_erasure)
    return report


def reindex_user(keeper: IndexKeeper, write: UserWrite) -> UserIndex:
    """Rebuild this host's copy of the user from the graph inside ``write`` (``engram reindex``) and finish it
    as any write: the node ids this host's file held that the graph does not have are the write's removals
    (filed for every process's encoder cache, the change feed scrubbed of them), the graph's stamp is
    published (every copy behind it catches up, removals included), and a user the graph does not know
    finishes as an erasure (``UserWrite.finish``). Returns the rebuilt index."""
    held = keeper.vectors.load(write.user_id)  # None: no file here, or unreadable (nothing known to remove)
    index = keeper.rebuild(write.user_id)
    write.finish(removals=sorted(set() if held is None else held.node_ids() - index.node_ids()))
    return index


def _finish_erasure(write: UserWrite) -> int:
    """Finish the erasure of a user whose stamp is published though the graph, listed after it, did not
    know it: 1 once ``finish`` did (the graph, read again under the user's lease at ``open``, still has no
    user: ``finish`` files the published lifetime's tombstone, then deletes its stamp, feed and marks); 0
    for a user the graph holds now (created since the listing: the stamp is its own, and its creating
    write filed the lost lifetime's tombstone)."""
    if write.before != ABSENT:
        return 0
    write.finish(changed=False)
    return 1


def _backfill(graph: GraphStore, embedder: Embedder, write: UserWrite, cutoff: datetime | None) -> BackfillUser | None:
    """Chunk, embed and store the episodes of the user that have no chunk; the index gets their vectors."""
    user_id = write.user_id
    stored = [e for e in graph.episodes(user_id) if cutoff is None or e.event_time >= cutoff]
    have = {c.episode_id for c in graph.get_chunks(user_id, episode_ids=[e.id for e in stored])} if stored else set()
    chunks = [c for e in stored if e.id not in have for c in chunk_episode(e)]
    if not chunks:
        return None
    # The token states from the vector's own pass, as apply keeps them (late interaction reads them).
    texts = [c.indexed_text for c in chunks]
    vectors, kept = embedder.encode_states(texts, [own_end(t) for t in texts])
    for chunk, vector, held in zip(chunks, vectors, kept, strict=True):
        chunk.embedding, chunk.token_states = vector.tolist(), pack(held)
    # Planned from reads under the fence: a writer in between makes this write refused and re-planned.
    added = graph.add_chunks(user_id, chunks)
    write.finish(
        upserts=[(c.id, "episode", c.embedding or []) for c in chunks],
        changed=False,
        states={c.id: c.token_states for c in chunks if c.token_states is not None},
    )
    return BackfillUser(user_id=user_id, episodes=len({c.episode_id for c in chunks}), chunks=added)


def _diagnose(graph: GraphStore, keeper: IndexKeeper, user_id: str) -> tuple[ReconcileUser | None, set[str]]:
    """The fault of this host's copy of the user (None: it is right, once caught up) and the node ids its
    file held that the graph does not (records removed since it was written, a stray row, another
    lifetime's; none when unreadable)."""
    if not keeper.vectors.path_for(user_id).exists():
        return None, set()  # no copy on this host: nothing to check, and none to make (the module docstring)
    items, stamp = graph.stamped_vectors(user_id)
    version = stamp.version

    def fault(
        problem: Problem, detail: str, index_version: int | None = None, missing: int = 0, extra: int = 0
    ) -> ReconcileUser:
        return ReconcileUser(
            user_id=user_id,
            problem=problem,
            detail=detail,
            graph_version=version,
            index_version=index_version,
            missing_ids=missing,
            extra_ids=extra,
        )

    index = keeper.vectors.load(user_id)
    if index is None:
        return fault("unreadable", "index file cannot be read (damaged, truncated or another dimension)"), set()
    expected = {item.node_id for item in items}
    gone = index.node_ids() - expected  # taken before a catch-up, which drops the rows of removals since
    if index.epoch != stamp.epoch:
        # e.g. a file a forgotten lifetime of this user left behind: its contents are not this user's now.
        return fault("another lifetime", f"index of epoch {index.epoch}, graph at {stamp.epoch}", index.version), gone
    if index.version > version:
        # The graph went back (e.g. a restore): the index holds a future it cannot be trusted with.
        return fault("ahead", f"index at v{index.version}, graph at v{version}", index_version=index.version), gone
    if index.version < version:
        # Behind is normal for a cache (another host wrote): catch it up from the graph, then check it.
        index = keeper.current(user_id, stamp)
    actual = index.node_ids()
    if expected != actual:
        missing, extra = len(expected - actual), len(actual - expected)
        problem = fault(
            "ids differ",
            f"{missing} graph vectors missing from the index, {extra} index rows not in the graph",
            index_version=index.version,
            missing=missing,
            extra=extra,
        )
        return problem, gone
    return None, gone
