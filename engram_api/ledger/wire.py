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
import functools
import json
import os
import re
import socket
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from engram_api import keys

if TYPE_CHECKING:
    import redis

__all__ = ["sent_at", "task_message", "task_ref", "tasks_in_broker"]

_ORIGIN = f"engram-producer@{socket.gethostname()}"
_PAGE = 1000


# Placeholders in the message ``_parts`` lays out; json.dumps writes each as a quoted string.
_ID, _BODY, _ARGS, _SENT, _TAG = (f"\x01{name}\x01" for name in ("id", "body", "args", "sent", "tag"))
_PLACEHOLDER = re.compile(r'"\\u0001(\w+)\\u0001"')
_BODY_TAIL = ', {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
_json_str = json.encoder.encode_basestring_ascii  # json.dumps' own encoding of a str (ensure_ascii)


@functools.cache
def _parts(task: str, queue: str) -> tuple[str, ...]:
    """A task's message text for ``queue`` as ``json.dumps`` writes it, cut at the values every publish
    sets (in order: body, id, id, argsrepr, sent_at, id, delivery tag): the text between them is the same
    for every message of the task, so a message is a concatenation, not a JSON encoding (issue 45: the
    encoding was the largest part of the producer's own time)."""
    headers: dict[str, object] = {
        "lang": "py", "task": task, "id": _ID, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": _ID,
        "parent_id": None, "argsrepr": _ARGS, "kwargsrepr": "{}", "origin": _ORIGIN,
        "ignore_result": True, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        keys.SENT_AT_HEADER: _SENT,
    }  # fmt: skip
    text = json.dumps(
        {
            "body": _BODY,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": _ID,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": _TAG,
            },
        }
    )
    cut = _PLACEHOLDER.split(text)
    assert cut[1::2] == ["body", "id", "id", "args", "sent", "id", "tag"], "json.dumps keeps a dict's order"
    return tuple(cut[::2])


def task_message(
    task: str, task_id: str, args: tuple[str, ...], queue: str, sent_at: float, trace: Mapping[str, str] | None = None
) -> str:
    """A Celery protocol-2 task message as kombu's Redis transport LPUSHes it onto ``queue``, stamped with
    ``sent_at`` (``keys.SENT_AT_HEADER``) as every Celery publish of the fleet is, and carrying ``trace``
    (W3C ``traceparent``/``tracestate``, ``engram_api.tracing.carrier``) as headers, where Celery's
    OpenTelemetry instrumentation reads a task's parent context. The text is exactly what ``json.dumps``
    of the message writes (``_parts``); its delivery tag, kombu's key for it in ``unacked``, is 128 random
    bits, fresh for every message (kombu writes a UUID4: any unique string serves)."""
    body = base64.b64encode(f"[[{', '.join(map(_json_str, args))}]{_BODY_TAIL}".encode()).decode()
    tid = _json_str(task_id)
    after_sent = "".join(f", {_json_str(k)}: {_json_str(v)}" for k, v in trace.items()) if trace else ""
    p = _parts(task, queue)
    return (
        f'{p[0]}"{body}"{p[1]}{tid}{p[2]}{tid}{p[3]}{_json_str(repr(args))}{p[4]}{float(sent_at)!r}{after_sent}'
        f'{p[5]}{tid}{p[6]}"{os.urandom(16).hex()}"{p[7]}'
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
