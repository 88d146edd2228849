"""kombu's wire format on Redis: how a Celery task message is written onto a queue, and read back.

The producer writes task messages itself (inside the enqueue script, so that a message is recorded and
published atomically) instead of going through Celery; the redelivery sweep reads the broker's lists and
``unacked`` hash to tell a lost task from one still waiting, and the queue-lag gauge reads the publish
time of a queue's oldest message. Both sides of that format live here.

Invariants:
- ``task_message`` is Celery's protocol 2 exactly as kombu's Redis transport LPUSHes it (JSON envelope,
  base64 JSON body); ``tests/test_producer.py`` compares it with the message Celery itself builds, and
  every pipeline test has real workers consume it. Producers therefore emit no "task-sent" event:
  Flower shows a task from "received" on.
- Every message carries ``keys.SENT_AT_HEADER`` (epoch seconds), as every Celery publish of the fleet
  does: the queue-lag gauge reads it.
- ``task_ref`` and ``sent_at`` never raise on a foreign or malformed message: they answer ``None``, which
  the sweep reads as "not waiting" (a needless re-send is harmless; a missed one is a lost message) and
  the gauge as "no sample" (rather than a guess).
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from engram_api import keys

if TYPE_CHECKING:
    import redis

__all__ = ["sent_at", "task_message", "task_ref", "tasks_in_broker"]

_ORIGIN = f"engram-producer@{socket.gethostname()}"
_PAGE = 1000


def task_message(
    task: str, task_id: str, args: tuple[str, ...], queue: str, sent_at: float, trace: Mapping[str, str] | None = None
) -> str:
    """A Celery protocol-2 task message as kombu's Redis transport LPUSHes it onto ``queue``, stamped with
    ``sent_at`` (``keys.SENT_AT_HEADER``) as every Celery publish of the fleet is, and carrying ``trace``
    (W3C ``traceparent``/``tracestate``, ``engram_api.tracing.carrier``) as headers, where Celery's
    OpenTelemetry instrumentation reads a task's parent context."""
    body = json.dumps([list(args), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    headers: dict[str, object] = {
        "lang": "py", "task": task, "id": task_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
        "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}", "origin": _ORIGIN,
        "ignore_result": True, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        keys.SENT_AT_HEADER: sent_at, **(trace or {}),
    }  # fmt: skip
    return json.dumps(
        {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def task_ref(message: str | bytes | dict[str, Any]) -> tuple[str, str] | None:
    """The task name and message reference (``user_id:message_id``) of a kombu message (protocol 2, base64
    JSON body); ``None`` for anything else."""
    try:
        envelope = message if isinstance(message, dict) else json.loads(message)
        task = envelope["headers"]["task"]
        body = json.loads(base64.b64decode(envelope["body"]))
        user_id, message_id = body[0][:2]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return (task, f"{user_id}:{message_id}") if isinstance(user_id, str) and isinstance(message_id, str) else None


def sent_at(raw: str | bytes) -> float | None:
    """The publish stamp (``keys.SENT_AT_HEADER``) of a raw kombu message, or None when it has none (a
    message published by an older Engram) or is not a task message."""
    try:
        stamp = json.loads(raw)["headers"][keys.SENT_AT_HEADER]
    except (ValueError, KeyError, TypeError):
        return None
    return float(stamp) if isinstance(stamp, int | float) else None


def tasks_in_broker(client: redis.Redis) -> Iterator[tuple[str, str]]:
    """``(task name, "user_id:message_id")`` of every Engram stage task queued or reserved in the broker:
    read in pages of the stage queues' lists (every priority step) and kombu's ``unacked`` hash."""
    for queue in (keys.EXTRACT_QUEUE, keys.APPLY_QUEUE):
        for name in keys.queue_lists(queue):
            start = 0
            while page := client.lrange(name, start, start + _PAGE - 1):
                yield from filter(None, map(task_ref, page))
                start += _PAGE
    for _, value in client.hscan_iter(keys.kombu_unacked(), count=_PAGE):
        try:
            message = json.loads(value)[0]
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if ref := task_ref(message):
            yield ref
