"""The Celery configuration of workers, Beat, Flower and every other Celery client (event receivers, test
probes), declared once. Queue names and task routes come from ``engram_api.keys``, which the producer's
Lua enqueue uses too; nothing under ``engram_api`` imports Celery or kombu.

Every Celery client of the broker must agree on the transport options (the visibility timeout in
particular, or the shortest one wins and tasks run twice): build them with ``make_celery``. Celery is
imported lazily so that importing this module costs nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from engram_api import keys
from engram_api.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["celery_config", "make_celery"]


def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every task message this process publishes (hand-overs, retries, Beat's jobs) carries its publish time,
    as the producer's enqueue does: the queue-lag metric reads it from the oldest waiting message."""
    if headers is not None:
        headers[keys.SENT_AT_HEADER] = time.time()


def celery_config(settings: Settings, broker_url: str) -> dict[str, Any]:
    from celery.signals import before_task_publish
    from kombu import Queue

    from engram_workers.broker import TRANSPORT

    # Every Celery client of the broker builds its config here; connecting twice is a no-op.
    before_task_publish.connect(_stamp_sent_at)
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        # Restore a dead worker's unacked messages promptly (kombu sweeps every interval x throttle).
        "unacked_restore_throttle": 1,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "retry_on_timeout": True,
        "health_check_interval": 10,
    }
    return {
        "broker_url": broker_url,
        # kombu's Redis transport keeping one client object per pool, not one per operation (see there)
        **({"broker_transport": TRANSPORT} if urlsplit(broker_url).scheme == "redis" else {}),
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "result_backend": None,
        # At-least-once: ack after the task ran; a killed pool child's message goes back to the queue.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Recycle prefork children (a fresh child reloads the encoder and starts with empty caches): bounds
        # what a slow leak or a fragmented heap can grow to. Celery counts memory in KiB; None is "never".
        "worker_max_tasks_per_child": settings.worker_max_tasks_per_child or None,
        "worker_max_memory_per_child": settings.worker_max_memory_per_child_mb * 1024 or None,
        # No single message or job may hold a pool slot forever: soft limit -> SoftTimeLimitExceeded (the
        # stage counts an error, retries, then dead-letters), hard limit -> the pool child is killed.
        # Celery's threads pool (extract) enforces neither; there the extractor's own input bounds hold.
        "task_soft_time_limit": settings.task_time_limit_s * 0.9,
        "task_time_limit": settings.task_time_limit_s,
        "task_annotations": {
            name: {
                "soft_time_limit": settings.maintenance_time_limit_s * 0.9,
                "time_limit": settings.maintenance_time_limit_s,
            }
            for name in keys.MAINTENANCE_TASKS
        },
        "task_default_queue": keys.EXTRACT_QUEUE,
        "task_queues": [Queue(name, routing_key=name) for name in keys.QUEUES],
        "task_routes": {task: {"queue": q, "routing_key": q} for task, q in keys.TASK_QUEUES.items()},
        # Task events are what Flower shows, and Flower turns them on in every worker it sees (the
        # ``enable_events`` broadcast, at its start and every 5 s), so by default a worker sends them only while
        # someone watches: ~7 events a message cost ~3 ms of worker CPU (docs/benchmarks/history.md, stop 30). "sent"
        # events come from hand-overs to apply and from Beat, never from the producer's Lua enqueue.
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "enable_utc": True,
        "timezone": "UTC",
    }


def make_celery(settings: Settings, broker_url: str, *, name: str = "engram") -> Celery:
    from celery import Celery

    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings, broker_url))
    return app
