"""Redelivery sweep: re-send the stage task of any message stuck between stages.

Celery on Redis has a narrow window where a message can vanish: kombu takes a message with ``RPOP`` and
records it as unacked in a second round trip, so a worker process SIGKILLed between the two loses it
(celery/celery#7950). The status hash in Redis still says where the message was (``queued`` or
``extracted``) and since when. A message that has sat there longer than the visibility timeout — by then
any unacked copy would have been restored — gets its stage task sent again. Every stage is idempotent, so
a needless re-send costs a little work, never a duplicate. The sweep reads only the messages the in-flight
index (``engram_api.ledger.inflight``) files as waiting since before the threshold, and their statuses:
its cost follows what is overdue, not the status keys kept for days.

Age alone cannot tell a lost message from one waiting behind a backlog: under load (or after an LLM outage)
a whole queue is older than the visibility timeout, and re-sending all of it doubles the backlog at every
sweep (seen in the full chaos run on a loaded machine: 4,944 re-sends for 1,000 messages, and a queue that no
longer drained). So a stuck message is re-sent only when its task is nowhere in the broker: not in its
stage's queue lists and not in kombu's ``unacked`` hash. The broker is read only when some message is
stuck, in pages, keeping ids alone. A message caught between kombu's two round trips while the sweep reads
is re-sent needlessly, which is harmless.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import redis
from pydantic import BaseModel, Field

from engram_api import keys
from engram_api.errors import InvalidInputError
from engram_api.ledger import MessageLedger
from engram_api.ledger.wire import tasks_in_broker
from engram_api.models import MessageState
from engram_workers.dispatch import Dispatch

__all__ = ["RedeliverReport", "redeliver_stuck"]

# The stage task a message waiting in each state needs.
_TASK_FOR = {MessageState.QUEUED: keys.EXTRACT_TASK, MessageState.EXTRACTED: keys.APPLY_TASK}


class RedeliverReport(BaseModel):
    scanned: int = Field(0, description="in-flight messages waiting since before the threshold, read")
    resent: list[str] = Field(default_factory=list, description="user_id:message_id of re-sent messages")
    failed: list[str] = Field(default_factory=list, description="messages whose re-send raised, with the error")
    pruned_dead_letters: int = Field(0, description="dead letters older than the retention deleted")
    waiting: int = Field(0, description="old messages left alone because their task still waits in the broker")


_MAX_AGE_S = 30 * 24 * 3600  # status keys live for days, not longer: a larger threshold finds nothing


def redeliver_stuck(
    *,
    client: redis.Redis,
    send: Dispatch,
    older_than_s: float,
    now: float | None = None,
    dead_letter_retention: timedelta | None = None,
) -> RedeliverReport:
    """``send(task_name, args)`` publishes a task on its queue (the worker's dispatcher in production).

    With ``dead_letter_retention`` the sweep also deletes dead letters older than that (they hold the
    message text; this sweep runs every few minutes, so none outlives the retention by much).
    """
    if not isinstance(older_than_s, int | float) or not 0 <= older_than_s <= _MAX_AGE_S:
        raise InvalidInputError("older_than_s", f"must be between 0 and {_MAX_AGE_S} seconds")
    now = time.time() if now is None else now
    if now > time.time() + 300:
        raise InvalidInputError("now", "must not be in the future")
    report = RedeliverReport()
    ledger = MessageLedger(client, status_ttl_s=0)  # reads, re-stamps and prunes: no TTL is written
    if dead_letter_retention is not None:
        cutoff = datetime.fromtimestamp(now, UTC)
        report.pruned_dead_letters = ledger.dead_letters.prune(older_than=dead_letter_retention, now=cutoff)
    report.scanned, overdue = ledger.in_flight.overdue(now - older_than_s)
    stuck = [w for w in overdue if w.since is not None and now - w.since >= older_than_s]
    waiting = set(tasks_in_broker(client)) if stuck else set()
    for user_id, message_id, state, _ in stuck:
        task, ref = _TASK_FOR[state], keys.message_ref(user_id, message_id)
        if (task, ref) in waiting:
            report.waiting += 1
            continue
        try:
            send(task, (user_id, message_id))
        except Exception as exc:  # one bad send must not stop the sweep; the next sweep tries again
            report.failed.append(f"{ref}: {type(exc).__name__}: {exc}"[:300])
            continue
        # Re-stamp so the next sweep waits a full period before sending again.
        ledger.in_flight.restamp(user_id, message_id, state, now)
        report.resent.append(ref)
    return report
