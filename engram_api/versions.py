"""A user's version stamp: (epoch, version), bumped by every writer, compared by every cache.

Invariants:
- ``version`` counts the writes of one *lifetime* of a user: it restarts at 1 after ``forget_user``.
  ``epoch`` names the lifetime: chosen fresh (microseconds since 1970 plus random low bits) when the
  graph creates the user, so two lifetimes never share a stamp and nothing keyed by a stamp (the FAISS
  file header, the Redis published stamp, the reader's result cache, the index cache) can mistake a
  forgotten lifetime's data for the current one's.
- ``ABSENT`` (0, 0) is a user the graph does not hold. A user stored before epochs existed reads as
  epoch 0 with a version >= 1, which still differs from every later lifetime.
- The published stamp in Redis only moves forward (epochs are time-ordered), and only the lease holder
  publishes (see ``engram_api.storage.writer.userwrite``): a writer that lost its lease cannot roll readers back.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, NamedTuple

from engram_api import keys

if TYPE_CHECKING:
    import redis

__all__ = ["ABSENT", "Stamp", "new_epoch", "outdated", "publish_stamp", "read_stamp"]


class Stamp(NamedTuple):
    """Ordered lexicographically: a later lifetime is newer than any version of an earlier one."""

    epoch: int
    version: int

    def __str__(self) -> str:
        return f"{self.epoch}:{self.version}"

    @classmethod
    def parse(cls, raw: str | bytes) -> Stamp:
        text = raw.decode() if isinstance(raw, bytes) else raw
        epoch, _, version = text.partition(":")
        return cls(int(epoch), int(version)) if version else cls(0, int(epoch))


ABSENT = Stamp(0, 0)


def outdated(kept: Stamp, learned: Stamp) -> bool:
    """Whether what was read at ``kept`` is past use once the user's stamp is learned to be ``learned``: it
    is older, or the user is absent now (``forget_user`` leaves ``ABSENT``, below every stamp it erased)."""
    return kept != learned and (kept < learned or learned == ABSENT)


def new_epoch() -> int:
    """Fresh lifetime id: time-ordered (µs) with 10 random low bits; fits a signed 64-bit integer."""
    return (time.time_ns() // 1000) << 10 | secrets.randbits(10)


def publish_stamp(
    client: redis.Redis,
    user_id: str,
    stamp: Stamp,
    *,
    lease_token: str | None = None,
    entry: str = "",
    scrub: bool = False,
) -> bool:
    """Publish ``stamp`` if it is newer than the published one, and send it on the stamps channel (readers'
    hint, ``keys.stamps_channel``); with ``lease_token``, only while that token still holds the user's lease
    (checked atomically, ``controls.PUBLISH_STAMP``). False when the lease was lost. ``entry``: this write's
    change-feed entry, added with the stamp; ``scrub``: delete the user's change feed first (whatever the
    lease says), ``engram_api.storage.faiss.feed``."""
    # Imported here: a read (stats, history) that never publishes must not load the ledger and redis-py.
    from engram_api.ledger.controls import PUBLISH_STAMP, StampArgs, StampKeys
    from engram_api.storage.faiss.feed import FEED_LENGTH, FEED_TTL_S

    done = PUBLISH_STAMP(
        client,
        StampKeys(stamp=keys.user_version(user_id), lease=keys.apply_lock(user_id), feed=keys.change_feed(user_id)),
        StampArgs(
            epoch=str(stamp.epoch), version=str(stamp.version), lease_token=lease_token or "",
            channel=keys.stamps_channel(), user_id=user_id, scrub="1" if scrub else "", entry=entry,
            feed_length=FEED_LENGTH, feed_ttl_ms=int(FEED_TTL_S * 1000),
        ),
    )  # fmt: skip
    return bool(done)


def read_stamp(client: redis.Redis, user_id: str) -> Stamp | None:
    raw = client.get(keys.user_version(user_id))
    return Stamp.parse(raw) if raw is not None else None
