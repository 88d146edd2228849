"""One user write: lease, fenced graph write, FAISS index, published stamp, caches. Every writer of a
user's memory (the apply stage, forget, forget_user, feedback, every maintenance job) goes through here.

    writes = UserWrites(graph=..., keeper=..., redis_client=..., lease_ttl_s=30)
    result = writes.run(user_id, body)          # body(w) plans from fresh reads, writes, calls w.finish()

Invariants:
- ``open`` takes the user's lease (renewed while the body works), reads the user's stamp and fences
  this thread's graph writes on it: a write commits only if the stamp is still the one the plan was
  built on, else the store raises ``StaleWriteError`` and writes nothing. ``run`` then re-plans under
  a fresh lease (bounded attempts), so two writers whose leases overlapped end as a sequential run.
  ``replanned`` is that loop, the only one: maintenance jobs run their writes through it too.
- ``run(..., published=True)`` (the apply stage) fences its first attempt on the stamp writers last
  published in Redis instead of asking the graph (one Redis GET for a graph round trip, ~2.5 ms of client
  and server CPU a message on Neo4j). Only a lease holder publishes, after its commit, so under the lease
  that stamp is the graph's unless a writer died between the two or the graph was changed behind Redis's
  back; then the fence refuses the write (nothing is written) and the re-plan reads the graph's stamp.
- ``finish`` runs after the graph writes: it moves the FAISS index from the stamp read at ``open`` to
  the stamp after the writes (a delta, or a rebuild when the file is elsewhere), publishes that stamp
  in Redis (atomically only while the lease is still ours) with the write's change-feed entry (what the
  graph's ``user_changes`` returns right after the commit, so readers behind need not ask the graph;
  ``engram_api.storage.faiss.feed``; a write that removed anything deletes the earlier entries and adds
  its own, which lists the removed ids; on Neo4j the
  last write statement reads it itself, ``Fence.changes``, so the entry costs no round trip) and drops
  the process's caches; after ``forget_user`` it also leaves the erasure tombstone every host's sweep deletes its files by
  (a write that opened on a user the graph did not hold files it for a lifetime Redis still publishes: a
  ``forget_user`` killed before its ``finish``), and after a write that removed records the removal every
  process's sweep drops the user's cached texts by. When the
  lease was lost after the commit, it takes the lease again and finishes only if the graph is still at
  its stamp; otherwise the newer writer owns the index and the published stamp.
- ``index`` catches a copy that is behind (another host wrote the user last) up from that writer's
  change-feed entries in Redis, the graph read only when the feed does not reach back: a host that was not
  the user's last writer pays one Redis round trip, not a graph read.
- Only users a write changed are published: nothing here walks every user.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from engram_api import keys
from engram_api.errors import EngramError, StaleWriteError, UserBusyError
from engram_api.storage.faiss.erasure import record_erasure, record_removal
from engram_api.storage.faiss.feed import entry_of, vectors_from_feed
from engram_api.storage.faiss.files import Kind, UserIndex
from engram_api.storage.faiss.keeper import Feed, IndexKeeper
from engram_api.storage.graph.contract import Fence, GraphStore
from engram_api.storage.writer.changes import forget_changes, mark_changed
from engram_api.versions import ABSENT, Stamp, new_epoch, publish_stamp, read_stamp

if TYPE_CHECKING:
    import redis

    from engram_api.storage.writer.lease import Lease

__all__ = ["UserWrite", "UserWrites", "replanned"]

log = logging.getLogger("engram.writer")

_T = TypeVar("_T")
# Re-plans after a refused (fenced) write before giving up with UserBusyError: each one means another
# writer committed for this user meanwhile, so a handful only happens under pathological contention.
_ATTEMPTS = 5


class UserWrite:
    """An open write of one user (see the module docstring); made by ``UserWrites.open``."""

    def __init__(
        self, owner: UserWrites, user_id: str, lease: Lease | None, fence: Fence, *, none_published: bool = False
    ) -> None:
        self._owner = owner
        # ``open`` read the published stamp under this lease and found none: no lost lifetime to erase.
        self._none_published = none_published
        self.user_id = user_id
        self.lease = lease
        self._fence = fence
        self.before = fence.expected
        self.feed_with_next_write(True)

    def feed_with_next_write(self, wanted: bool) -> None:
        """Whether the store's next write statement also reads what this write changed since ``before``
        (the change feed's entry, ``Fence.changes_since``; on by default): a batch asks it of its last
        member only, whose read covers every member."""
        wanted = wanted and self._owner.redis is not None and self.before != ABSENT
        self._fence.changes_since = self.before.version if wanted else None

    @property
    def stamp(self) -> Stamp:
        """The user's stamp after this write's committed graph transactions so far."""
        return self._fence.expected

    def index(self) -> UserIndex:
        """The user's FAISS index at the stamp the plan is built on. A copy behind it (another host wrote
        last) is caught up from the change feed that writer published with its stamp (one Redis round trip),
        the graph read only when the feed cannot bring it there."""
        return self._owner.keeper.current(self.user_id, self.before, feed=self._feed())

    def _feed(self) -> Feed | None:
        """The user's changes since a version from the change feed in Redis (None without Redis)."""
        redis_client = self._owner.redis
        return None if redis_client is None else partial(vectors_from_feed, redis_client, self.user_id)

    def finish(
        self,
        *,
        upserts: Iterable[tuple[str, Kind, Sequence[float]]] = (),
        removals: Iterable[str] = (),
        changed: bool = True,
        states: Mapping[str, bytes] | None = None,
    ) -> Stamp:
        """Bring the index, the published stamp and the caches to the graph's state after this write.
        ``changed=False``: a maintenance write no maintenance job needs to look at again (``changes``);
        ``states``: the packed token states of the upserted records that have them (as the graph holds)."""
        owner, user_id, after = self._owner, self.user_id, self.stamp
        removals = tuple(removals)
        if after == ABSENT and self.before != ABSENT and owner.redis is not None:
            # The graph erased the user: every host's files go (``erasure``), whoever holds the lease now.
            record_erasure(owner.redis, user_id, self.before.epoch)
        elif removals and owner.redis is not None:
            record_removal(owner.redis, user_id)  # every process's encoder cache: the user's texts go at its sweep
        if self.lease is not None and not self.lease.held() and not self._retake(after):
            owner.drop_caches(user_id)  # another writer owns the user now: its finish covers ours
            return after
        owner.keeper.advance(
            user_id,
            from_stamp=self.before,
            to_stamp=after,
            upserts=upserts,
            removals=removals,
            feed=self._feed(),
            states=states,
        )
        if owner.redis is not None:
            if self.before == ABSENT and not self._none_published:
                self._erase_lost_lifetime(after)
            if after == ABSENT:
                owner.redis.delete(keys.user_version(user_id), keys.change_feed(user_id))
                forget_changes(owner.redis, user_id)
            else:
                entry, scrub = self._feed_entry(after, removed=bool(removals), changed=changed)
                publish_stamp(
                    owner.redis, user_id, after, lease_token=self.lease.token if self.lease else None, entry=entry,
                    scrub=scrub,
                )  # fmt: skip
                if changed and after != self.before:  # a write that committed nothing changed nothing
                    mark_changed(owner.redis, user_id)
        owner.drop_caches(user_id)
        self.before = after
        self._fence.changes = None
        self.feed_with_next_write(True)
        return after

    def _erase_lost_lifetime(self, after: Stamp) -> None:
        """This write opened on a user the graph did not hold: a stamp still published is of a lifetime the graph
        lost without its writer's ``finish`` (a ``forget_user`` killed after its commit: its ``finish`` deletes
        the stamp), whose erasure is filed now as that ``finish`` would have, before the stamp is deleted or
        replaced (so every host's sweep deletes that lifetime's files and texts). One GET, once per lifetime,
        none when ``open`` already read that no stamp was published (the apply stage's first attempt).
        Called under the lease (held, or taken again with the graph still at ``after``): no other writer
        publishes meanwhile, and a lifetime live when the lease was taken would have been read at ``open``,
        so the stamp is a dead one; the tombstone (that epoch and earlier) spares ``after``'s lifetime."""
        redis_client = self._owner.redis
        assert redis_client is not None
        lost = read_stamp(redis_client, self.user_id)
        if lost is not None and lost != ABSENT and lost.epoch != after.epoch:
            record_erasure(redis_client, self.user_id, lost.epoch)

    def _feed_entry(self, after: Stamp, *, removed: bool, changed: bool) -> tuple[str, bool]:
        """This write's change-feed entry and whether to delete the feed's earlier entries
        (``engram_api.storage.faiss.feed``): the graph's ``user_changes`` since the stamp before, as the last
        write statement read them (Neo4j, ``Fence.changes``) or read now, under the lease, right after the
        commit. A write that removed records scrubs and adds its entry (the removed ids with what it wrote),
        so a reader one write behind still catches up from Redis; one that says nothing of what it changed
        or starts a lifetime scrubs with no entry. One that committed nothing adds none, and scrubs when it
        files removals: a fix of what a writer that died before its ``finish`` left (reconcile, reindex)
        removes records that earlier entries may still hold."""
        before = self.before
        if after == before:
            return "", removed
        if not changed or before == ABSENT or before.epoch != after.epoch:
            return "", True
        changes = self._fence.changes  # read by the write statement itself, when the store could
        if changes is None or self._fence.changes_since != before.version or changes.vectors.stamp != after:
            try:
                changes = self._owner.graph.user_changes(self.user_id, before.version)
            except EngramError as exc:  # committed already: readers then read the graph (the chain has a gap)
                log.warning("change feed entry of %s not read: %s", self.user_id, exc)
                return "", removed
        entry, scrub = entry_of(before, after, changes)
        return entry, scrub or removed

    def _retake(self, after: Stamp) -> bool:
        """The lease lapsed after our commit: take a new one; finish only if nobody wrote since."""
        assert self.lease is not None and self._owner.redis is not None
        from engram_api.storage.writer.lease import Lease

        lease = Lease(self._owner.redis, self.user_id, ttl=self.lease.ttl, wait=self.lease.wait)
        try:
            lease.acquire()
        except UserBusyError:
            return False
        self.lease.release()
        self.lease = lease
        return self._owner.graph.user_stamp(self.user_id) == after


class UserWrites:
    """Opens ``UserWrite``s for one process (a worker, a reader, a maintenance run)."""

    def __init__(
        self,
        *,
        graph: GraphStore,
        keeper: IndexKeeper,
        redis_client: redis.Redis | None,
        lease_ttl_s: float,
        on_change: Sequence[Callable[[str], None]] = (),
    ) -> None:
        self.graph = graph
        self.keeper = keeper
        self.redis = redis_client
        self.lease_ttl_s = lease_ttl_s
        self.on_change = list(on_change)

    def drop_caches(self, user_id: str) -> None:
        for drop in self.on_change:
            drop(user_id)

    @contextlib.contextmanager
    def open(self, user_id: str, *, wait: float, published: bool = False) -> Iterator[UserWrite]:
        """Lease (raises ``UserBusyError`` after ``wait`` seconds), stamp, fence; released on exit.
        ``published``: fence on the stamp published in Redis when there is one (see the module docstring)."""
        lease = None
        if self.redis is not None:
            # Imported with a Redis client only: the lease (and redis) are nothing to a stopped embedded fleet.
            from engram_api.storage.writer.lease import Lease

            lease = Lease(self.redis, user_id, ttl=self.lease_ttl_s, wait=wait).acquire()
        write: UserWrite | None = None
        try:
            stamp = self._published(user_id) if published else None
            none_published = published and self.redis is not None and stamp is None
            if stamp is None:
                stamp = self.graph.user_stamp(user_id)
            epoch = stamp.epoch if stamp != ABSENT else new_epoch()
            with self.graph.fenced(user_id, stamp, epoch) as fence:
                write = UserWrite(self, user_id, lease, fence, none_published=none_published)
                yield write
        finally:
            held = write.lease if write is not None else lease
            if held is not None:
                held.release()

    def _published(self, user_id: str) -> Stamp | None:
        return read_stamp(self.redis, user_id) if self.redis is not None else None

    def run(self, user_id: str, body: Callable[[UserWrite], _T], *, wait: float, published: bool = False) -> _T:
        """``body`` under ``open``, planned again from fresh reads when a fenced write is refused.
        ``published``: the first attempt is fenced on the published stamp, every re-plan on the graph's."""
        return replanned(
            user_id, lambda attempt: self.open(user_id, wait=wait, published=published and attempt == 0), body
        )


def replanned(
    user_id: str,
    open_write: Callable[[int], contextlib.AbstractContextManager[UserWrite]],
    body: Callable[[UserWrite], _T],
    *,
    attempts: int = _ATTEMPTS,
) -> _T:
    """The re-plan loop of every writer: ``body`` inside ``open_write(attempt)`` (attempt 0, 1, ...), planned
    again from fresh reads when its fenced write is refused (``StaleWriteError``: another writer committed
    for the user since the write opened), after dropping the process's caches of the user. ``UserBusyError``
    after ``attempts`` refusals."""
    for attempt in range(attempts):
        opened: UserWrite | None = None
        try:
            with open_write(attempt) as opened:
                return body(opened)
        except StaleWriteError:
            log.info("write of user %s refused by the fence; planning again", user_id)
            if opened is not None:
                opened._owner.drop_caches(user_id)
    raise UserBusyError(user_id)
