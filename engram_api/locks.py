"""One writer per user across the whole fleet.

A Redis lease (redis-py's ``Lock``: random token, compare-and-delete release) with a TTL. When the holder
dies the lease simply expires after ``ttl`` seconds and the next task for that user proceeds; a holder
that outlives its lease cannot release someone else's lock (token check). The graph write itself is
idempotent by message id, so even a lease lost mid-write cannot apply a message twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress

import redis
from redis.exceptions import LockError

from engram_api import keys
from engram_api.errors import UserBusyError

__all__ = ["user_lock"]


@contextmanager
def user_lock(client: redis.Redis, user_id: str, *, ttl: float, wait: float = 0.5) -> Iterator[None]:
    lock = client.lock(keys.apply_lock(user_id), timeout=ttl, blocking_timeout=wait, thread_local=False)
    if not lock.acquire(blocking=wait > 0):
        raise UserBusyError(user_id)
    try:
        yield
    finally:
        # LockError: the lease expired while we worked; the next holder already owns it.
        with suppress(LockError):
            lock.release()
