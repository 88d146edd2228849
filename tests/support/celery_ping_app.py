"""The smallest real Celery app: one task on its own queue, Redis as broker and result backend.

Workers load it with ``celery -A tests.support.celery_ping_app worker -Q ping`` and ``REDIS_URL`` in
their environment; the test process builds its own client with :func:`make_app` and the same URL.
"""

from __future__ import annotations

import os

from celery import Celery

QUEUE = "ping"


def make_app(redis_url: str) -> Celery:
    app = Celery("engram_ping", broker=redis_url, backend=redis_url)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        worker_prefetch_multiplier=1,
    )

    @app.task(name="ping")
    def ping(x: int) -> int:
        return x + 1

    return app


# For the worker command line (`-A tests.support.celery_ping_app` looks for `app`); building a Celery
# object connects to nothing.
app = make_app(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
