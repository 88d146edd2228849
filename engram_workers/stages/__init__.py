"""Pipeline stages as plain functions; ``engram_workers.tasks`` binds them to Celery.

A stage either finishes (returns a ``StageResult``: a ``StageOutcome`` the metrics count and a detail for
the log), asks to run again later (``RetryLater``), or gives up on the message (it dead-letters it itself
and returns a ``StageResult`` saying so).
"""

from engram_workers.stages.common import RetryLater

__all__ = ["RetryLater"]
