"""The reader's result cache and its threads: what a recall keeps, and the store and Redis work it need
not wait for where it is.

Invariants:
- a cached result is only served at the user stamp it was computed at and within its TTL; bounded LRU;
- a recall runs its query's model call on its own thread, and what needs no vector (the stamp, the
  catch-up, the keyword search, the weights: ``RecallReader._begin``) on a reader thread beside it, let go
  only once the recall's thread enters the model (ONNX Runtime's ``run``, which lets go of the GIL). The
  model call is made ready first (tokens, feed) on the recall's thread, which keeps the GIL until ``run``:
  so the encoder's path takes the GIL back once, after the model, instead of waiting for it (up to a switch
  interval each time) behind that Python between its own steps. The store's keyword search (SQLite's
  full-text index, Neo4j over Bolt) runs on a reader thread of its own, where it waits for the store
  without the GIL; a held snapshot's, in-memory Python, runs within ``_begin`` (a thread of its own would
  only take turns with it for the GIL), unless it must wait for the user's catch-up: then on a reader
  thread after it;
- no job waits for a job submitted after it (a keyword search waits only for a catch-up submitted before it;
  ``_begin`` waits only for the recall's thread to enter the model, which it does right after submitting
  it, and for no job), so the bounded pool cannot starve;
- the recall log is written on a reader thread after the result is returned (a Redis round trip, ~0.6 ms
  of a ~20 ms recall, measured; one script, ``ledger.controls.LOG_RECALL``), serialized by the caller so almost no Python is left there to compete for
  the GIL; ``wait_logged`` lets this process's ``feedback`` wait for it;
- work nobody waits for (a recall log, a user's snapshot load) is tracked until done: ``flush`` waits for
  it, so a caller that closes the stores after it never closes them under a thread still using them;
- work that may wait for the process to be idle (the fold of a held snapshot a catch-up or a refresh off the
  path made due: ``when_idle``) starts once no recall of any reader of this process is in flight
  (``recalling``), and at the latest ``deadline_s`` (``ENGRAM_SNAPSHOT_FOLD_DEADLINE_S``) after it was handed
  over, recalls or not; ``flush`` starts it at once and waits for it.
  Why: the fold copies the user's snapshot (~5-25 ms of a reader thread at 10K facts, 0.2-0.3 s at 100K),
  holding the GIL between numpy calls, and the threads of a process share one GIL: started beside a recall
  (the recall that caught the removal up, or the next one), it took turns with that recall's Python. No
  recall waits for it (a recall never looks at the idle gate but to count itself in and out);
- the threads are made at first use and again in a forked child, whose copy has no threads behind it (nor
  the parent's writes in flight); ``close`` waits for the work in flight and ends them, so a closed reader
  leaves no thread behind (the pool's threads are not daemons: a process exits only once they end).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engram_api import keys
from engram_api.settings.recall import RecallSettings
from engram_api.versions import Stamp, outdated

if TYPE_CHECKING:
    import redis

__all__ = ["ReaderThreads", "ResultCache"]

RECALL_LOG_TTL_S = 24 * 3600
# The longest work handed to ``when_idle`` waits for the process's recalls to pause, for threads made without
# settings: the setting's default (a reader passes ``ENGRAM_SNAPSHOT_FOLD_DEADLINE_S``).
_DEADLINE_S: float = RecallSettings.model_fields["snapshot_fold_deadline_s"].default


class ResultCache:
    """Small LRU of results, each tagged with the user stamp it was computed at (a key's first item is its
    user). Thread-safe.

    Invariants: bounded (``size`` entries, least recently used dropped first); a result is served only at its
    stamp and within its TTL, and one found past either (kept at a stamp ``outdated`` by the one asked, or
    expired) is dropped then; ``drop_outdated`` drops a user's results kept at stamps outdated by one learned
    (another host's forget or ``forget_user`` moved it: their texts go with them), in O(those results)
    through a per-user index of keys by stamp that always names exactly the keys held."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._data: OrderedDict[tuple[Any, ...], tuple[Stamp, float, Any]] = OrderedDict()
        self._by_user: dict[Any, dict[Stamp, set[tuple[Any, ...]]]] = {}  # user -> stamp -> keys held at it
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], version: Stamp) -> Any | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and entry[0] == version and entry[1] >= time.monotonic():
                self._data.move_to_end(key)
                return entry[2]
            if entry is not None and (outdated(entry[0], version) or entry[1] < time.monotonic()):
                self._pop(key)  # never served again: not kept either (a newer stamp's is, for the newer reads)
            return None

    def holds(self, key: tuple[Any, ...]) -> bool:
        """Whether a result is kept under ``key``, at any stamp (fresh or not)."""
        with self._lock:
            return key in self._data

    def put(self, key: tuple[Any, ...], version: Stamp, ttl: float, value: Any) -> None:
        with self._lock:
            if key in self._data:
                self._pop(key)
            self._data[key] = (version, time.monotonic() + ttl, value)
            self._by_user.setdefault(key[0], {}).setdefault(version, set()).add(key)
            while len(self._data) > self.size:
                self._pop(next(iter(self._data)))

    def drop_outdated(self, user_id: str, stamp: Stamp) -> None:
        """Drop the user's results kept at stamps ``outdated`` by ``stamp`` (older, or any once the user is
        absent); costs a lookup when there are none."""
        with self._lock:
            stamps = self._by_user.get(user_id)
            if stamps is None:
                return
            for old in [s for s in stamps if outdated(s, stamp)]:
                for key in stamps.pop(old):
                    del self._data[key]
            if not stamps:
                del self._by_user[user_id]

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            for keys_at in self._by_user.pop(user_id, {}).values():
                for key in keys_at:
                    del self._data[key]

    def users(self) -> set[str]:
        with self._lock:
            return set(self._by_user)

    def _pop(self, key: tuple[Any, ...]) -> None:
        """Drop ``key``'s result and its index entry (call with the lock held)."""
        version = self._data.pop(key)[0]
        stamps = self._by_user[key[0]]
        keys_at = stamps[version]
        keys_at.discard(key)
        if not keys_at:
            del stamps[version]
            if not stamps:
                del self._by_user[key[0]]


class Timer(Protocol):
    """A started one-shot timer (``threading.Timer``'s part ``when_idle`` uses)."""

    def cancel(self) -> None: ...


def _timer(delay_s: float, fn: Callable[[], None]) -> Timer:
    """``fn`` on a daemon thread after ``delay_s`` (one that never keeps a process from exiting)."""
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()
    return timer


@dataclass(eq=False, slots=True)
class _Deferred:
    """Work waiting for the process's recalls to pause (``ReaderThreads.when_idle``), and its deadline."""

    threads: ReaderThreads
    fn: Any
    args: tuple[Any, ...]
    deadline: Timer | None = None

    def start(self) -> None:
        """Hand it to its reader's threads (taken off the waiting list by the caller: started once)."""
        if self.deadline is not None:
            self.deadline.cancel()
        self.threads.behind(self.fn, *self.args)


class _Recalls:
    """The recalls in flight in this process, every reader's (they share one GIL), and the work waiting for
    none to be. Thread-safe; a forked child starts with none of either (the parent's threads are not its)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._running = 0
        self._waiting: list[_Deferred] = []

    def _own(self) -> None:
        """Forget the parent's recalls and waiting work in a forked child (call with the lock held)."""
        if self._pid != os.getpid():
            self._pid, self._running, self._waiting = os.getpid(), 0, []

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._own()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._own()
                self._running = max(0, self._running - 1)
                ready, self._waiting = (self._waiting, []) if not self._running else ([], self._waiting)
            for work in ready:
                work.start()

    def wait(self, work: _Deferred) -> bool:
        """Keep ``work`` until no recall is in flight; False (kept not) when none is now."""
        with self._lock:
            self._own()
            if not self._running:
                return False
            self._waiting.append(work)
            return True

    def count(self, which: Callable[[_Deferred], bool]) -> int:
        with self._lock:
            self._own()
            return sum(map(which, self._waiting))

    def take(self, which: Callable[[_Deferred], bool]) -> list[_Deferred]:
        """The waiting work ``which`` accepts, taken off the list (the caller starts it)."""
        with self._lock:
            self._own()
            taken = [w for w in self._waiting if which(w)]
            self._waiting = [w for w in self._waiting if not which(w)]
            return taken


_RECALLS = _Recalls()


@dataclass(frozen=True, slots=True)
class _Threads:
    """One process's threads, and the recall-log writes in flight on them (by recall id)."""

    pid: int
    pool: ThreadPoolExecutor
    logging: dict[str, Future[None]] = field(default_factory=dict)
    behind: set[Future[Any]] = field(default_factory=set)  # other work nobody waits for


class ReaderThreads:
    """A reader's threads, per process (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        threads: int,
        deadline_s: float = _DEADLINE_S,
        timer: Callable[[float, Callable[[], None]], Timer] = _timer,
    ) -> None:
        self.threads = threads
        self.deadline_s = deadline_s
        self._timer = timer  # tests pass one they fire themselves
        self._held: _Threads | None = None
        self._lock = threading.Lock()

    def _current(self) -> _Threads:
        held = self._held
        if held is None or held.pid != os.getpid():
            with self._lock:
                held = self._held
                if held is None or held.pid != os.getpid():
                    pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="engram-recall-io")
                    self._held = held = _Threads(pid=os.getpid(), pool=pool)
        return held

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        return self._current().pool.submit(fn, *args)

    def behind(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on a reader thread; nobody waits for it but ``flush``."""
        held = self._current()
        work = held.pool.submit(fn, *args)
        with self._lock:
            held.behind.add(work)
        work.add_done_callback(held.behind.discard)

    def recalling(self) -> Any:
        """A context a recall runs in: while any recall of this process is in flight, ``when_idle`` work
        waits; the last one out starts it."""
        return _RECALLS.running()

    def when_idle(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on a reader thread once no recall of this process is in flight (at once when
        none is), and at the latest ``deadline_s`` from now; nobody waits for it but ``flush``, which starts
        it at once."""
        work = _Deferred(self, fn, args)
        if not _RECALLS.wait(work):
            work.start()
            return
        # Set once it waits: started before this, its deadline later finds nothing to start.
        work.deadline = self._timer(self.deadline_s, lambda: self._release(lambda w: w is work))

    def waiting(self) -> int:
        """This reader's work handed to ``when_idle`` and not started yet."""
        return _RECALLS.count(lambda w: w.threads is self)

    def _release(self, which: Callable[[_Deferred], bool]) -> bool:
        """Start the waiting work ``which`` accepts now; True if there was any."""
        taken = _RECALLS.take(which)
        for work in taken:
            work.start()
        return bool(taken)

    def log_recall(self, client: redis.Redis, user_id: str, recall_id: str, rows: str) -> None:
        """Write ``rows`` (a recall's log, serialized) after the recall returned (``_write``)."""
        held = self._current()
        write = held.pool.submit(_write, client, user_id, recall_id, rows)
        with self._lock:
            held.logging[recall_id] = write
        write.add_done_callback(lambda _: held.logging.pop(recall_id, None))  # at once if already done

    def wait_logged(self, recall_id: str) -> None:
        """Return once this process's log write of ``recall_id``, if any, is done."""
        writing = self._current().logging.get(recall_id)
        if writing is not None:
            writing.result()

    def flush(self) -> None:
        """Return once every log write and other work this process has in flight is done, the work waiting
        for the process to be idle started at once (``when_idle``), and the work they started meanwhile (a
        catch-up's fold)."""
        while True:
            released = self._release(lambda w: w.threads is self)
            held = self._held
            if held is None or held.pid != os.getpid():
                return  # no threads here (none yet, or a forked child's copy): nothing in flight
            with self._lock:
                pending = [f for f in (*held.logging.values(), *held.behind) if not f.done()]
            if not pending and not released:
                return
            wait(pending)  # their errors are theirs: each logs or suppresses its own

    def close(self) -> None:
        """``flush``, then end this process's threads; a later use makes new ones (as after a fork)."""
        self.flush()
        with self._lock:
            held, self._held = self._held, None
        if held is not None and held.pid == os.getpid():
            held.pool.shutdown(wait=True, cancel_futures=True)  # what nobody waits for and has not started


def _write(client: redis.Redis, user_id: str, recall_id: str, rows: str) -> None:
    """The log and its entry in the user's index of recall logs, in one script (erasure finds the logs by
    that index, never by scanning); the index drops entries older than a log lives and lives as long as
    the newest log."""
    import redis  # only with a client, so loaded already

    from engram_api.ledger.controls import LOG_RECALL, RecallLogArgs, RecallLogKeys

    now = time.time()
    # On a Redis error, feedback for this recall will be refused; recall itself must not fail.
    with suppress(redis.RedisError):
        LOG_RECALL(
            client,
            RecallLogKeys(keys.recall_log(user_id, recall_id), keys.recall_logs(user_id)),
            RecallLogArgs(rows, recall_id, now, now - RECALL_LOG_TTL_S, RECALL_LOG_TTL_S),
        )
