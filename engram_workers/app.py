"""The Celery application of workers and Beat. Configuration comes from ``engram_workers.celery_config``
(the broker's, a worker's and RedBeat's) and is resolved lazily, on first use, so importing this module
connects to nothing.

Invariant: ``celery -A engram_workers.app worker|beat`` runs as ``engram worker`` and ``engram beat`` do
(every setting is here or in ``celery_config``): a worker never gossips or mingles, and Beat is RedBeat
with its leader lock. The CLI only starts processes, adding what a managed process needs: a stage's
queues, pool and node name, the probes' heartbeat file, the metrics port.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    worker_init,
    worker_process_shutdown,
)

__all__ = ["app", "configured"]


def _config() -> dict[str, Any]:
    from beat_schedule import build_schedule
    from engram_api.connections import resolve_redis_url
    from engram_api.settings import load_settings
    from engram_workers.celery_config import beat_config, celery_config, worker_config

    settings = load_settings()
    redis_url = resolve_redis_url(settings)
    config = {**celery_config(settings, redis_url), **worker_config(settings), **beat_config(settings, redis_url)}
    config["beat_schedule"] = build_schedule(settings)
    config["include"] = ["engram_workers.tasks"]
    return config


app = Celery("engram", set_as_current=True)
app.add_defaults(_config)


def configured() -> Celery:
    """The app with Engram's configuration, resolving it again if its lazy load failed: Celery drops a lazy
    configuration that raised (no Redis resolvable when the conf was first read), which would leave a
    process publishing later with Celery's defaults (an AMQP broker on localhost)."""
    if app.conf.broker_url is None:
        app.conf.update(_config())
    return app


@worker_init.connect
def _no_gossip_or_mingle(sender: Any, **_: Any) -> None:
    """Gossip and mingle only add chatter and start-up delay (a second of mingle at every start): Engram keeps
    no state in them. Off in every worker of this app, however it was started (the options reach the
    consumer's steps after this signal)."""
    if sender.app is app:
        sender.options.update(without_gossip=True, without_mingle=True)


@worker_init.connect
def _tracing(sender: Any, **_: Any) -> None:
    """``ENGRAM_TRACING``: the worker exports spans, and Celery's instrumentation makes each task's run span
    a child of the context its message carries (the producer's enqueue, or the stage that published it).
    Set up before the pool starts: prefork children inherit it (``engram_api.tracing``)."""
    from engram_api import tracing
    from engram_api.settings import load_settings

    if sender.app is app and tracing.configure(load_settings(), service="engram-worker"):
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


@worker_process_shutdown.connect
def _flush_spans(**_: Any) -> None:
    """A prefork child exits without running ``atexit``: its buffered spans go out first."""
    from engram_api import tracing

    tracing.flush()


@beat_init.connect
def _beat_publishing(sender: Any, **_: Any) -> None:
    """Beat's own publishing options (``BEAT_PUBLISHING``), set before its first tick sends anything."""
    from engram_workers.celery_config import BEAT_PUBLISHING

    if sender.app is app:
        app.conf.update(BEAT_PUBLISHING)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redacted_logs(logger: logging.Logger, **_: Any) -> None:
    """Credentials never reach a log line (URLs with passwords, provider errors echoing a key)."""
    from engram_api.redaction import RedactingFilter
    from engram_api.settings import load_settings

    redacting = RedactingFilter(load_settings().secrets)
    for handler in logger.handlers:
        handler.addFilter(redacting)


@after_setup_logger.connect
def _no_received_lines(loglevel: int | None = None, **_: Any) -> None:
    """Celery's "Task ... received" line, one per task in the consumer's thread (the extract worker's busiest),
    says nothing the stage's own line (``LoggingMiddleware``: outcome, ids, seconds) and Celery's
    "succeeded" line do not: off unless the worker runs at DEBUG. Retries, failures and rejects keep their
    lines (``celery.app.trace``)."""
    if loglevel is None or loglevel > logging.DEBUG:
        logging.getLogger("celery.worker.strategy").setLevel(logging.WARNING)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger: logging.Logger, **_: Any) -> None:
    """ENGRAM_LOG_FORMAT=json: one JSON object a line, with user and message ids as fields."""
    from engram_api.settings import load_settings

    if load_settings().log_format != "json":
        return
    from pythonjsonlogger.json import JsonFormatter

    formatter = JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"asctime": "time"})
    for handler in logger.handlers:
        handler.setFormatter(formatter)
