"""The per-user version in Redis: bumped by every writer, read by every reader's cache."""

from __future__ import annotations

import redis

from engram_api import keys

__all__ = ["publish_version", "read_version"]

_MAX = (
    "local v = tonumber(redis.call('GET', KEYS[1]) or '-1') "
    "if tonumber(ARGV[1]) > v then redis.call('SET', KEYS[1], ARGV[1]) end return 1"
)


def publish_version(client: redis.Redis, user_id: str, version: int) -> None:
    """Only ever moves forward, so a slow writer cannot roll a reader's view back."""
    client.eval(_MAX, 1, keys.user_version(user_id), version)


def read_version(client: redis.Redis, user_id: str) -> int | None:
    raw = client.get(keys.user_version(user_id))
    return int(raw) if raw is not None else None
