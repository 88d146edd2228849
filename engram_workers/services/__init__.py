"""Processes ``engram up`` and ``engram demo`` run on this machine: the embedded Redis
(:class:`RedisServer`) and Celery worker/Beat/Flower children (``celery_worker.ManagedProcess``).

Only what a wheel install needs at run time lives here. Test doubles and development-only launchers
(the LLM stand-in, the Neo4j launcher) are in the top-level ``engram_testing`` package of the source
tree, which the wheel does not ship.
"""

from __future__ import annotations

from engram_workers.services.process import ServiceProcess, ServiceStartError
from engram_workers.services.redis_server import RedisServer

__all__ = ["RedisServer", "ServiceProcess", "ServiceStartError"]
