"""The in-flight index (``keys.in_flight``): every queued or extracted message, scored by since when it
waits for its stage, so that the redelivery sweep reads only what is overdue.

Before the index the sweep SCANned every status key (kept ``status_ttl_s``, applied ones included) with
one HMGET each: its cost followed the keyspace (issue 45: ~25 minutes a sweep at 1M messages a day). Now
it reads the members scored at or before its threshold, and the statuses of those alone, pipelined.

Invariants:
- The lifecycle scripts keep the index (``engram_api.ledger.scripts``): ``ENQUEUE`` files a message at its
  ``enqueued_at``; ``STAGE_WRITE`` re-files an unfinished one at its status's ``SINCE_FIELD`` (copied from
  the status in the same script, so the score is the field the sweep checks) and removes a finished one;
  ``DEAD_LETTER`` and erasure remove theirs. So a message the old full scan would have found overdue is a
  member scored at or before the threshold.
- A member whose status no longer says queued or extracted (the status expired, or was written by hand)
  leaves the index when the sweep meets it (``DROP_SETTLED``, which checks the state in the script: a
  message enqueued again meanwhile keeps its entry).
- ``restamp`` moves the status field and the score together (one MULTI): the next sweep waits a full
  period before sending the message again.
- ``keys.in_flight_extracted`` holds the extracted members with the same scores, kept by the same scripts
  (erasure, ``DEAD_LETTER`` and ``DROP_SETTLED`` remove from both), so the metrics collector tells the
  backlog's stages apart by two ``ZCARD``s (``engram_in_flight_messages{stage}``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from engram_api import keys
from engram_api.ledger.scripts import DROP_SETTLED, SettledArgs, SettledKeys
from engram_api.models import MessageState

if TYPE_CHECKING:
    import redis

__all__ = ["SINCE_FIELD", "InFlight", "Waiting"]

# The status field that says since when a message waits in each unfinished state.
SINCE_FIELD = {MessageState.QUEUED: "enqueued_at", MessageState.EXTRACTED: "extracted_at"}

_PAGE = 1000


class Waiting(NamedTuple):
    """An overdue message as its status says now: its state and since when it waits (None: no stamp)."""

    user_id: str
    message_id: str
    state: MessageState
    since: float | None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class InFlight:
    """The index on one Redis (``client``)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def overdue(self, before: float) -> tuple[int, list[Waiting]]:
        """How many members waited since ``before`` or earlier, and those whose status still says queued or
        extracted; the others leave the index (see the module docstring)."""
        refs: list[str] = []
        while page := self.redis.zrangebyscore(keys.in_flight(), "-inf", before, start=len(refs), num=_PAGE):
            refs.extend(_text(ref) for ref in page)
        waiting: list[Waiting] = []
        for start in range(0, len(refs), _PAGE):
            chunk = refs[start : start + _PAGE]
            pipe = self.redis.pipeline(transaction=False)
            for ref in chunk:
                user_id, _, message_id = ref.partition(":")  # user ids never contain ':'
                pipe.hmget(keys.status(user_id, message_id), "state", *SINCE_FIELD.values())
            for ref, (raw_state, *stamps) in zip(chunk, pipe.execute(), strict=True):
                user_id, _, message_id = ref.partition(":")
                state = None if raw_state is None else _text(raw_state)  # a client may not decode replies
                if state not in SINCE_FIELD:
                    DROP_SETTLED(
                        self.redis,
                        SettledKeys(
                            in_flight=keys.in_flight(),
                            in_flight_extracted=keys.in_flight_extracted(),
                            status=keys.status(user_id, message_id),
                        ),
                        SettledArgs(ref=ref),
                    )
                    continue
                stage = MessageState(state)
                since = dict(zip(SINCE_FIELD.values(), stamps, strict=True))[SINCE_FIELD[stage]]
                waiting.append(Waiting(user_id, message_id, stage, float(since) if since is not None else None))
        return len(refs), waiting

    def restamp(self, user_id: str, message_id: str, state: MessageState, at: float) -> None:
        """The message waits since ``at`` now: its status field and its score, together."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.status(user_id, message_id), SINCE_FIELD[state], str(at))
        pipe.zadd(keys.in_flight(), {keys.message_ref(user_id, message_id): at})
        if state is MessageState.EXTRACTED:
            pipe.zadd(keys.in_flight_extracted(), {keys.message_ref(user_id, message_id): at})
        pipe.execute()
