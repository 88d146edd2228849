"""What a piece of code asked Redis: command counts (INFO commandstats) and keys looked up (INFO stats'
keyspace hits and misses), on a Redis no other test shares, so the counts are this code's alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from engram_workers.services import RedisServer

__all__ = ["Counted", "counted", "private_redis_fixture"]


@pytest.fixture(scope="module", name="private_redis")
def private_redis_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """``private_redis``: a Redis of the test module's own (no AOF), as a client that decodes replies
    (import this function into the module: pytest finds the fixture there)."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()
        server.stop()


class Counted:
    """Filled when the ``counted`` block ends: calls per command (lower case) and keys looked up."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lookups = 0

    def __getitem__(self, command: str) -> int:
        return self.calls.get(command, 0)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@contextmanager
def counted(client: redis.Redis) -> Iterator[Counted]:
    """Count what the block sends ``client``'s server (the counters are reset first; the INFO calls that
    read them are not counted)."""
    client.config_resetstat()
    result = Counted()
    yield result
    stats, commands = client.info("stats"), client.info("commandstats")
    result.calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in commands.items()}
    for own in ("info", "config"):  # the reset and the reads of the counters
        result.calls.pop(own, None)
    result.lookups = int(stats["keyspace_hits"]) + int(stats["keyspace_misses"])
