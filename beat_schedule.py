"""Celery Beat's schedule, as data. Intervals come from settings (``ENGRAM_DECAY_INTERVAL_S`` ...).

Every entry carries ``expires`` (a run that waited longer than its interval is dropped rather than run
late on top of the next one) and goes to the maintenance queue. The jobs are idempotent: decay is computed
from elapsed time, the others converge to the same state, so an extra run is harmless. Decay, hierarchy,
reconcile and reembed fire as drivers (``fan_out``) that send per-user tasks (``engram_workers.maintenance.fanout``).
"""

from __future__ import annotations

from typing import Any

from engram_api import keys
from engram_api.settings import Settings
from engram_api.storage.writer.changes import FANNED_OUT

__all__ = ["JOBS", "build_schedule"]

# job name -> (task, settings field holding its interval in seconds)
JOBS: dict[str, tuple[str, str]] = {
    "decay": (keys.DECAY_TASK, "decay_interval_s"),
    "hierarchy": (keys.HIERARCHY_TASK, "hierarchy_interval_s"),
    "weights": (keys.WEIGHTS_TASK, "weights_interval_s"),
    "reconcile": (keys.RECONCILE_TASK, "reconcile_interval_s"),
    "redeliver": (keys.REDELIVER_TASK, "redeliver_interval_s"),
    "reembed": (keys.REEMBED_TASK, "reembed_interval_s"),
}


def build_schedule(settings: Settings) -> dict[str, Any]:
    schedule = {}
    for name, (task, field) in JOBS.items():
        interval = float(getattr(settings, field))
        schedule[f"engram-{name}"] = {
            "task": task,
            "schedule": interval,
            "options": {"queue": keys.queue_for(task), "expires": interval},
        }
        if name in FANNED_OUT:
            schedule[f"engram-{name}"]["kwargs"] = {"fan_out": True}
    return schedule
