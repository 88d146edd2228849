"""A reader's copies of one user (its FAISS index in ``IndexKeeper``, its snapshot in ``SnapshotCache``)
brought to a published stamp with ONE read of the graph, started before the recall needs them.

Two ways in:
- a recall at a stamp its copies are behind runs the catch-up itself (``start``), on the thread that reads
  its stamp: the reader thread that runs beside the query's model call (``RecallReader._begin``), which then
  searches the caught-up snapshot for the keyword channel as with no write since. Not a thread of its own:
  the read overlaps the embedding either way, and two hand-offs less (the catch-up's, and the keyword
  search's that waited for it on a third thread) are CPU the recall does not spend. Only a catch-up already
  running (a signal's) is joined, and waited for after the embedding (``Future.result``);
- a writer's stamp signal (``engram_api.reader.signals``) starts the same catch-up in the background
  (``signalled``), so the user's next recall usually finds both copies current and reads nothing.

One read: the writers' change feed in Redis (``engram_api.storage.faiss.feed``: the stamp and the last
writes' changes, one round trip) from the older of the copies' versions brings both when it reaches the
stamp; else, when the snapshot is behind, ``GraphStore.user_changes`` from that version (one auto-commit
statement on Neo4j, one read transaction on SQLite); when only the index is, ``IndexKeeper.current``
reads its changes alone (``vector_changes``).

Invariants:
- correctness never depends on a signal: a recall compares its copies with the stamp it read from Redis
  (or the graph) and catches up or rebuilds itself; a lost, late, duplicated or reordered signal only
  costs or saves time. A signal older than a copy does nothing;
- a signal only ever catches up copies of the user it names, and only copies this process already holds
  in memory: it loads no user (another user's signal never reads this user's records, nor a user this
  process does not serve);
- at most one catch-up of a user runs at a time (a recall joins the one running when it reaches its
  stamp), and at most ``SIGNALLED_IN_FLIGHT`` signalled ones at once: a burst of writes to many users is
  dropped past that, and those users' recalls catch up themselves;
- a catch-up that fails (the store away) is logged and forgotten: the recall's own ``IndexKeeper.current``
  then reads, and raises the store's error if it is still down;
- the held snapshot's fold that a catch-up makes due (a removal, or the overlay's share) is handed to
  ``ReaderThreads.when_idle``: never run beside a recall of the process (the recall that waits for this
  catch-up included), at the latest ``ENGRAM_SNAPSHOT_FOLD_DEADLINE_S`` after it;
- a copy is labelled with the stamp its read reached, never the stamp asked for: a read from a lagging
  replica (below ``stamp``) moves the copies only that far, and the recall's ``IndexKeeper.current`` reads
  again (``keeper``'s docstring).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from engram_api.errors import EngramError
from engram_api.reader.facts import SnapshotCache
from engram_api.storage.faiss.feed import read_feed
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.faiss.sync import UserChanges
from engram_api.storage.graph.contract import GraphStore
from engram_api.versions import Stamp

if TYPE_CHECKING:
    import redis

    from engram_api.reader.background import ReaderThreads

__all__ = ["SIGNALLED_IN_FLIGHT", "CatchUps"]

log = logging.getLogger(__name__)

# Signalled catch-ups running at once (each one read of what one write changed); more are dropped.
SIGNALLED_IN_FLIGHT = 2


class CatchUps:
    """One reader's catch-ups (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        graph: GraphStore,
        keeper: IndexKeeper,
        snapshots: SnapshotCache,
        threads: ReaderThreads,
        redis_client: redis.Redis | None = None,
    ) -> None:
        self.graph = graph
        self.redis = redis_client
        self.keeper = keeper
        self.snapshots = snapshots
        self.threads = threads
        self.signalled = 0  # catch-ups a signal started (tests and benchmarks read it)
        self.from_feed = 0  # catch-ups the change feed answered, with no read of the graph
        self._running: dict[str, tuple[Stamp, Future[None]]] = {}
        self._signalled_running = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _in_flight(self, user_id: str) -> tuple[Stamp, Future[None]] | None:
        """The user's catch-up running in this process (call with the lock held). A forked child's copy
        of the parent's is dropped: no thread of the child would ever finish it."""
        if self._pid != os.getpid():
            self._running, self._signalled_running, self._pid = {}, 0, os.getpid()
        return self._running.get(user_id)

    def _behind(self, user_id: str, stamp: Stamp) -> bool:
        """True when a copy this process holds in memory is of ``stamp``'s lifetime and older. The index
        copy is judged as held in memory, its local file not probed: a log another process of this host
        appended can only move it on, which the catch-up's ``held`` then finds (and a copy at ``stamp``
        needs nothing from the file)."""
        held = self.keeper.held_stamp(user_id)
        index_behind = held is not None and held.epoch == stamp.epoch and held.version < stamp.version
        return index_behind or self.snapshots.behind(user_id, stamp)

    def start(self, user_id: str, stamp: Stamp) -> Future[None] | None:
        """The catch-up of the user's copies to ``stamp``: the one running when it reaches ``stamp``, else a
        new one run on the calling thread (returned done); None when no held copy is behind
        (``IndexKeeper.current`` still loads or rebuilds a copy this process lacks)."""
        with self._lock:
            running = self._in_flight(user_id)
            if running is not None and running[0] >= stamp:
                return running[1]
        if not self._behind(user_id, stamp):
            return None
        return self._submit(user_id, stamp, signalled=False)

    def signalled_stamp(self, user_id: str, stamp: Stamp) -> None:
        """A writer published ``stamp`` for ``user_id``: catch up the copies held of that user, off any
        recall's path (bounded, see the module docstring)."""
        with self._lock:
            running = self._in_flight(user_id)
            if self._signalled_running >= SIGNALLED_IN_FLIGHT or (running is not None and running[0] >= stamp):
                return
        if self._behind(user_id, stamp):
            self._submit(user_id, stamp, signalled=True)

    def _submit(self, user_id: str, stamp: Stamp, *, signalled: bool) -> Future[None] | None:
        with self._lock:
            running = self._in_flight(user_id)
            if running is not None:  # one at a time per user: join it if it reaches the stamp
                return running[1] if running[0] >= stamp else None
            if signalled:
                if self._signalled_running >= SIGNALLED_IN_FLIGHT:
                    return None
                self._signalled_running += 1
                self.signalled += 1
            done: Future[None] = Future()
            self._running[user_id] = (stamp, done)
        if signalled:
            self.threads.behind(self._run, user_id, stamp, done, signalled)
        else:
            self._run(user_id, stamp, done, signalled)
        return done

    def _run(self, user_id: str, stamp: Stamp, done: Future[None], signalled: bool) -> None:
        try:
            self._catch_up(user_id, stamp, answering=not signalled)
        except EngramError as exc:  # the recall's own read raises the store's error if it is still down
            log.warning("copies of %s not caught up: %s", user_id, exc)
        except Exception:  # off the recall's path, or joined by it: never take the reader down
            log.exception("copies of %s not caught up", user_id)
        finally:
            with self._lock:
                self._running.pop(user_id, None)
                if signalled:
                    self._signalled_running -= 1
            done.set_result(None)

    def _catch_up(self, user_id: str, stamp: Stamp, *, answering: bool) -> None:
        index = self.keeper.held(user_id)
        if index is not None and (index.epoch != stamp.epoch or index.version >= stamp.version):
            index = None  # current, or another lifetime's (``IndexKeeper.current`` rebuilds that)
        held = self.snapshots.peek(user_id)
        if held is not None and not self.snapshots.behind(user_id, stamp):
            held = None
        if index is None and held is None:
            return
        since = min(copy.stamp.version for copy in (index, held) if copy is not None)
        changes = self._from_feed(user_id, since, stamp)
        if changes is None and held is None:
            self.keeper.current(user_id, stamp)  # its vectors' read alone
            return
        if changes is None:
            changes = self.graph.user_changes(user_id, since)
        if index is not None:
            self.keeper.apply(user_id, index, changes.vectors)
        if held is not None:
            self.snapshots.caught_up(held, changes, stamp, answering=answering)
            # After a removal, or now and then: off the path, once no recall of the process is in flight.
            self.snapshots.fold_soon(user_id, self.threads.when_idle)

    def _from_feed(self, user_id: str, since: int, stamp: Stamp) -> UserChanges | None:
        """The changes after ``since`` from the writers' change feed when it reaches ``stamp``; None without
        Redis, when it does not (a gap, trimmed, expired, scrubbed) or when Redis fails: the graph is read."""
        if self.redis is None:
            return None
        import redis  # only with a client, so loaded already

        try:
            changes = read_feed(self.redis, user_id, since, upto=stamp)
        except redis.RedisError as exc:
            log.info("change feed of %s not read (%s): reading the graph", user_id, exc)
            return None
        if changes is None or changes.vectors.stamp.epoch != stamp.epoch or changes.vectors.stamp < stamp:
            return None
        with self._lock:
            self.from_feed += 1
        return changes
