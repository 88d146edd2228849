"""Pipeline stages as plain functions; ``engram_workers.tasks`` binds them to Celery.

A stage either finishes (returns a short outcome string), asks to run again later (``RetryLater``), or
gives up on the message (it dead-letters it itself and returns).
"""

from engram_workers.stages.common import RetryLater

__all__ = ["RetryLater"]
