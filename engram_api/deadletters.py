"""The dead-letter store: messages that could not be processed, with the reason, kept for operators.

A hash in Redis (``keys.dead_letters()``), one field per message. ``replay`` puts the message back on the
extract queue as if it had just been enqueued; ``drop`` discards it.

Invariants: every method validates the ids it is given (user ids never contain ':', so the field
``user_id:message_id`` is unambiguous); a letter is never written for a forgotten message (the tombstone
check and the write are one Lua script); reasons and raw answers are stored redacted; letters older than
``dead_letter_retention_days`` are pruned by the redelivery sweep (``prune``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import redis

from engram_api import keys
from engram_api.models import DeadLetter, MessageState, check_message_id, check_user_id, utcnow
from engram_api.redaction import redact

__all__ = ["DeadLetterStore"]

# KEYS: tombstone, dead-letter hash, status, payload, extraction, pending, ready. ARGV: field, letter json, reason,
# status ttl, message id.
_PUT = f"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZREM', KEYS[6], ARGV[5])
redis.call('ZREM', KEYS[7], ARGV[5])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], 'state', '{MessageState.DEAD.value}', 'reason', ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('DEL', KEYS[4], KEYS[5])
return 1
"""


class DeadLetterStore:
    def __init__(self, *, redis_client: redis.Redis, status_ttl_s: int, secrets: Iterable[str | None] = ()) -> None:
        self.redis = redis_client
        self.status_ttl_s = status_ttl_s
        self.secrets = tuple(s for s in secrets if s)
        self._put = redis_client.register_script(_PUT)

    def put(self, letter: DeadLetter) -> bool:
        """Store a letter (redacted); False when the message was forgotten meanwhile (nothing written)."""
        uid, mid = check_user_id(letter.user_id), check_message_id(letter.message_id)
        letter = letter.model_copy(
            update={
                "reason": redact(letter.reason, self.secrets),
                "raw_llm": redact(letter.raw_llm, self.secrets) if letter.raw_llm else None,
            }
        )
        written = self._put(
            keys=[
                keys.forgotten(uid, mid),
                keys.dead_letters(),
                keys.status(uid, mid),
                keys.message_payload(uid, mid),
                keys.extraction(uid, mid),
                keys.pending(uid),
                keys.ready(uid),
            ],
            args=[
                keys.dead_letter_field(uid, mid),
                letter.model_dump_json(),
                letter.reason[:500],
                self.status_ttl_s,
                mid,
            ],
        )
        return bool(written)

    def list(self, user_id: str | None = None) -> list[DeadLetter]:
        if user_id is not None:
            check_user_id(user_id)
        letters = [DeadLetter.model_validate_json(raw) for raw in self.redis.hvals(keys.dead_letters())]
        if user_id is not None:
            letters = [letter for letter in letters if letter.user_id == user_id]
        return sorted(letters, key=lambda letter: letter.failed_at)

    def get(self, user_id: str, message_id: str) -> DeadLetter | None:
        raw = self.redis.hget(keys.dead_letters(), self._field(user_id, message_id))
        return DeadLetter.model_validate_json(raw) if raw else None

    def remove(self, user_id: str, message_id: str) -> bool:
        return bool(self.redis.hdel(keys.dead_letters(), self._field(user_id, message_id)))

    def prune(self, *, older_than: timedelta, now: datetime | None = None) -> int:
        """Delete letters that failed more than ``older_than`` ago; returns how many."""
        cutoff = (now or utcnow()) - older_than
        doomed = [
            field
            for field, raw in self.redis.hscan_iter(keys.dead_letters(), count=500)
            if DeadLetter.model_validate_json(raw).failed_at < cutoff
        ]
        return int(self.redis.hdel(keys.dead_letters(), *doomed)) if doomed else 0

    @staticmethod
    def _field(user_id: str, message_id: str) -> str:
        return keys.dead_letter_field(check_user_id(user_id), check_message_id(message_id))
