"""Every Redis key, queue name and task name Engram uses, in one place (the wire contract).

The producer and the reader import this without importing Celery; the workers import it too, so a
name can only drift in one file.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "APPLY_QUEUE",
    "APPLY_TASK",
    "EXTRACT_QUEUE",
    "EXTRACT_TASK",
    "MAINTENANCE_QUEUE",
    "MAINTENANCE_TASKS",
    "PREFIX",
    "QUEUES",
    "SENT_AT_HEADER",
    "TASK_QUEUES",
    "queue_for",
]

PREFIX = "engram"

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
MAINTENANCE_TASKS = (DECAY_TASK, HIERARCHY_TASK, WEIGHTS_TASK, RECONCILE_TASK, REDELIVER_TASK)

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
    """The queue a task is published on; KeyError for a task Engram does not have."""
    return TASK_QUEUES[task]


def erased_indexes() -> str:
    """Sorted set of erasure tombstones: ``<index file stem>:<epoch>`` scored by the erasure's Unix time;
    every process deletes its local FAISS files of those (``engram_api.storage.faiss.erasure``)."""
    return f"{PREFIX}:erased-indexes"


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


def deliveries(user_id: str, message_id: str, stage: str) -> str:
    """How many times a stage started on this message: bounds poison messages that kill workers."""
    return f"{PREFIX}:deliveries:{stage}:{user_id}:{message_id}"


def dead_letters() -> str:
    """Hash message key -> DeadLetter JSON."""
    return f"{PREFIX}:dlq"


def dead_letter_field(user_id: str, message_id: str) -> str:
    """Unambiguous only for validated ids: user ids never contain ':' (message ids may), so the field
    splits at its first ':'. ``DeadLetterStore`` validates both ids before building one."""
    return f"{user_id}:{message_id}"


def forgotten(user_id: str, message_id: str) -> str:
    """Tombstone of a forgotten message: while it exists no stage may write anything for the message.

    Named by a hash of the ids, not the ids: an erased user's id is not kept in Redis (nor its AOF) for the
    tombstone's lifetime. Only a caller who knows both ids can tell the message was forgotten."""
    digest = hashlib.blake2b(f"{user_id}:{message_id}".encode(), digest_size=16).hexdigest()
    return f"{PREFIX}:forgotten:{digest}"


def pending(user_id: str) -> str:
    """Sorted set message id -> enqueue time of the user's unfinished messages: the back-pressure count.
    Removed when a message is applied, dead-lettered or forgotten; entries older than ``status_ttl_s``
    are dropped at enqueue (a message lost to a crash cannot block its user forever)."""
    return f"{PREFIX}:pending:{user_id}"


def ready(user_id: str) -> str:
    """Sorted set message id -> event time (epoch seconds) of the user's messages whose extraction is stored
    and not yet applied: what an apply lease holder drains in one batch. Added with the extraction (same
    script, tombstone checked), removed when the message is applied, dead-lettered, forgotten or claimed
    by a batch; every member still has its own apply task, so the set is a hint, never the only record."""
    return f"{PREFIX}:ready:{user_id}"


def user_version(user_id: str) -> str:
    """The per-user stamp ("epoch:version") writers publish; readers compare it with their cache and index."""
    return f"{PREFIX}:version:{user_id}"


def stamps_channel() -> str:
    """Pub/sub channel of published stamps: "<user_id> <epoch>:<version>", sent by ``publish_stamp`` when a
    stamp moves forward; readers catch their copies up on it (``engram_api.reader.signals``). A hint only:
    the stamp key (``user_version``) stays the truth."""
    return f"{PREFIX}:stamps"


def apply_lock(user_id: str) -> str:
    return f"{PREFIX}:lock:apply:{user_id}"


def user_keys_pattern(user_id: str) -> list[str]:
    """Patterns of every per-user key, for forget_user."""
    return [
        f"{PREFIX}:msg:{user_id}:*",
        f"{PREFIX}:extraction:{user_id}:*",
        f"{PREFIX}:status:{user_id}:*",
        *(f"{PREFIX}:deliveries:{stage}:{user_id}:*" for stage in STAGES),
        f"{PREFIX}:recall:{user_id}:*",
        pending(user_id),
        ready(user_id),
    ]


def recall_log(user_id: str, recall_id: str) -> str:
    """Score components of a recall's results, kept briefly so feedback can be turned into training rows."""
    return f"{PREFIX}:recall:{user_id}:{recall_id}"


RATE_BUCKET = f"{PREFIX}:llm:bucket"
BREAKER = f"{PREFIX}:llm:breaker"
BEAT_LOCK = f"{PREFIX}:beat:lock"
