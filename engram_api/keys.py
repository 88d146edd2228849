"""Every Redis key, queue name and task name Engram uses, in one place (the wire contract).

The producer and the reader import this without importing Celery; the workers import it too, so a
name can only drift in one file.

Invariants: no other module spells a key (``tests/test_ledger_static.py`` checks that no ``engram:``
literal and no f-string over ``PREFIX`` lives outside this file); Engram's own keys start with
``PREFIX``; the names kombu and RedBeat own (a queue's priority lists, the ``unacked`` hash, RedBeat's
prefix and lock) are spelled here too, so that what Engram reads of them is declared beside its own keys.
User ids never contain ':', so a key that ends in ``<user_id>:<message_id>`` splits at the first ':'.

The deployment's prefix (``ENGRAM_REDIS_KEY_PREFIX``, read once when this module is imported, so every key
of a process carries the same one): a name ``n`` puts ``n:`` before EVERY key and channel the deployment
writes, Engram's (``PREFIX`` is ``n:engram``), kombu's (``DEPLOYMENT_PREFIX`` is its ``global_keyprefix``:
queues, ``unacked``, bindings, pidbox) and RedBeat's, so two deployments share one Redis database apart and
an ACL grants one of them ``~n:*``. Unset (the default), keys are exactly what they were before the prefix.
A process serves one deployment: ``Settings`` refuses another prefix than the one read here.
"""

from __future__ import annotations

import hashlib
import os
import re

from engram_api.errors import ConfigError

__all__ = [
    "APPLY_QUEUE",
    "APPLY_TASK",
    "DEPLOYMENT_PREFIX",
    "EXTRACT_QUEUE",
    "EXTRACT_TASK",
    "MAINTENANCE_QUEUE",
    "MAINTENANCE_TASKS",
    "PREFIX",
    "QUEUES",
    "SENT_AT_HEADER",
    "TASK_QUEUES",
    "deployment_prefix",
    "queue_for",
    "queue_key",
]

KEY_PREFIX_VARIABLE = "ENGRAM_REDIS_KEY_PREFIX"
# A name safe in a SCAN pattern and an ACL key pattern (no glob character), and in a ':'-separated key.
_DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def deployment_prefix(name: str) -> str:
    """What a deployment named ``name`` puts before every key: ``name:``, or nothing for the empty name.
    ValueError for a name that is not 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit)."""
    if not name:
        return ""
    if not _DEPLOYMENT_NAME.fullmatch(name):
        raise ValueError("must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return f"{name}:"


def _process_prefix() -> str:
    name = os.environ.get(KEY_PREFIX_VARIABLE, "")
    try:
        return deployment_prefix(name)
    except ValueError as exc:
        raise ConfigError(KEY_PREFIX_VARIABLE, f"{exc} (got {name!r})") from None


DEPLOYMENT_PREFIX = _process_prefix()
"""Before every key and channel of this process's deployment; kombu's ``global_keyprefix``."""
PREFIX = f"{DEPLOYMENT_PREFIX}engram"

# Queues: extraction is I/O bound (LLM), apply is CPU/DB bound, maintenance runs on Beat's schedule.
EXTRACT_QUEUE = "engram.extract"
APPLY_QUEUE = "engram.apply"
MAINTENANCE_QUEUE = "engram.maintenance"
QUEUES = (EXTRACT_QUEUE, APPLY_QUEUE, MAINTENANCE_QUEUE)

# Pipeline stages (also the task names' suffixes); per-stage keys are built from these.
STAGES = ("extract", "apply")

EXTRACT_TASK = "engram.extract"
APPLY_TASK = "engram.apply"
DECAY_TASK = "engram.maintenance.decay"
HIERARCHY_TASK = "engram.maintenance.hierarchy"
WEIGHTS_TASK = "engram.maintenance.weights"
RECONCILE_TASK = "engram.maintenance.reconcile"
REDELIVER_TASK = "engram.maintenance.redeliver"
REEMBED_TASK = "engram.maintenance.reembed"
MAINTENANCE_TASKS = (DECAY_TASK, HIERARCHY_TASK, WEIGHTS_TASK, RECONCILE_TASK, REDELIVER_TASK, REEMBED_TASK)

# Routes: the queue of every task. The Celery config, the producer's Lua enqueue, worker hand-overs,
# redelivery and Beat all route through ``queue_for``.
TASK_QUEUES = {
    EXTRACT_TASK: EXTRACT_QUEUE,
    APPLY_TASK: APPLY_QUEUE,
    **dict.fromkeys(MAINTENANCE_TASKS, MAINTENANCE_QUEUE),
}


# Task-message header: when the message was published, in epoch seconds (the producer's enqueue and every
# Celery publish set it); the age of a queue's oldest message (``engram_queue_lag_seconds``) is read from it.
SENT_AT_HEADER = "engram_sent_at"


def queue_for(task: str) -> str:
    """The queue a task is published on (kombu's name: routing key and delivery info); KeyError for a task
    Engram does not have."""
    return TASK_QUEUES[task]


def queue_key(queue: str) -> str:
    """The Redis list kombu keeps ``queue`` in (its ``global_keyprefix`` before the queue's name): what the
    producer's enqueue pushes onto and the depth gauges read."""
    return f"{DEPLOYMENT_PREFIX}{queue}"


def erased_indexes() -> str:
    """Sorted set of erasure tombstones: ``<index file stem>:<epoch>`` scored by the erasure's Unix time;
    every process deletes its local FAISS files of those (``engram_api.storage.faiss.erasure``)."""
    return f"{PREFIX}:erased-indexes"


def forgotten_texts() -> str:
    """Sorted set of the users a write removed records of (a forget of a fact or a message, decay's expired
    excerpts): ``<index file stem>`` (no user id) scored by ``forgotten_texts_sequence`` at the user's last
    such write; every process drops those users' texts from its encoder cache at its next erasure sweep
    (``engram_api.storage.faiss.erasure``)."""
    return f"{PREFIX}:forgotten-texts"


def forgotten_texts_sequence() -> str:
    """The fleet-wide sequence (INCR) that scores ``forgotten_texts``."""
    return f"{PREFIX}:forgotten-texts:seq"


def message_payload(user_id: str, message_id: str) -> str:
    """The envelope (JSON) of a message not yet applied; deleted once applied."""
    return f"{PREFIX}:msg:{user_id}:{message_id}"


def extraction(user_id: str, message_id: str) -> str:
    """The validated extraction waiting for the apply stage (so a retried apply never re-calls the LLM)."""
    return f"{PREFIX}:extraction:{user_id}:{message_id}"


STATUS_PREFIX = f"{PREFIX}:status:"


def status(user_id: str, message_id: str) -> str:
    """A hash: state (queued/extracted/applied/dead), task id, timestamps; kept for ``status_ttl_s``."""
    return f"{STATUS_PREFIX}{user_id}:{message_id}"


def user_messages(user_id: str) -> str:
    """Sorted set message id -> when (epoch seconds) a key of that message last had its TTL set: the
    user's messages Redis may still hold a key of (payload, extraction, status, delivery counters), with
    ``pending``, which holds a message from its enqueue until it finishes. Every script and pipeline that
    sets one of those TTLs after the enqueue adds the message here in the same round trip and gives this
    set the same TTL (the scripts that finish a message among them); they drop members older than
    ``status_ttl_s`` (their keys have expired). ``erase_user`` reads it instead of scanning the keyspace, so erasure costs follow the
    user's message count. Data written before it existed is indexed once by ``engram ledger reindex``."""
    return f"{PREFIX}:user-msgs:{user_id}"


def deliveries(user_id: str, message_id: str, stage: str) -> str:
    """How many times a stage started on this message: bounds poison messages that kill workers."""
    return f"{PREFIX}:deliveries:{stage}:{user_id}:{message_id}"


def dead_letter(user_id: str, message_id: str) -> str:
    """One dead letter (DeadLetter JSON), kept until replayed, dropped, forgotten or pruned."""
    return f"{PREFIX}:dl:{user_id}:{message_id}"


def user_dead_letters(user_id: str) -> str:
    """Sorted set message id -> failed at (epoch seconds) of the user's dead letters: a user's listing
    reads these letters alone. Written and cleared with the letter, in the same round trip."""
    return f"{PREFIX}:dl-user:{user_id}"


def dead_letters() -> str:
    """Sorted set ``message_ref`` -> failed at (epoch seconds) of every dead letter: the fleet-wide listing
    and the retention prune (which reads only the members older than the retention). Written and
    cleared with the letter, in the same round trip."""
    return f"{PREFIX}:dl-all"


def legacy_dead_letters() -> str:
    """The hash ``message_ref`` -> DeadLetter JSON that held every dead letter before one key per letter;
    read only by ``engram ledger reindex``, which moves its letters to their own keys and deletes it."""
    return f"{PREFIX}:dlq"


def message_key_prefixes() -> tuple[str, ...]:
    """The prefixes of the per-message keys (status, payload, extraction, delivery counters), each
    followed by ``<user_id>:<message_id>``: what ``engram ledger reindex`` scans, once, to index the
    messages written before ``user_messages`` existed."""
    return (
        STATUS_PREFIX,
        f"{PREFIX}:msg:",
        f"{PREFIX}:extraction:",
        *(f"{PREFIX}:deliveries:{stage}:" for stage in STAGES),
    )


def message_ref(user_id: str, message_id: str) -> str:
    """``user_id:message_id``: a message named in a shared structure (a dead-letter member, an in-flight
    member). Unambiguous only for validated ids: user ids never contain ':' (message ids may), so it
    splits at its first ':'."""
    return f"{user_id}:{message_id}"


def in_flight() -> str:
    """Sorted set ``message_ref`` -> since when (epoch seconds) the message waits for its current stage:
    its status's ``enqueued_at`` while queued, ``extracted_at`` while extracted (the score is copied from
    the status in the script that writes it). Every queued or extracted message is in it; an applied,
    dead-lettered or forgotten one leaves it in the script that finishes it. The redelivery sweep reads
    only the members older than its threshold, so its cost follows what is overdue, not the keyspace."""
    return f"{PREFIX}:inflight"


def in_flight_extracted() -> str:
    """Sorted set: the members of ``in_flight`` that are extracted (waiting for apply), with the same scores.
    The scripts that file, re-file or remove a member of ``in_flight`` keep it (a message sent back to
    extract leaves it), so ``ZCARD`` of the two tells each stage's share of the backlog at scrape time
    without reading a status (``engram_in_flight_messages{stage}``)."""
    return f"{PREFIX}:inflight:extracted"


def forgotten(user_id: str, message_id: str) -> str:
    """Tombstone of a forgotten message: while it exists no stage may write anything for the message.

    Named by a hash of the ids, not the ids: an erased user's id is not kept in Redis (nor its AOF) for the
    tombstone's lifetime. Only a caller who knows both ids can tell the message was forgotten."""
    digest = hashlib.blake2b(f"{user_id}:{message_id}".encode(), digest_size=16).hexdigest()
    return f"{PREFIX}:forgotten:{digest}"


def pending(user_id: str) -> str:
    """Sorted set message id -> enqueue time of the user's unfinished messages: the back-pressure count,
    and how erasure finds a message not yet in ``user_messages``.
    Removed when a message is applied, dead-lettered or forgotten; entries older than ``status_ttl_s``
    (a message lost to a crash) are not counted, and are dropped by the enqueue they would refuse, so
    they cannot block their user."""
    return f"{PREFIX}:pending:{user_id}"


def ready(user_id: str) -> str:
    """Sorted set message id -> event time (epoch seconds) of the user's messages whose extraction is stored
    and not yet applied: what an apply lease holder drains in one batch. Added with the extraction (same
    script, tombstone checked), removed when the message is applied, dead-lettered, forgotten or claimed
    by a batch; every member still has its own apply task, so the set is a hint, never the only record."""
    return f"{PREFIX}:ready:{user_id}"


def extract_order(user_id: str) -> str:
    """Sorted set message id -> event time (epoch seconds) of the user's unfinished messages: the order in which
    their extractions take the user's turn (``engram_api.ledger.turns``). Added at enqueue (or by the first
    ``take`` of a message enqueued before it existed), removed when the message is applied, dead-lettered or
    forgotten; an entry whose status says it is finished (or has expired) is dropped by the next ``take`` that
    meets it, so a lost message cannot hold the user's later messages back for ever."""
    return f"{PREFIX}:order:{user_id}"


def extract_turn(user_id: str) -> str:
    """The id of the user's message that holds its extraction turn: taken when its extraction starts, passed
    on when it is applied, dead-lettered or forgotten. While one message holds it, the user's other messages
    wait (``parked``), so each extraction sees the facts of every message before it."""
    return f"{PREFIX}:turn:{user_id}"


def parked(user_id: str) -> str:
    """Set of the user's message ids whose extract task found the turn taken (or an earlier message waiting)
    and ended: the one that passes the turn on sends the extract task of the earliest parked message again."""
    return f"{PREFIX}:parked:{user_id}"


def parked_traces(user_id: str) -> str:
    """Hash message id -> the trace context (W3C headers as JSON) of the extract span that parked it, written
    with the parking only when tracing is on: the wake reads and removes it in the same script and puts it
    in the woken task's headers, so the message's trace runs on from its enqueue (``engram_api.tracing``).
    Removed when the message is woken or finished; lives ``status_ttl_s`` like ``parked``."""
    return f"{PREFIX}:parked-traces:{user_id}"


def user_version(user_id: str) -> str:
    """The per-user stamp ("epoch:version") writers publish; readers compare it with their cache and index."""
    return f"{PREFIX}:version:{user_id}"


def stamps_channel() -> str:
    """Pub/sub channel of published stamps: "<user_id> <epoch>:<version>", sent by ``publish_stamp`` when a
    stamp moves forward; readers catch their copies up on it (``engram_api.reader.signals``). A hint only:
    the stamp key (``user_version``) stays the truth."""
    return f"{PREFIX}:stamps"


def change_feed(user_id: str) -> str:
    """Sorted set of the user's last few committed writes, each one JSON entry (the stamps before and after,
    the vectors, records and horizon ``GraphStore.user_changes`` read right after the commit), scored by the
    version after: a reader whose copies are behind reads them with the stamp in one round trip instead of
    asking the graph (``engram_api.storage.faiss.feed``). Moved only by ``publish_stamp``'s script, atomically
    with the stamp; capped, expiring, deleted by any write that removed a record (a forget) and by erasure,
    so it never holds what the graph no longer holds. A hint: a gap or a trim falls back to the graph."""
    return f"{PREFIX}:feed:{user_id}"


def apply_lock(user_id: str) -> str:
    """The user's write lease (a redis-py ``Lock``): whoever holds its token may write and publish."""
    return f"{PREFIX}:lock:apply:{user_id}"


def user_keys(user_id: str) -> tuple[str, ...]:
    """The user's keys that are not per message or per recall (``erase_user`` deletes these, the keys of
    every message in ``user_messages`` and of every recall in ``recall_logs``)."""
    return (
        user_messages(user_id),
        user_dead_letters(user_id),
        recall_logs(user_id),
        pending(user_id),
        ready(user_id),
        user_version(user_id),
        extract_order(user_id),
        extract_turn(user_id),
        parked(user_id),
        parked_traces(user_id),
        change_feed(user_id),
    )


def user_keys_pattern(user_id: str) -> list[str]:
    """SCAN patterns matching every key named by a user id (tests and ``engram ledger reindex`` use them;
    erasure never scans)."""
    return [
        f"{PREFIX}:msg:{user_id}:*",
        f"{PREFIX}:extraction:{user_id}:*",
        f"{PREFIX}:status:{user_id}:*",
        *(f"{PREFIX}:deliveries:{stage}:{user_id}:*" for stage in STAGES),
        f"{RECALL_PREFIX}{user_id}:*",
        f"{PREFIX}:dl:{user_id}:*",
        *user_keys(user_id),
    ]


RECALL_PREFIX = f"{PREFIX}:recall:"


def recall_log(user_id: str, recall_id: str) -> str:
    """Score components of a recall's results, kept briefly so feedback can be turned into training rows."""
    return f"{RECALL_PREFIX}{user_id}:{recall_id}"


def recall_logs(user_id: str) -> str:
    """Sorted set recall id -> when its log was written (epoch seconds): the user's recall logs, written
    with each log in one round trip (members older than a log's TTL dropped there, the set given the
    log's TTL), so ``erase_user`` deletes them without scanning."""
    return f"{PREFIX}:recalls:{user_id}"


# Fleet-wide LLM controls (engram_workers.control).
RATE_BUCKET = f"{PREFIX}:llm:bucket"
"""The GCRA rate limiter's theoretical arrival time (ms on Redis's clock); expires when idle."""

BREAKER_PARTS = ("open", "tripped", "failures", "trial", "stats")


def breaker(part: str) -> str:
    """A key of the LLM circuit breaker: ``open`` exists while open (its TTL is the time left),
    ``tripped`` from opening until a trial succeeds (half-open once ``open`` is gone), ``failures``
    counts consecutive failures, ``trial`` is the one half-open caller's token, ``stats`` a hash of
    fleet-wide counters that never expires. KeyError for any other part."""
    if part not in BREAKER_PARTS:
        raise KeyError(part)
    return f"{PREFIX}:llm:breaker:{part}"


# The maintenance fan-out (engram_api.storage.writer.changes, engram_workers.maintenance.fanout).
MAINTENANCE_CHANGED = f"{PREFIX}:maint:changed"
"""Sorted set user id -> fleet-wide write sequence of the user's last marked write."""
MAINTENANCE_SEQUENCE = f"{PREFIX}:maint:seq"
"""The fleet-wide write sequence (INCR) that scores ``MAINTENANCE_CHANGED``."""


def maintenance_todo(job: str) -> str:
    """Sorted set user id -> claim deadline (ms, Redis clock; 0 = not claimed) of the users ``job`` must visit."""
    return f"{PREFIX}:maint:{job}:todo"


def maintenance_seen(job: str) -> str:
    """The highest write sequence ``job`` has taken into its to-do set (absent: the job never ran)."""
    return f"{PREFIX}:maint:{job}:seen"


# RedBeat (Beat's scheduler): its schedule entries live under the prefix, its leader lock is one key.
BEAT_PREFIX = f"{PREFIX}:beat:"
BEAT_LOCK = f"{BEAT_PREFIX}lock"

# kombu's Redis transport (names it owns, read by the redelivery sweep): a queue is a list per priority
# step, and a message a worker took but has not acked is a field of one hash.
_PRIORITY_STEPS = ("", "\x06\x163", "\x06\x166", "\x06\x169")  # kombu's default priority steps


def queue_lists(queue: str) -> tuple[str, ...]:
    """The Redis lists kombu keeps for ``queue``: the queue itself and one per default priority step."""
    return tuple(queue_key(queue) + step for step in _PRIORITY_STEPS)


def kombu_unacked() -> str:
    """kombu's hash of reserved messages: delivery tag -> JSON [message, exchange, routing key]."""
    return f"{DEPLOYMENT_PREFIX}unacked"
