"""One writer per user across the whole fleet: a renewed Redis lease.

A Redis lease (redis-py's ``Lock``: random token, compare-and-delete release) with a TTL, renewed by a
background thread every third of the TTL while the holder works, so a long write (a big user's index
rebuild, Neo4j retries, a slow embed) keeps it. When the holder dies the lease expires after ``ttl``
seconds and the next writer proceeds. A holder that stalls past its TTL (a paused process, a partition)
can still lose it: the lease alone is therefore not trusted for correctness. ``UserWrite`` fences every
graph write on the user's stamp and checks ``held()`` before its non-transactional steps.
"""

from __future__ import annotations

import threading
from contextlib import suppress

import redis
from redis.exceptions import LockError

from engram_api import keys
from engram_api.errors import UserBusyError

__all__ = ["Lease"]


class Lease:
    """``with Lease(...)``: the user's write lease, renewed until released."""

    def __init__(self, client: redis.Redis, user_id: str, *, ttl: float, wait: float) -> None:
        self.user_id = user_id
        self.ttl = ttl
        self.wait = wait
        self._lock = client.lock(keys.apply_lock(user_id), timeout=ttl, blocking_timeout=wait, thread_local=False)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.renewals = 0  # observable by tests

    @property
    def token(self) -> str | None:
        raw = self._lock.local.token
        return raw.decode() if isinstance(raw, bytes) else raw

    def acquire(self) -> Lease:
        if not self._lock.acquire(blocking=self.wait > 0):
            raise UserBusyError(self.user_id)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"lease-{self.user_id}", daemon=True)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self._lock.reacquire()
            except (LockError, redis.RedisError):
                return  # lost (or Redis away): held() says so; the fence keeps the data safe
            self.renewals += 1

    def held(self) -> bool:
        """True when this lease still owns the user's lock (and then its TTL is reset to full)."""
        try:
            self._lock.reacquire()
        except LockError:
            return False
        return True

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        # LockError: the lease expired while we worked; the next holder already owns it.
        with suppress(LockError):
            self._lock.release()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
