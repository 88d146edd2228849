"""The dead-letter store: messages that could not be processed, with the reason, kept for operators.

A hash in Redis (``keys.dead_letters()``), one field per message. ``replay`` puts the message back on the
extract queue as if it had just been enqueued; ``drop`` discards it.
"""

from __future__ import annotations

import redis

from engram_api import keys
from engram_api.models import DeadLetter, MessageState

__all__ = ["DeadLetterStore"]


class DeadLetterStore:
    def __init__(self, *, redis_client: redis.Redis, status_ttl_s: int) -> None:
        self.redis = redis_client
        self.status_ttl_s = status_ttl_s

    def put(self, letter: DeadLetter) -> None:
        field = keys.dead_letter_field(letter.user_id, letter.message_id)
        status = keys.status(letter.user_id, letter.message_id)
        pipe = self.redis.pipeline()
        pipe.hset(keys.dead_letters(), field, letter.model_dump_json())
        pipe.hset(status, mapping={"state": MessageState.DEAD.value, "reason": letter.reason[:500]})
        pipe.expire(status, self.status_ttl_s)
        pipe.delete(keys.message_payload(letter.user_id, letter.message_id))
        pipe.delete(keys.extraction(letter.user_id, letter.message_id))
        pipe.execute()

    def list(self, user_id: str | None = None) -> list[DeadLetter]:
        letters = [DeadLetter.model_validate_json(raw) for raw in self.redis.hvals(keys.dead_letters())]
        if user_id is not None:
            letters = [letter for letter in letters if letter.user_id == user_id]
        return sorted(letters, key=lambda letter: letter.failed_at)

    def get(self, user_id: str, message_id: str) -> DeadLetter | None:
        raw = self.redis.hget(keys.dead_letters(), keys.dead_letter_field(user_id, message_id))
        return DeadLetter.model_validate_json(raw) if raw else None

    def remove(self, user_id: str, message_id: str) -> bool:
        return bool(self.redis.hdel(keys.dead_letters(), keys.dead_letter_field(user_id, message_id)))

    def remove_user(self, user_id: str) -> int:
        fields = [f for f in self.redis.hkeys(keys.dead_letters()) if f.startswith(f"{user_id}:")]
        return int(self.redis.hdel(keys.dead_letters(), *fields)) if fields else 0
