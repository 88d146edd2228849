"""Where the services are: resolves Redis for clients, including the embedded one ``engram up`` runs.

``engram up`` / ``engram demo`` start an embedded Redis and record its URL in
``ENGRAM_DATA_DIR/services.json``; a client with no ``REDIS_URL`` finds it there, so a newcomer's
scripts work against the embedded stack without configuration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from engram_api.errors import ConfigError
from engram_api.settings import Settings

if TYPE_CHECKING:
    import redis

__all__ = ["SERVICES_FILE", "redis_client", "resolve_redis_url", "write_services_file"]

SERVICES_FILE = "services.json"


def _services_path(settings: Settings) -> Path:
    return settings.data_dir / SERVICES_FILE


def write_services_file(settings: Settings, **urls: str) -> Path:
    """Written 0600: the embedded Redis's URL carries its password."""
    path = _services_path(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file from before may have other bits
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(urls))
    return path


def resolve_redis_url(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    try:
        url = json.loads(_services_path(settings).read_text()).get("redis_url")
    except (OSError, ValueError):
        url = None
    if not url:
        raise ConfigError(
            "REDIS_URL",
            f"not set and no embedded Redis is running for {settings.data_dir} "
            "(start one with `engram up`, or set REDIS_URL=redis://host:port/0)",
        )
    return str(url)


def redis_client(url: str, *, timeout_s: float = 10.0, decode_responses: bool = True) -> redis.Redis:
    """Every Redis client Engram opens (producer, reader, workers, breaker, rate limiter, metrics, CLI).

    ``decode_responses``: every value Engram keeps in Redis is text (JSON or counters); callers that only
    count or run scripts returning numbers may skip decoding. ``timeout_s`` bounds each command and the
    connect, so a Redis that is away is an error, not a hang.
    """
    # Imported here: resolving the URL (a stopped embedded fleet has none) must not cost the redis import.
    import redis

    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, 5.0),
        health_check_interval=30,
    )
