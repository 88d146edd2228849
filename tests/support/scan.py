"""Byte scans for erasure tests: which files under a directory, and which Redis keys, still hold a word."""

from __future__ import annotations

from pathlib import Path

import redis

__all__ = ["file_hits", "redis_hits"]


def file_hits(root: Path, needles: list[str]) -> dict[str, list[str]]:
    """needle -> the files under ``root`` whose bytes contain it (case-insensitive)."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes().lower()
        for needle in needles:
            if needle.lower().encode() in data:
                found.setdefault(needle, []).append(str(path.relative_to(root)))
    return found


_READ = {  # a key's whole value, by type
    "string": lambda c, k: c.get(k),
    "hash": lambda c, k: c.hgetall(k),
    "list": lambda c, k: c.lrange(k, 0, -1),
    "set": lambda c, k: c.smembers(k),
    "zset": lambda c, k: c.zrange(k, 0, -1),
    "stream": lambda c, k: c.xrange(k),
}


def redis_hits(url: str, needles: list[str]) -> dict[str, list[str]]:
    """needle -> the keys of any database whose name or value contains it."""
    found: dict[str, list[str]] = {}
    base = redis.Redis.from_url(url)
    databases = [int(name[2:]) for name in base.info("keyspace")]
    base.close()
    for number in databases:
        client = redis.Redis.from_url(url, db=number)
        for key in client.scan_iter(count=1000):
            blob = (key + repr(_READ[client.type(key).decode()](client, key)).encode()).lower()
            for needle in needles:
                if needle.lower().encode() in blob:
                    found.setdefault(needle, []).append(f"db{number}:{key.decode(errors='replace')}")
        client.close()
    return found
