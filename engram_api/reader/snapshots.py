"""Small users' whole graphs held for recall (``SnapshotCache``), each at the stamp it was read at.

Invariants:
- a user's whole graph (``UserSnapshot``, at most ``max_records`` facts and chunks) is loaded on a reader
  thread once a second recall finds the same stamp without it, and then answers the graph step, every
  record read and the keyword search (``UserSnapshot.keyword_search``) with no store call, at that stamp
  or newer (``reader.facts``' ``UserFacts`` and ``UserChunks`` read it);
- after a write (this process's or another host's), the held snapshot is refreshed with only the records
  written since (``SnapshotCache.caught_up``), read with the FAISS copy's changes in one round trip
  (``GraphStore.user_changes``, ``engram_api.reader.catchup``): on a writer's stamp signal before the next
  recall, else by the first recall at the new stamp on a reader thread while it embeds the query (the
  store's graph step and keyword search are two round trips that read the user's neighbourhood: on Neo4j a
  2K-fact user's step took ~80-100 ms, measured by the hosts bench), which then answers from it; a user
  written between every recall is therefore answered from memory too (a refresh run behind the recall
  instead was never used: measured 1.4x slower);
- only a snapshot at most ``CATCH_UP_VERSIONS`` behind is refreshed in the recall (a forget's removed
  records too: the catch-up's read lists their ids, ``UserSnapshot.caught_up``); another lifetime or the
  bound make the refresh impossible, and then, as for a snapshot farther behind, the
  recall goes to the store and a reader thread refreshes or loads whole (``missed``: at once when the held
  one answered a recall, else on the second recall at a stamp); one whose index holds more vectors than
  the bound costs no store query at all;
- the overlay is folded into a new base on a reader thread, off any recall's path (``fold_soon``), once it
  holds a share of the user's records or, at once, after a catch-up or refresh that applied a removal (a
  forget of a fact or a message, decay's expired chunks: ``UserSnapshot.fold_due``): the removed rows,
  keyword documents and postings the overlay hides are out of the reader's memory once that fold has run.
  A catch-up and a refresh off the path (``missed``) both hold the snapshot that hides the removal, and hand
  its fold to ``ReaderThreads.when_idle``: it starts once no recall of the process is in flight, at the latest
  ``ENGRAM_SNAPSHOT_FOLD_DEADLINE_S`` after the catch-up or refresh (a fold copies the user, ~5-25 ms of a
  thread at 10K facts, and beside a recall it took turns with the recall's Python for the GIL: a refresh off
  the path runs while the recall that asked for it reads the store), and ``flush`` starts it at once; at most
  one fold of a user is in flight or waiting, and it folds again while the held snapshot is still due (a
  removal caught up during it);
- a slow load never rolls a newer snapshot back, and all the snapshots held sum to at most
  ``budget_records`` records;
- a snapshot of a lifetime the user has ended (a recall finds the user absent, or in a newer lifetime:
  ``forget_user`` on any host) is dropped at that recall, with the user's terms memo: an erased user's
  records leave this reader's memory at its next touch of the user, and at once after its own erasure
  (``drop_user``); the terms of the texts recall scored are kept with the snapshot that held them or, for a
  user read without one, in ``terms`` (``reader.terms``), never in a memo of the process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from engram_api.errors import EngramError
from engram_api.reader.terms import TermCache
from engram_api.storage.faiss.sync import UserChanges
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.snapshot.keywords import TextTerms
from engram_api.versions import ABSENT, Stamp

__all__ = ["CATCH_UP_VERSIONS", "SnapshotCache"]

log = logging.getLogger(__name__)
_TRACKED_USERS = 4096  # users whose last unloaded stamp is remembered (a few dozen bytes each)
# Writes a held snapshot may be behind and still be refreshed in a recall: each reads about what one write
# changed, so this bounds what one recall can read before it answers (farther behind: refreshed off the path).
CATCH_UP_VERSIONS = 64


class SnapshotCache:
    """Small users' whole graphs, each at the stamp it was read at (see the module docstring). Thread-safe."""

    def __init__(self, *, max_records: int, budget_records: int) -> None:
        self.max_records = max_records
        # A snapshot holds ~0.9 KB a fact, ~1.4 KB a chunk (tracemalloc, the 100K-fact user: 92 MB).
        self.budget_records = budget_records
        self._held: OrderedDict[str, UserSnapshot] = OrderedDict()
        self._seen: OrderedDict[str, Stamp] = OrderedDict()  # the stamp a recall last found unloaded
        self._answered: set[str] = set()  # users whose held snapshot has answered a recall
        self._loading: set[str] = set()
        self._folding: set[str] = set()  # users whose fold is in flight (``fold_soon``)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.unheld_terms = TermCache()  # the terms memos of users read without a snapshot

    def get(self, user_id: str, stamp: Stamp) -> UserSnapshot | None:
        """The snapshot held at ``stamp`` or newer in its lifetime (a catch-up may have read writes
        committed after ``stamp`` was published: what the store's own step would read too). One of a lifetime
        ``stamp`` says has ended is dropped (the module docstring)."""
        with self._lock:
            held = self._held.get(user_id)
            if held is not None and held.stamp.epoch != stamp.epoch and (stamp == ABSENT or stamp > held.stamp):
                self._drop(user_id)
                return None
            if held is None or held.stamp.epoch != stamp.epoch or held.stamp < stamp:
                return None
            self._held.move_to_end(user_id)
            self._answered.add(user_id)
            return held

    def peek(self, user_id: str) -> UserSnapshot | None:
        """The snapshot held for the user, at whatever stamp; unlike ``get``, not counted as answering."""
        with self._lock:
            return self._held.get(user_id)

    def missed(
        self,
        graph: GraphStore,
        user_id: str,
        stamp: Stamp,
        vectors: int,
        submit: Callable[..., object],
        fold: Callable[..., object],
    ) -> None:
        """A recall found no snapshot at ``stamp``: refresh the one held at an older stamp of the same
        lifetime with ``submit`` (it reads only what was written since), or, on the second such recall,
        load one whole; a refresh that leaves the snapshot due (a removal, the overlay's share) folds it with
        ``fold`` (``fold_soon``). ``vectors``: the fact and episode vectors of the user's index at ``stamp``,
        one per fact or chunk, so a user clearly above the bound costs no store query (the store's count
        decides)."""
        if not 0 < vectors <= self.max_records:
            return
        with self._lock:
            self._own_process()
            if user_id in self._loading:
                return
            held = self._held.get(user_id)
            if held is None or held.stamp.epoch != stamp.epoch or held.stamp > stamp:
                held = None
            # A refresh at once only while refreshes pay: the held one answered a recall before this write.
            # Else (a user written between every recall) the second recall at a stamp asks for one.
            eager = held is not None and user_id in self._answered
            if not eager and self._seen.get(user_id) != stamp:
                self._seen[user_id] = stamp
                self._seen.move_to_end(user_id)
                while len(self._seen) > _TRACKED_USERS:
                    self._seen.popitem(last=False)
                return
            self._loading.add(user_id)
        submit(self._load, graph, user_id, stamp, held, fold)

    def _load(
        self, graph: GraphStore, user_id: str, stamp: Stamp, held: UserSnapshot | None, fold: Callable[..., object]
    ) -> None:
        try:
            snapshot = None if held is None else graph.refresh_snapshot(held, max_records=self.max_records)
            if snapshot is None:  # none held, removals below the horizon, another lifetime, the bound: whole
                snapshot = graph.snapshot(user_id, max_records=self.max_records)
        except EngramError as exc:  # recall goes on through the store; a later recall tries again
            log.warning("snapshot of %s not loaded: %s", user_id, exc)
            return
        except Exception:  # an optimization off the recall path must never take the reader down
            log.exception("snapshot of %s not loaded", user_id)
            return
        finally:
            with self._lock:
                self._loading.discard(user_id)
        if snapshot is None:  # more records than vectors (facts without one): the store's step it is
            return
        if self._keep(snapshot, answering=False):
            self.fold_soon(user_id, fold)  # the removals it applied, as a catch-up's: the promise is the same

    def _keep(self, snapshot: UserSnapshot, *, answering: bool) -> bool:
        """Hold ``snapshot`` unless a newer one of the user is held (a slow load never rolls one back);
        ``answering``: it answers the recall that refreshed it. False when not kept."""
        user_id = snapshot.user_id
        with self._lock:
            current = self._held.get(user_id)
            if current is not None and current.stamp > snapshot.stamp:
                return False
            self._held[user_id] = snapshot
            self._held.move_to_end(user_id)
            self._answered.discard(user_id)
            while sum(s.size for s in self._held.values()) > self.budget_records:
                self._answered.discard(self._held.popitem(last=False)[0])
            if user_id not in self._held:
                return False  # it alone is above the budget
            if answering:
                self._answered.add(user_id)
            return True

    def behind(self, user_id: str, stamp: Stamp) -> bool:
        """True when the held snapshot is of ``stamp``'s lifetime, older, and at most ``CATCH_UP_VERSIONS``
        behind it, with no load of the user in flight: ``caught_up`` may refresh it."""
        with self._lock:
            held = self._held.get(user_id)
            return (
                held is not None
                and user_id not in self._loading
                and held.stamp.epoch == stamp.epoch
                and held.stamp.version < stamp.version <= held.stamp.version + CATCH_UP_VERSIONS
            )

    def caught_up(
        self, held: UserSnapshot, changes: UserChanges, stamp: Stamp, *, answering: bool
    ) -> UserSnapshot | None:
        """``held`` brought to the graph's stamp by ``changes`` (``GraphStore.user_changes`` from its
        version or an older one, read by ``engram_api.reader.catchup`` with the FAISS copy's) and held;
        returned when at ``stamp`` or newer (a signal may name a stamp the graph is not at). None when the
        refresh cannot (another lifetime, the bound, unmarked writes: the recall then
        goes to the store, and ``missed`` loads). ``answering``: it answers the recall that refreshed it.
        Newer than ``stamp`` when writes committed since it was published: what the store's own step would
        read too."""
        fresh = held.caught_up(changes, max_records=self.max_records)
        if fresh is None or not self._keep(fresh, answering=answering):
            return None
        return fresh if fresh.stamp.epoch == stamp.epoch and fresh.stamp >= stamp else None  # kept all the same

    def fold_soon(self, user_id: str, behind: Callable[..., object]) -> None:
        """Fold the held snapshot with ``behind`` (a reader thread nobody waits for but ``flush``: the
        catch-up's ``ReaderThreads.when_idle``, which waits for the process's recalls to pause) when it is
        due (``UserSnapshot.fold_due``), unless a fold of the user is in flight or waiting: that one folds
        again while the held snapshot is due, so folds of a user never overlap and a removal caught up during
        one is folded right after it (a catch-up holds its snapshot before it calls this)."""
        with self._lock:
            self._own_process()
            held = self._held.get(user_id)
            if held is None or not held.fold_due or user_id in self._folding:
                return
            self._folding.add(user_id)
        behind(self._fold_while_due, user_id)

    def _fold_while_due(self, user_id: str) -> None:
        folded = None
        try:
            while True:
                with self._lock:  # the check and the release together: ``fold_soon`` sees one or the other
                    held = self._held.get(user_id)
                    if held is None or held is folded or not held.fold_due:
                        self._folding.discard(user_id)
                        return
                folded = self._folded(held)
        except Exception:  # off the recall's path: never take the reader down (a later catch-up folds)
            log.exception("snapshot of %s not folded", user_id)
            with self._lock:
                self._folding.discard(user_id)

    def _folded(self, held: UserSnapshot) -> UserSnapshot:
        """``held`` folded into a new base (a copy of the user's snapshot, so on a reader thread, off any
        recall's path), and held in its place unless another replaced it meanwhile."""
        merged = held.merged()
        with self._lock:
            if self._held.get(held.user_id) is held:
                self._held[held.user_id] = merged
        return merged

    def terms(self, user_id: str, stamp: Stamp, snapshot: UserSnapshot | None) -> TextTerms:
        """The terms memo of a recall of the user at ``stamp``: ``snapshot``'s (the one it reads), else the
        user's in ``unheld_terms`` (``reader.terms``)."""
        return snapshot.terms if snapshot is not None else self.unheld_terms.of(user_id, stamp)

    def _own_process(self) -> None:
        """Forget the loads and folds in flight when this is a forked child (call with the lock held): they
        are the parent's, no thread of the child would ever end them."""
        if self._pid != os.getpid():
            self._loading, self._folding, self._pid = set(), set(), os.getpid()

    def _drop(self, user_id: str) -> None:
        """Forget everything held of the user (call with the lock held)."""
        self._held.pop(user_id, None)
        self._seen.pop(user_id, None)
        self._answered.discard(user_id)
        self.unheld_terms.drop_user(user_id)

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            self._drop(user_id)
