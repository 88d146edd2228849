"""Dead letters: messages the pipeline gave up on, kept for operators until replayed, dropped, forgotten or
pruned.

One key per letter (``keys.dead_letter``), filed by failure time in its user's index
(``keys.user_dead_letters``) and in the fleet-wide one (``keys.dead_letters``). Before, every letter was a
field of one hash, read whole (HVALS) for one user's listing and parsed whole by every prune (issue 45).

Invariants:
- A letter and its two index entries are written together (``scripts.DEAD_LETTER``, which also checks
  the tombstone: never a letter for a forgotten message) and removed together (``unfile`` in one MULTI).
- A user's listing reads that user's index and letters alone; ``prune`` reads only the fleet-wide index's
  members older than the retention, and their letters are never parsed.
- An index member whose letter is gone (only possible for data edited by hand) is skipped by a listing
  and removed by the next prune or erasure of it.
- Letters written before this layout (the hash ``keys.legacy_dead_letters``) are moved here once by
  ``engram ledger reindex`` (``engram_api.ledger.reindex``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.ledger.scripts import DEAD_LETTER, DeadLetterArgs, DeadLetterKeys
from engram_api.models import DeadLetter, check_message_id, check_user_id, utcnow
from engram_api.redaction import redact

if TYPE_CHECKING:
    import redis

__all__ = ["DeadLetterStore", "members", "unfile"]

_PAGE = 1000


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class DeadLetterStore:
    """Dead letters, one key per letter (``keys.dead_letter``) filed by failure time in its user's index
    (``keys.user_dead_letters``) and the fleet-wide one (``keys.dead_letters``); the letter and both
    entries are written and removed together (one script or one MULTI). Every method validates the ids
    it is given; reasons and raw answers are stored redacted. A user's listing reads that user's letters
    alone; ``prune`` (the redelivery sweep) reads only the letters older than
    ``dead_letter_retention_days``. ``Producer.replay`` puts a letter's message back on the queue;
    ``remove`` (``MemoryClient.drop_dead_letter``) discards it."""

    def __init__(self, *, redis_client: redis.Redis, status_ttl_s: int, secrets: Iterable[str | None] = ()) -> None:
        self.redis = redis_client
        self.status_ttl_s = status_ttl_s
        self.secrets = tuple(s for s in secrets if s)

    def put(self, letter: DeadLetter) -> bool:
        """Store a letter (redacted); False when the message was forgotten meanwhile (nothing written)."""
        uid, mid = check_user_id(letter.user_id), check_message_id(letter.message_id)
        letter = letter.model_copy(
            update={
                "reason": redact(letter.reason, self.secrets),
                "raw_llm": redact(letter.raw_llm, self.secrets) if letter.raw_llm else None,
            }
        )
        written = DEAD_LETTER(
            self.redis,
            DeadLetterKeys(
                tombstone=keys.forgotten(uid, mid),
                letter=keys.dead_letter(uid, mid),
                user_letters=keys.user_dead_letters(uid),
                letters=keys.dead_letters(),
                status=keys.status(uid, mid),
                payload=keys.message_payload(uid, mid),
                extraction=keys.extraction(uid, mid),
                pending=keys.pending(uid),
                ready=keys.ready(uid),
                in_flight=keys.in_flight(),
                in_flight_extracted=keys.in_flight_extracted(),
                messages=keys.user_messages(uid),
            ),
            DeadLetterArgs(
                letter=letter.model_dump_json(),
                failed_at=letter.failed_at.timestamp(),
                reason=letter.reason[:500],
                ttl=self.status_ttl_s,
                now=time.time(),
                message_id=mid,
                ref=keys.message_ref(uid, mid),
            ),
        )
        return bool(written)

    def list(self, user_id: str | None = None, *, where: Callable[[str], bool] | None = None) -> list[DeadLetter]:
        """The letters of ``user_id`` (read from its index alone), or every letter (of the users ``where``
        accepts: the others' letters are not read); oldest first."""
        if user_id is None:
            refs = [ref.partition(":") for ref in members(self.redis, keys.dead_letters())]
            pairs = [(uid, mid) for uid, _, mid in refs if where is None or where(uid)]  # user ids have no ':'
        else:
            uid = check_user_id(user_id)  # before any read: a bad id is refused, not found empty
            pairs = [(uid, mid) for mid in members(self.redis, keys.user_dead_letters(uid))]
        letters: list[DeadLetter] = []
        for start in range(0, len(pairs), _PAGE):
            found = self.redis.mget([keys.dead_letter(uid, mid) for uid, mid in pairs[start : start + _PAGE]])
            letters.extend(DeadLetter.model_validate_json(raw) for raw in found if raw is not None)
        return letters  # the indexes are scored by failure time: oldest first already

    def get(self, user_id: str, message_id: str) -> DeadLetter | None:
        raw = self.redis.get(keys.dead_letter(check_user_id(user_id), check_message_id(message_id)))
        return DeadLetter.model_validate_json(raw) if raw else None

    def remove(self, user_id: str, message_id: str) -> bool:
        uid, mid = check_user_id(user_id), check_message_id(message_id)
        pipe = self.redis.pipeline(transaction=True)
        unfile(pipe, uid, [mid])
        removed, *_ = pipe.execute()
        return bool(removed)

    def prune(self, *, older_than: timedelta, now: datetime | None = None) -> int:
        """Delete letters that failed more than ``older_than`` ago (read from the fleet-wide index by
        score: only those); returns how many."""
        cutoff = ((now or utcnow()) - older_than).timestamp()
        pruned = 0
        while page := self.redis.zrangebyscore(keys.dead_letters(), "-inf", f"({cutoff}", start=0, num=_PAGE):
            pipe = self.redis.pipeline(transaction=True)
            for ref in page:
                uid, _, mid = _text(ref).partition(":")
                unfile(pipe, uid, [mid])
            pruned += sum(pipe.execute()[::3])
        return pruned


def members(client: redis.Redis, index: str) -> list[str]:
    """Every member of the sorted set ``index``, in score order, read in pages."""
    found: list[str] = []
    while page := client.zrange(index, len(found), len(found) + _PAGE - 1):
        found.extend(_text(m) for m in page)
    return found


def unfile(pipe: redis.client.Pipeline, user_id: str, message_ids: Sequence[str]) -> None:
    """Queue on ``pipe`` the removal of these dead letters of one user: each letter, then its entries in
    the user's and the fleet-wide index (three commands a letter, in that order)."""
    for mid in message_ids:
        pipe.delete(keys.dead_letter(user_id, mid))
        pipe.zrem(keys.user_dead_letters(user_id), mid)
        pipe.zrem(keys.dead_letters(), keys.message_ref(user_id, mid))
