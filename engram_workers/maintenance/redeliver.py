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
stuck, in pages, keeping ids alone, so a task that moves while it is read (a retry re-published, a dead
worker's message restored, a consumer between its pop and its unacked record) can be missed: a message
found nowhere is looked for again a second later, and re-sent only if it still waits in the same state and
is still nowhere (the chaos scenarios count every re-send against what their faults could have stranded).

``resend_lost`` runs the sweep from outside a worker, through a Celery client of its own: a fresh `engram
up` runs it with no age threshold on the Redis it has just started, before any worker connects, so a task
that is in no queue and not unacked then is certainly lost, not in a consumer's hands (the chaos harness
runs it as Beat would).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import redis
from pydantic import BaseModel, Field

from engram_api import keys
from engram_api.connections import redis_client
from engram_api.errors import InvalidInputError
from engram_api.ledger import MessageLedger
from engram_api.ledger.inflight import Waiting
from engram_api.ledger.wire import tasks_in_broker
from engram_api.models import MessageState
from engram_api.settings import Settings
from engram_workers.dispatch import Dispatch, celery_dispatch

__all__ = ["RedeliverReport", "redeliver_stuck", "resend_lost"]

# The stage task a message waiting in each state needs.
_TASK_FOR = {MessageState.QUEUED: keys.EXTRACT_TASK, MessageState.EXTRACTED: keys.APPLY_TASK}


class RedeliverReport(BaseModel):
    scanned: int = Field(0, description="in-flight messages waiting since before the threshold, read")
    resent: list[str] = Field(default_factory=list, description="user_id:message_id of re-sent messages")
    failed: list[str] = Field(default_factory=list, description="messages whose re-send raised, with the error")
    pruned_dead_letters: int = Field(0, description="dead letters older than the retention deleted")
    waiting: int = Field(
        0,
        description="old messages left alone: their task still waits in the broker, or they are parked waiting "
        "for their user's extraction turn",
    )


_MAX_AGE_S = 30 * 24 * 3600  # status keys live for days, not longer: a larger threshold finds nothing


def redeliver_stuck(
    *,
    client: redis.Redis,
    send: Dispatch,
    older_than_s: float,
    now: float | None = None,
    dead_letter_retention: timedelta | None = None,
    confirm_after_s: float = 1.0,
) -> RedeliverReport:
    """``send(task_name, args)`` publishes a task on its queue (the worker's dispatcher in production).
    A message found nowhere is looked for again ``confirm_after_s`` later and re-sent only if still missing.

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
    # A parked message's task ended on purpose: it waits for its user's turn, however long the burst takes.
    # Only a lost wake-up (the holder finished without passing the turn on) is stuck, and then only the
    # user's earliest parked message needs its task again.
    behind = ledger.turns.left_waiting((w.user_id, w.message_id) for w in stuck if w.state is MessageState.QUEUED)
    stuck = [w for w in stuck if (w.user_id, w.message_id) not in behind]
    lost = _nowhere(client, stuck)
    if lost and confirm_after_s:
        # The broker is read in pages, not at one instant: a task moving while it is read (a retry's new
        # message published and the old one acked, a dead worker's message restored to its queue, a consumer
        # between its pop and its unacked record) or a message that moved on to its next stage looks lost
        # once. Only one that still waits in the same state, and is still nowhere a moment later, is.
        time.sleep(confirm_after_s)
        still = {w[:3] for w in ledger.in_flight.overdue(now - older_than_s)[1]}
        lost = _nowhere(client, [w for w in lost if w[:3] in still])
    report.waiting = len(stuck) - len(lost) + len(behind)
    for user_id, message_id, state, _ in lost:
        task, ref = _TASK_FOR[state], keys.message_ref(user_id, message_id)
        try:
            send(task, (user_id, message_id))
        except Exception as exc:  # one bad send must not stop the sweep; the next sweep tries again
            report.failed.append(f"{ref}: {type(exc).__name__}: {exc}"[:300])
            continue
        # Re-stamp so the next sweep waits a full period before sending again.
        ledger.in_flight.restamp(user_id, message_id, state, now)
        report.resent.append(ref)
    return report


def _nowhere(client: redis.Redis, stuck: Sequence[Waiting]) -> list[Waiting]:
    """The ``stuck`` messages whose stage task is neither queued nor unacked (the broker read only if any)."""
    if not stuck:
        return []
    waiting = set(tasks_in_broker(client))
    return [w for w in stuck if (_TASK_FOR[w.state], keys.message_ref(w.user_id, w.message_id)) not in waiting]


def resend_lost(settings: Settings, redis_url: str, *, older_than_s: float) -> RedeliverReport:
    """``redeliver_stuck`` on ``redis_url``, publishing through a Celery client built from ``settings``."""
    from engram_workers.celery_config import make_celery

    client = redis_client(redis_url, settings)
    try:
        return redeliver_stuck(
            client=client, send=celery_dispatch(make_celery(settings, redis_url)), older_than_s=older_than_s
        )
    finally:
        client.close()
