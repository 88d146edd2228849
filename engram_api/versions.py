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

__all__ = ["ABSENT", "Stamp", "new_epoch", "publish_stamp", "read_stamp"]


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


def new_epoch() -> int:
    """Fresh lifetime id: time-ordered (µs) with 10 random low bits; fits a signed 64-bit integer."""
    return (time.time_ns() // 1000) << 10 | secrets.randbits(10)


# KEYS: stamp key, lease key. ARGV: epoch, version, lease token ('' = no lease to check), the stamps channel,
# the user id. Numbers are compared as decimal strings (length, then text): epochs exceed Lua's exact integer
# range. A stamp that moved forward is also sent on the channel (readers' hint, ``keys.stamps_channel``).
_PUBLISH = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
local function less(a, b) return #a < #b or (#a == #b and a < b) end
local cur = redis.call('GET', KEYS[1])
if cur then
  local e, v = string.match(cur, '^(%d+):(%d+)$')
  if e and (less(ARGV[1], e) or (ARGV[1] == e and not less(v, ARGV[2]))) then return 1 end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5] .. ' ' .. ARGV[1] .. ':' .. ARGV[2])
return 1
"""


def publish_stamp(client: redis.Redis, user_id: str, stamp: Stamp, *, lease_token: str | None = None) -> bool:
    """Publish ``stamp`` if it is newer than the published one; with ``lease_token``, only while that
    token still holds the user's lease (checked atomically). False when the lease was lost."""
    done = client.eval(
        _PUBLISH, 2, keys.user_version(user_id), keys.apply_lock(user_id), str(stamp.epoch), str(stamp.version),
        lease_token or "", keys.stamps_channel(), user_id,
    )  # fmt: skip
    return bool(done)


def read_stamp(client: redis.Redis, user_id: str) -> Stamp | None:
    raw = client.get(keys.user_version(user_id))
    return Stamp.parse(raw) if raw is not None else None
