"""Erasure in Redis: every trace of a forgotten message (or user), and the tombstone that keeps it gone.

Invariant: a forgotten message leaves nothing in Redis (payload, stored extraction, status, delivery
counters, dead letter) and, for ``status_ttl_s`` (longer than any payload lives), a tombstone that every
write for the message checks atomically (the ``STAGE_WRITE`` and ``DEAD_LETTER`` scripts of
``engram_api.ledger.scripts``; ``ENQUEUE`` alone removes it: a message id enqueued again is new): an extract that
was already running when ``forget`` came cannot write its extraction, status or dead letter back. The
tombstone is set before anything is deleted, so there is no window in between.

Deleting a key does not take its bytes off the disk: the AOF still holds every command that wrote the
message text, and an RDB snapshot taken before holds the value. ``purge_redis`` is the last step of every
erasure (``Reader.forget`` / ``forget_user`` run it): it rewrites the AOF (and, when the server takes RDB
snapshots, writes a fresh one) and waits until the files that held the erased text are replaced.
Concurrent erasures share rewrites: one that finds a rewrite running waits for it and starts another,
since the running one may have forked before its deletes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.errors import StoreUnavailableError
from engram_api.ledger.deadletters import members, unfile
from engram_api.models import check_message_id, check_user_id

if TYPE_CHECKING:
    import redis

__all__ = ["erase_message", "erase_user", "purge_redis"]

_POLL_S = 0.05


_PAGE = 500


def _message_keys(user_id: str, message_id: str) -> list[str]:
    return [
        keys.message_payload(user_id, message_id),
        keys.extraction(user_id, message_id),
        keys.status(user_id, message_id),
        *(keys.deliveries(user_id, message_id, stage) for stage in keys.STAGES),
    ]


def erase_message(client: redis.Redis, user_id: str, message_id: str, *, tombstone_ttl_s: int) -> None:
    """Tombstone, then delete every Redis key of one message and its dead letter (one transaction)."""
    check_user_id(user_id)
    check_message_id(message_id)
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.forgotten(user_id, message_id), "1", ex=tombstone_ttl_s)
    pipe.delete(*_message_keys(user_id, message_id))
    unfile(pipe, user_id, [message_id])
    pipe.zrem(keys.user_messages(user_id), message_id)
    pipe.zrem(keys.pending(user_id), message_id)
    pipe.zrem(keys.ready(user_id), message_id)
    pipe.zrem(keys.in_flight(), keys.message_ref(user_id, message_id))
    pipe.zrem(keys.in_flight_extracted(), keys.message_ref(user_id, message_id))
    pipe.execute()


def erase_user(client: redis.Redis, user_id: str, *, tombstone_ttl_s: int) -> int:
    """Tombstone every message of the user Redis still knows, then delete all the user's keys.

    Returns how many messages were tombstoned. Messages are found by the user's indexes, never by
    scanning the keyspace: ``keys.user_messages`` and ``keys.pending`` (every message with a key left:
    the backlog holds it from its enqueue until it finishes, the index from its first stage on) and
    ``keys.user_dead_letters``; recall logs by ``keys.recall_logs``.
    So the cost follows the user's message count. Keys written before those indexes existed are found
    only after ``engram ledger reindex`` (``engram_api.ledger.reindex``) has run once.
    """
    check_user_id(user_id)
    letters = members(client, keys.user_dead_letters(user_id))
    indexed = (*members(client, keys.user_messages(user_id)), *members(client, keys.pending(user_id)))
    message_ids = sorted(set(indexed) | set(letters))
    recalls = members(client, keys.recall_logs(user_id))
    for start in range(0, len(message_ids), _PAGE):
        chunk = message_ids[start : start + _PAGE]
        pipe = client.pipeline(transaction=False)
        for message_id in chunk:
            pipe.set(keys.forgotten(user_id, message_id), "1", ex=tombstone_ttl_s)
        refs = [keys.message_ref(user_id, m) for m in chunk]
        pipe.zrem(keys.in_flight(), *refs)
        pipe.zrem(keys.in_flight_extracted(), *refs)
        pipe.execute()
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(message_ids), _PAGE):
        pipe.delete(*(key for m in message_ids[start : start + _PAGE] for key in _message_keys(user_id, m)))
    for start in range(0, len(recalls), _PAGE):
        pipe.delete(*(keys.recall_log(user_id, r) for r in recalls[start : start + _PAGE]))
    unfile(pipe, user_id, letters)
    pipe.delete(*keys.user_keys(user_id))
    pipe.execute()
    return len(message_ids)


def _wait_idle(client: redis.Redis, deadline: float, what: str) -> None:
    """Until Redis has no persistence child running or scheduled (it allows one at a time)."""
    while True:
        info = client.info("persistence")
        if not any(info.get(f) for f in ("aof_rewrite_in_progress", "rdb_bgsave_in_progress", "aof_rewrite_scheduled")):
            return
        if time.monotonic() > deadline:
            raise StoreUnavailableError(
                f"Redis did not finish {what} in time: the erased data stays in its files until it does "
                '(run the erasure again, or see docs/operations.md "Data retention and erasure")'
            )
        time.sleep(_POLL_S)


# command -> (its INFO persistence status field, what it is)
_BACKGROUND = {
    "BGREWRITEAOF": ("aof_last_bgrewrite_status", "the AOF rewrite"),
    "BGSAVE": ("rdb_last_bgsave_status", "the RDB snapshot"),
}


def _rewrite(client: redis.Redis, command: str, deadline: float) -> None:
    """Start a background rewrite that forks after this call (waiting out one already running), then wait
    for it and check it succeeded."""
    import redis

    status_field, what = _BACKGROUND[command]
    while True:
        try:
            client.execute_command(command)
            break
        except redis.ResponseError as exc:
            # "already in progress" (it may have forked before our deletes) or, for BGSAVE, an AOF rewrite
            # holding the one child Redis allows: wait for that one, then start ours.
            if "progress" not in str(exc):
                raise
            _wait_idle(client, deadline, what)
    _wait_idle(client, deadline, what)
    status = client.info("persistence").get(status_field)
    if status != "ok":
        raise StoreUnavailableError(f"Redis failed {what} (status {status!r}); see the Redis log")


def purge_redis(client: redis.Redis, *, timeout_s: float) -> list[str]:
    """Replace the Redis files that may hold erased data; returns what was rewritten ("aof", "rdb").

    The AOF is rewritten when it is on; a new RDB snapshot is written when the server is configured to take
    snapshots (``save`` not empty: Redis's default, and compose's). A server whose CONFIG command is
    disabled (managed Redis) is asked for the AOF only: its snapshots and backups are the operator's part.
    """
    import redis

    deadline = time.monotonic() + timeout_s
    done: list[str] = []
    if client.info("persistence").get("aof_enabled"):
        _rewrite(client, "BGREWRITEAOF", deadline)
        done.append("aof")
    try:
        snapshots = bool(str(client.config_get("save").get("save", "")).strip())
    except redis.ResponseError:
        snapshots = False
    if snapshots:
        _rewrite(client, "BGSAVE", deadline)
        done.append("rdb")
    return done
