"""Fault-injection middleware for tests (loaded by workers through ENGRAM_MIDDLEWARE)."""

from __future__ import annotations

import os
from pathlib import Path

from engram_api.models import ApplyOutcome
from engram_api.settings import load_settings
from engram_workers.middleware import Middleware


class CrashAfterWriteOnce(Middleware):
    """Kill the worker process right after the graph commit of a message whose id starts with
    ``crash-after-write``, once per message (a marker file remembers it across the restart)."""

    def after_write(self, user_id: str, message_id: str, outcome: ApplyOutcome) -> None:
        if not message_id.startswith("crash-after-write"):
            return
        marker = Path(load_settings().data_dir) / "faults" / f"crashed-{message_id}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os._exit(1)  # no cleanup, no ack: exactly what a crash looks like


class CrashAlways(Middleware):
    """A poison message: every attempt to process ``poison-*`` kills the worker process."""

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        if message_id.startswith("poison-") and stage == "apply":
            os._exit(1)
