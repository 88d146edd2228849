"""A Redis near or at ``maxmemory`` refuses producers with ``BackPressureError`` while the workers can still
write: nothing half-enqueued, and room left to drain the queue (a Redis of its own, so its limits touch
no other test)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import redis

from engram_api import keys
from engram_api.errors import BackPressureError
from engram_api.producer import MemoryGuard, Producer
from engram_api.settings import Settings
from engram_workers.services import RedisServer


@pytest.fixture
def small_redis(tmp_path) -> Iterator[redis.Redis]:
    server = RedisServer(data_dir=tmp_path / "redis", appendonly=False)
    server.start()
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", "noeviction")
    yield client
    client.close()
    server.stop()


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def queued(client: redis.Redis) -> int:
    return int(client.llen(keys.queue_for(keys.EXTRACT_TASK)))


def test_producers_stop_at_the_headroom_while_workers_still_write(small_redis, tmp_path):
    producer = Producer(settings=Settings(data_dir=tmp_path), redis_client=small_redis)
    producer.enqueue("alice", "I live in Tampa.", message_id="m1")
    # Fill to ~95% of a limit set just above what Redis holds: past the producers' 90%, below maxmemory.
    small_redis.config_set("maxmemory", used(small_redis) + 4_000_000)
    limit = int(small_redis.config_get("maxmemory")["maxmemory"])
    for i in range(1_000):  # in small pieces: one big SET needs twice its size while Redis reads it
        if used(small_redis) >= 0.93 * limit:
            break
        small_redis.set(f"ballast:{i}", b"x" * 50_000)
    assert 0.9 * limit <= used(small_redis) < limit, "premise: between the headroom and the limit"
    producer.memory = MemoryGuard(small_redis, producer.settings.redis_memory_headroom)  # read afresh

    with pytest.raises(BackPressureError, match="maxmemory"):
        producer.enqueue("alice", "I moved to Austin.", message_id="m2")
    with pytest.raises(BackPressureError):
        producer.enqueue_many([{"user_id": "bob", "messages": "Hi, I'm Bob.", "message_id": "b1"}])
    assert queued(small_redis) == 1 and not small_redis.exists(keys.status("alice", "m2"))
    # What a worker writes (a lease, a status) still fits.
    assert small_redis.set("engram:lease:alice", "worker-1", ex=30)
    small_redis.hset(keys.status("alice", "m1"), "state", "applied")


def test_a_full_redis_refuses_the_enqueue_script_before_it_writes_anything(small_redis, tmp_path):
    producer = Producer(settings=Settings(data_dir=tmp_path, redis_memory_headroom=1.0), redis_client=small_redis)
    producer.enqueue("alice", "I live in Tampa.", message_id="m1")  # the guard has read: not full
    producer.memory.interval_s = math.inf  # ... and does not read again: the script meets the limit itself
    small_redis.config_set("maxmemory", used(small_redis) - 1)
    with pytest.raises(BackPressureError, match="Redis is full"):
        producer.enqueue("alice", "I moved to Austin.", message_id="m2")
    small_redis.config_set("maxmemory", 0)
    assert queued(small_redis) == 1
    assert not small_redis.exists(keys.message_payload("alice", "m2"), keys.status("alice", "m2"))
    assert small_redis.zcard(keys.pending("alice")) == 1
