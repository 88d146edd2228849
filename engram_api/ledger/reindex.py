"""Once, after upgrading to the per-user indexes: index what Redis holds from before them.

``erase_user`` finds a user's messages, dead letters and recall logs by indexes the writing scripts
keep (``keys.user_messages``, ``keys.user_dead_letters``, ``keys.recall_logs``); it never scans. Keys
written by an older Engram are in no index, so an erasure would leave them. ``reindex`` (``engram ledger
reindex``) SCANs the keyspace once for them, files each in its user's index, and moves the dead letters
of the old single hash (``keys.legacy_dead_letters``) to one key each. Run it once after the upgrade,
with the workers stopped or running (every write is idempotent: a message already indexed is indexed
again at a later time, which only keeps its entry longer).

Invariants:
- A message found by its keys is indexed at the time of the reindex: its keys' TTLs were set before, so
  the entry outlives them (what the index requires, see ``engram_api.ledger.scripts``).
- A legacy letter is written to its own key and both indexes before the hash field is deleted, in one
  MULTI per page: a crash in between leaves the letter in both places, never in neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from engram_api import keys
from engram_api.models import DeadLetter

if TYPE_CHECKING:
    import redis

__all__ = ["ReindexReport", "reindex"]

_PAGE = 500
# A recall log lives a day (engram_api.reader.background); its index entry at least as long.
_RECALL_INDEX_TTL_S = 24 * 3600


class ReindexReport(BaseModel):
    messages: int = Field(0, description="per-message keys found and filed in their user's index")
    recall_logs: int = Field(0, description="recall logs found and filed in their user's index")
    dead_letters: int = Field(0, description="dead letters moved from the old single hash to their own keys")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _index_keys(client: redis.Redis, prefix: str, index: Callable[[str], str], ttl_s: int) -> int:
    """File every ``<prefix><user_id>:<id>`` key's id in ``index(user_id)``; how many keys were found."""
    found = 0
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(match=f"{prefix}*", count=_PAGE):
        user_id, _, item = _text(key)[len(prefix) :].partition(":")  # user ids never contain ':'
        pipe.zadd(index(user_id), {item: time.time()})
        pipe.expire(index(user_id), ttl_s)
        found += 1
        if len(pipe) >= 2 * _PAGE:
            pipe.execute()
    pipe.execute()
    return found


def _move_letters(client: redis.Redis) -> int:
    legacy = keys.legacy_dead_letters()
    letters = list(client.hscan_iter(legacy, count=_PAGE))  # a letter is small; the hash is read once
    for start in range(0, len(letters), _PAGE):
        pipe = client.pipeline(transaction=True)
        for field, raw in letters[start : start + _PAGE]:
            letter = DeadLetter.model_validate_json(raw)
            uid, mid, failed_at = letter.user_id, letter.message_id, letter.failed_at.timestamp()
            pipe.set(keys.dead_letter(uid, mid), raw)
            pipe.zadd(keys.user_dead_letters(uid), {mid: failed_at})
            pipe.zadd(keys.dead_letters(), {keys.message_ref(uid, mid): failed_at})
            pipe.hdel(legacy, field)
        pipe.execute()
    return len(letters)


def reindex(client: redis.Redis, *, status_ttl_s: int) -> ReindexReport:
    """Index every per-message key and recall log, and move the old hash's dead letters (see module)."""
    report = ReindexReport()
    for prefix in keys.message_key_prefixes():
        report.messages += _index_keys(client, prefix, keys.user_messages, status_ttl_s)
    report.recall_logs = _index_keys(client, keys.RECALL_PREFIX, keys.recall_logs, _RECALL_INDEX_TTL_S)
    report.dead_letters = _move_letters(client)
    return report
