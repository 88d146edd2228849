"""The Celery configuration of workers, Beat, Flower and every other Celery client (event receivers, test
probes), declared once. Queue names and task routes come from ``engram_api.keys``, which the producer's
Lua enqueue uses too; nothing under ``engram_api`` imports Celery or kombu.

Three parts, by role:
- ``celery_config``: what every Celery client of the broker must agree on (the transport options, the
  visibility timeout in particular, or the shortest one wins and tasks run twice): build a client with
  ``make_celery``; the keep-alive and restore intervals derive from the timeout (``redelivery_bound_s``:
  how long a SIGKILLed worker's messages stay out of reach);
- ``worker_config`` and ``stage_defaults``: what a worker runs with (``stage_defaults`` is a stage's
  queues, pool and concurrency; ``worker_config`` the defaults of a worker started without a stage);
- ``beat_config``: RedBeat, the scheduler with a leader lock in Redis.
Where Redis is and how it is reached (directly, through Sentinel, over verified TLS) comes from one
``engram_api.connections.RedisTarget`` for all three, as for every redis-py client (``broker_connection``,
``beat_config``): kombu never sees a bare ``rediss://`` (it would turn certificate checks off), and every
scheme runs Engram's transport (``engram_workers.broker``), so a worker keeps its held messages alive
whichever way it reaches Redis.
``engram_workers.app`` (the app ``celery -A engram_workers.app worker|beat`` loads) holds all three, so
a plain ``celery`` command runs as ``engram worker`` and ``engram beat`` do; the CLI only starts processes.
Celery is imported lazily so that importing this module costs nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from engram_api import keys
from engram_api.connections import RedisTarget, redis_target, sentinel_tls
from engram_api.settings import Settings
from engram_workers.cpus import usable_cpus

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "BEAT_LOCK_TIMEOUT_S",
    "BEAT_MAX_INTERVAL_S",
    "BEAT_PUBLISHING",
    "beat_config",
    "broker_connection",
    "celery_config",
    "keep_alive_s",
    "make_celery",
    "redelivery_bound_s",
    "restore_interval_s",
    "stage_defaults",
    "worker_config",
]


def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every task message this process publishes (hand-overs, retries, Beat's jobs) carries its publish time,
    as the producer's enqueue does: the queue-lag metric reads it from the oldest waiting message."""
    if headers is not None:
        headers[keys.SENT_AT_HEADER] = time.time()


def keep_alive_s(settings: Settings) -> float:
    """How often a worker re-stamps the messages it holds: four chances before the visibility timeout."""
    return settings.visibility_timeout_s / 4


def restore_interval_s(settings: Settings) -> float:
    """How often each consuming worker hands out again what a dead worker held (kombu's restore scan)."""
    return min(10.0, settings.visibility_timeout_s / 6)


def redelivery_bound_s(settings: Settings) -> float:
    """Seconds from a worker's SIGKILL until every message it held is back on its queue: its last keep-alive
    is at most the timeout old by then, and the next restore scan of a live worker takes it (docs/operations.md,
    "When a worker dies")."""
    return settings.visibility_timeout_s + restore_interval_s(settings)


def broker_connection(target: RedisTarget) -> dict[str, Any]:
    """Celery's broker settings for ``target``: URL, transport, TLS and the Sentinel options.

    Through Sentinel kombu gets one ``sentinel://`` URL and the Sentinels as a transport option, not its
    ';'-separated form: kombu would switch such a connection to its own transport on a reconnect.
    """
    from engram_workers.broker import SENTINEL_TRANSPORT, SENTINELS_OPTION, TRANSPORT

    if target.url.startswith("unix://"):  # kombu has no transport for it: its own error says so, as before
        return {"broker_url": target.url, "broker_transport_options": {}}
    if target.sentinel is None:
        return {
            "broker_url": target.url,
            "broker_transport": TRANSPORT,
            "broker_use_ssl": target.tls.options() if target.tls else None,
            "broker_transport_options": {},
        }
    node = target.sentinel
    auth = ""
    if node.password is not None:
        auth = f"{quote(node.username or '', safe='')}:{quote(node.password, safe='')}@"
    host, port = node.nodes[0]
    return {
        "broker_url": f"sentinel://{auth}{host}:{port}/{node.db}",
        "broker_transport": SENTINEL_TRANSPORT,
        # The primary's TLS (kombu's Sentinel channel then picks redis-py's Sentinel-managed TLS connection).
        "broker_use_ssl": target.tls.options() if target.tls else None,
        "broker_transport_options": {
            "master_name": target.master,
            SENTINELS_OPTION: [list(n) for n in node.nodes],
            "sentinel_kwargs": {
                "password": target.sentinel_password,
                "socket_timeout": 5,
                "socket_connect_timeout": 5,
                **sentinel_tls(target),
            },
        },
    }


def celery_config(settings: Settings, broker_url: str) -> dict[str, Any]:
    from celery.signals import before_task_publish
    from kombu import Queue

    from engram_workers.broker import KEEP_ALIVE_OPTION

    broker = broker_connection(redis_target(broker_url, settings))
    # Every Celery client of the broker builds its config here; connecting twice is a no-op.
    before_task_publish.connect(_stamp_sent_at)
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        # Live workers re-stamp what they hold (``engram_workers.broker``), so only a dead worker's messages
        # outgrow the timeout, however long a task runs or waits for its countdown.
        KEEP_ALIVE_OPTION: keep_alive_s(settings),
        # Restore a dead worker's unacked messages promptly: kombu scans every interval x throttle seconds,
        # and a restorer that dies holding kombu's restore mutex blocks the others only for one interval.
        "unacked_restore_interval": restore_interval_s(settings),
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": max(1, round(restore_interval_s(settings))),
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "retry_on_timeout": True,
        "health_check_interval": 10,
        # The deployment's prefix before every key and channel kombu writes (queues, unacked, bindings,
        # pidbox), as before Engram's own (``engram_api.keys``): deployments share a database apart.
        "global_keyprefix": keys.DEPLOYMENT_PREFIX,
        **broker.pop("broker_transport_options"),
    }
    return {
        # kombu's Redis transport keeping one client object per pool and held messages alive (see there)
        **broker,
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


def stage_defaults(stage: str, cpu_limit: float | None = None) -> tuple[list[str], str, int]:
    """(queues, pool, concurrency) of a stage; prefork stages size to the CPUs the container may use
    (``cpu_limit``, ENGRAM_CPU_LIMIT, else the cgroup quota: ``engram_workers.cpus``)."""
    cpus = usable_cpus(cpu_limit)
    return {
        # Extraction waits on the LLM: many threads in one process keep many calls in flight.
        "extract": ([keys.EXTRACT_QUEUE], "threads", 32),
        # Apply is CPU and database work under a per-user lock: one process per core.
        "apply": ([keys.APPLY_QUEUE], "prefork", cpus),
        # Maintenance walks every user; one job at a time is plenty at its hourly-to-daily cadence.
        "maintenance": ([keys.MAINTENANCE_QUEUE], "prefork", 1),
        "all": (list(keys.QUEUES), "prefork", cpus),
    }[stage]


def worker_config(settings: Settings) -> dict[str, Any]:
    """A worker started without a stage (plain ``celery worker``) is stage "all": every queue (Celery's
    default, ``task_queues``), prefork, and one child per usable CPU, not per core of the node (Celery's
    default would fork 64 children in a 2-CPU pod on a 64-core node)."""
    _, pool, concurrency = stage_defaults("all", settings.cpu_limit)
    return {"worker_pool": pool, "worker_concurrency": concurrency}


# Beat wakes at least this often; a standby Beat takes over within the lock timeout after the leader dies.
BEAT_MAX_INTERVAL_S = 5
BEAT_LOCK_TIMEOUT_S = 5 * BEAT_MAX_INTERVAL_S

# What Beat publishes with, whatever the workers do (``engram_workers.app`` applies it when Beat starts):
# a few sends a minute, whose "sent" events (naming the scheduler's pid) always go, whatever
# ENGRAM_TASK_EVENTS says, so Flower shows when Beat fired a job and which Beat fired it.
BEAT_PUBLISHING = {"task_send_sent_event": True}


def beat_config(settings: Settings, redis_url: str) -> dict[str, Any]:
    """RedBeat keeps the schedule and a leader lock in Redis: any number of Beat processes fire each job
    once (the others wait for the lock). Only Beat reads these settings. Through Sentinel RedBeat asks the
    Sentinels for the primary (its ``redis-sentinel`` URL is only that marker); over TLS it verifies as
    every other client does (``redbeat_redis_use_ssl``)."""
    target = redis_target(redis_url, settings)
    # Ride out a short Redis restart; a longer outage ends this Beat (its lock may have passed on).
    options: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5, "retry_period": BEAT_LOCK_TIMEOUT_S}
    if target.sentinel is not None:
        node = target.sentinel
        del options["socket_connect_timeout"]  # RedBeat's Sentinel client takes socket_timeout only
        options |= {
            "sentinels": [list(n) for n in node.nodes],
            "service_name": target.master,
            "db": node.db,
            "username": node.username,
            "password": node.password,
            "sentinel_kwargs": {"password": target.sentinel_password, "socket_timeout": 5, **sentinel_tls(target)},
        }
    return {
        "beat_scheduler": "redbeat.RedBeatScheduler",
        "beat_max_loop_interval": BEAT_MAX_INTERVAL_S,
        "redbeat_redis_url": "redis-sentinel://" if target.sentinel is not None else redis_url,
        "redbeat_redis_use_ssl": target.tls.options() if target.tls else None,
        "redbeat_key_prefix": keys.BEAT_PREFIX,
        "redbeat_lock_key": keys.BEAT_LOCK,
        "redbeat_lock_timeout": BEAT_LOCK_TIMEOUT_S,
        "redbeat_redis_options": options,
    }
