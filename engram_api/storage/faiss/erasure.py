"""Erasure on every host: a forgotten user's FAISS copies leave every process's memory and every host's
local index directory, with no directory shared between hosts, and a forgotten text every process's encoder
cache.

    record_erasure(redis, user_id, epoch)     # UserWrite.finish, after forget_user's graph commit (or at the
                                              # next write of a user whose killed forget_user left its stamp)
    record_removal(redis, user_id)            # UserWrite.finish, after a commit that removed records
    IndexSweeper(keeper, redis, interval_s, embedder).start()  # each worker and reader process: now, then timed

How it propagates:
- memory: at a process's next touch of the user its copy is compared with the graph's stamp, which is
  ``ABSENT`` or a new lifetime's, so the copy is dropped (``IndexKeeper``); the sweep drops it sooner;
- disk: ``forget_user`` adds a tombstone ``<index file stem>:<epoch>`` to a Redis sorted set
  (``keys.erased_indexes``), the stem being the user's hashed file name (no user id is stored). Each
  process sweeps once when it starts and then every ``index_sweep_interval_s``: it deletes the local base,
  log and stale temp files of every tombstone whose lifetime is the file's or later (``VectorStore.erase``)
  and drops cached copies of that lifetime, and the process's encoder cache drops the texts of every
  tombstoned user (``Embedder.forget``). So every host's cache loses an erased user's files within one
  sweep interval of the erasure while any of its processes runs, and at the start of the first process
  otherwise;
- texts: a write that removed records (``forget`` of a fact or a message, decay's expired excerpts,
  reconcile's and ``engram reindex``'s fixes of what a writer that died before its ``finish`` left) files
  the user's stem in a Redis sorted set scored by a fleet-wide sequence (``keys.forgotten_texts``; one
  member a user, moved to the end by each such write), and each process's sweep reads the members scored
  after the highest sequence it has applied (``TextSweep``) and drops the texts of every user of them its
  encoder cache holds (``Embedder.forget``: which texts were the removed records' is not known, so all of
  the user's go, one re-encode each later; a user with no removal keeps its texts). So a forgotten
  message's names and statements leave every process's encoder cache within one sweep interval of the
  forget's commit.

Invariants: a tombstone only ever deletes cache (the graph is the source of vectors), so a sweep that
deletes a file another process still wants costs that process a load from the graph, never an answer. A
later lifetime of the same user keeps its files (its epoch is newer). Tombstones are kept
``TOMBSTONE_RETAIN_S`` and every sweep applies all of them (a file a racing rebuild saved after one sweep
goes at the next). The removals record keeps the last ``REMOVALS_KEPT`` users: a process that finds
members trimmed past its place (more users' removals between two of its sweeps), or the sequence behind it
(Redis lost it), cannot tell whose texts went and drops its whole encoder cache once. The encoder cache knows no lifetimes, so a user id erased and then written again loses
its cached texts at each sweep while the tombstone is kept: a re-encode of a text per sweep interval, the
price of also catching a text a stage of the erased lifetime cached after the previous sweep. A host whose
processes were all stopped for longer must start with an empty index directory (docs/operations.md,
"Running on many hosts").
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.ledger.maintenance import MARK_CHANGED, MarkArgs, MarkKeys
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper

if TYPE_CHECKING:
    import redis

    from engram_api.storage.embedding.embedder import Embedder

__all__ = [
    "REMOVALS_KEPT",
    "TOMBSTONE_RETAIN_S",
    "IndexSweeper",
    "TextSweep",
    "record_erasure",
    "record_removal",
    "sweep_erased",
]

log = logging.getLogger(__name__)

TOMBSTONE_RETAIN_S = 30 * 86_400.0
REMOVALS_KEPT = 10_000  # users in the removals record (~1 MB of Redis); a sweep that missed more drops all
_STOP_WAIT_S = 30.0  # the most ``stop`` waits for a sweep under way (a Redis call's timeouts and retries)


def record_erasure(client: redis.Redis, user_id: str, epoch: int) -> None:
    """Tell every host that the user's lifetime ``epoch`` (and any earlier) is erased; trims old tombstones."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.erased_indexes(), {f"{VectorStore.stem(user_id)}:{epoch}": now})
    pipe.zremrangebyscore(keys.erased_indexes(), "-inf", now - TOMBSTONE_RETAIN_S)
    pipe.execute()


def record_removal(client: redis.Redis, user_id: str) -> None:
    """Tell every process that a committed write removed records of ``user_id``: its sweep drops the user's
    texts from its encoder cache (``TextSweep``). Two round trips: the mark (the maintenance record's script,
    ``MARK_CHANGED``, over this record's keys) and the trim."""
    MARK_CHANGED(
        client, MarkKeys(keys.forgotten_texts(), keys.forgotten_texts_sequence()), MarkArgs(VectorStore.stem(user_id))
    )
    client.zremrangebyrank(keys.forgotten_texts(), 0, -1 - REMOVALS_KEPT)


class TextSweep:
    """One process's place in the removals record (``keys.forgotten_texts``): the highest sequence it has
    applied (None before its first sweep, which takes every member kept as new: a process that starts
    holds few texts). Used by one sweeping thread."""

    def __init__(self) -> None:
        self.seen: int | None = None

    def __call__(self, client: redis.Redis, embedder: Embedder) -> int:
        """Drop from ``embedder`` the texts of the users with a removal filed after ``seen`` (all of its texts
        when members past ``seen`` may have been trimmed, or the sequence restarted); returns how many went."""
        key = keys.forgotten_texts()
        with client.pipeline(transaction=True) as pipe:
            pipe.zrangebyscore(key, "-inf" if self.seen is None else f"({self.seen}", "+inf", withscores=True)
            pipe.zrange(key, 0, 0, withscores=True)
            pipe.zcard(key)
            pipe.get(keys.forgotten_texts_sequence())
            new, lowest, kept, sequence = pipe.execute()
        seen, self.seen = self.seen, int(sequence or 0)
        if seen is not None and (self.seen < seen or (kept >= REMOVALS_KEPT and int(lowest[0][1]) > seen + 1)):
            return embedder.clear()  # members past ``seen`` trimmed (or re-scored: cannot tell), or Redis lost them
        stems = {m.decode() if isinstance(m, bytes) else m for m, _ in new}
        if not stems:
            return 0
        return sum(embedder.forget(user) for user in embedder.cached_users() if VectorStore.stem(user) in stems)


def sweep_erased(
    client: redis.Redis, keeper: IndexKeeper, embedder: Embedder | None = None, texts: TextSweep | None = None
) -> int:
    """Apply every tombstone to this process: delete its local files, drop its cached copies of erased
    lifetimes and the erased users' texts from ``embedder``'s cache, and the texts of users with a removal
    after ``texts``' place (a fresh ``TextSweep`` without it: every removal kept). Returns how many users'
    files went."""
    erased: dict[str, int] = {}
    for member in client.zrange(keys.erased_indexes(), 0, -1):
        stem, _, epoch = (member.decode() if isinstance(member, bytes) else member).partition(":")
        if epoch.isdigit():
            erased[stem] = max(int(epoch), erased.get(stem, 0))
    for user_id in keeper.cached_users():
        epoch = erased.get(VectorStore.stem(user_id))
        if epoch is not None:
            keeper.forget(user_id, up_to_epoch=epoch)
    if embedder is not None:
        for user_id in embedder.cached_users():
            if VectorStore.stem(user_id) in erased:
                embedder.forget(user_id)
        (texts or TextSweep())(client, embedder)
    return sum(keeper.vectors.erase(stem, epoch) for stem, epoch in erased.items())


class IndexSweeper:
    """Runs ``sweep_erased`` now and then every ``interval_s`` on a daemon thread, for one process.

    A sweep that fails (Redis away) is tried again the next interval for as long as the process runs (Redis
    may come back), logged once an outage, not at every retry. ``stop`` returns once the thread has ended:
    whoever made the sweeper stops it when it closes (``MemoryClient.close``, ``WorkerResources.close``), so
    none is left sweeping a Redis that is gone.
    """

    def __init__(
        self, keeper: IndexKeeper, client: redis.Redis, interval_s: float, embedder: Embedder | None = None
    ) -> None:
        self.keeper = keeper
        self.embedder = embedder
        self.texts = TextSweep()  # this process's place in the removals record
        self.client = client
        self.interval_s = interval_s
        self.sweeps = 0
        self.failures = 0  # sweeps that failed (tests read it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> IndexSweeper:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engram-index-sweep", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=_STOP_WAIT_S)  # at once between sweeps; a sweep under way ends first

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                sweep_erased(self.client, self.keeper, self.embedder, self.texts)
                self.sweeps += 1
                if failing:
                    log.info("erasure sweep done again")
                    failing = False
            except Exception:  # a sweep that fails (Redis away) retries next interval
                self.failures += 1
                if not failing:
                    log.warning("erasure sweep failed; retrying every %.0f s", self.interval_s, exc_info=True)
                    failing = True
            self._stop.wait(self.interval_s)
