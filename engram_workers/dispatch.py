"""Publishing a task from inside the pipeline: the one seam between the stages and Celery.

Stages and maintenance jobs are plain functions: they publish through ``WorkerResources.dispatch`` (or a
``send`` argument), a :data:`Dispatch`, and never import the Celery app. In a worker it is
:func:`send`; tests, benchmarks and chaos scripts may inject their own. The queue is never chosen
here: the app's ``task_routes`` (built from ``engram_api.keys.TASK_QUEUES``) route every task name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["Dispatch", "celery_dispatch", "send"]

Dispatch = Callable[[str, tuple[str, ...]], object]
"""``dispatch(task_name, args)`` publishes the task on its queue."""


def celery_dispatch(app: Celery) -> Dispatch:
    """A dispatcher publishing through ``app`` (one configured by ``celery_config.make_celery``)."""

    def dispatch(task: str, args: tuple[str, ...]) -> object:
        return app.send_task(task, args=args)

    return dispatch


def send(task: str, args: tuple[str, ...]) -> object:
    """Publish through the worker's own Celery app (imported on first use: it is the worker's, not the stage's)."""
    from engram_workers.app import configured

    return configured().send_task(task, args=args)
