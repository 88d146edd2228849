"""Erasure in Redis: every trace of a forgotten message (or user), and the tombstone that keeps it gone.

Invariant: a forgotten message leaves nothing in Redis (payload, stored extraction, status, delivery
counters, dead letter) and, for ``status_ttl_s`` (longer than any payload lives), a tombstone that every
stage write checks atomically (``stage_write`` in the workers, ``DeadLetterStore.put``): an extract that
was already running when ``forget`` came cannot write its extraction, status or dead letter back. The
tombstone is set before anything is deleted, so there is no window in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.models import check_message_id, check_user_id

if TYPE_CHECKING:
    import redis

__all__ = ["erase_message", "erase_user"]


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
    pipe.hdel(keys.dead_letters(), keys.dead_letter_field(user_id, message_id))
    pipe.zrem(keys.pending(user_id), message_id)
    pipe.zrem(keys.ready(user_id), message_id)
    pipe.execute()


def erase_user(client: redis.Redis, user_id: str, *, tombstone_ttl_s: int) -> int:
    """Tombstone every message of the user Redis still knows, then delete all the user's keys.

    Returns how many messages were tombstoned. Messages are found by their status, payload and
    extraction keys and their dead letters: a message in flight has at least one of them.
    """
    check_user_id(user_id)
    message_ids: set[str] = set()
    for prefix in (keys.STATUS_PREFIX, f"{keys.PREFIX}:msg:", f"{keys.PREFIX}:extraction:"):
        for key in client.scan_iter(match=f"{prefix}{user_id}:*", count=500):
            message_ids.add(key[len(prefix) + len(user_id) + 1 :])
    letter_prefix = keys.dead_letter_field(user_id, "")
    letters = [f for f in client.hkeys(keys.dead_letters()) if f.startswith(letter_prefix)]
    message_ids.update(f[len(letter_prefix) :] for f in letters)
    pipe = client.pipeline(transaction=False)
    for message_id in message_ids:
        pipe.set(keys.forgotten(user_id, message_id), "1", ex=tombstone_ttl_s)
    pipe.execute()
    doomed = [keys.user_version(user_id)]
    for pattern in keys.user_keys_pattern(user_id):
        doomed.extend(client.scan_iter(match=pattern, count=500))
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(doomed), 500):
        pipe.delete(*doomed[start : start + 500])
    if letters:
        pipe.hdel(keys.dead_letters(), *letters)
    pipe.execute()
    return len(message_ids)
