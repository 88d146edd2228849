"""The broker transport (``engram_workers.broker``): kombu's Redis transport keeping one client object per
connection pool. Real Redis; the fleet and chaos suites run every worker on it too (Redis restarts
included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from celery import Task
from celery.exceptions import Reject

from engram_api.errors import ConfigError
from engram_api.settings import Settings
from engram_workers.broker import Channel, SentinelTransport, Transport
from engram_workers.celery_config import make_celery
from engram_workers.tasks import _retry as retry_or_requeue  # the retry every stage's task asks for
from tests.support.gateway import free_port


@pytest.mark.parametrize(
    ("url", "transport"),
    [
        ("redis://127.0.0.1:6379/0", Transport),
        ("rediss://127.0.0.1:6379/0", Transport),  # TLS from broker_use_ssl, verified (tests/test_redis_topology.py)
        ("sentinel://127.0.0.1:26379", SentinelTransport),
    ],
)
def test_every_redis_url_gets_the_transport(url: str, transport: type) -> None:
    connection = make_celery(Settings(), url).connection_for_write()
    assert type(connection.transport) is transport


def test_a_url_the_settings_refuse_builds_no_celery_client() -> None:
    with pytest.raises(ConfigError, match="REDIS_URL"):
        make_celery(Settings(), "redis+socket:///tmp/redis.sock")


def test_a_channel_reuses_one_client_until_its_pool_is_replaced(redis_url: str) -> None:
    app = make_celery(Settings(), redis_url)
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
            assert first.ping()
        old_pool = channel.pool
        channel._disconnect_pools()  # as kombu does after a fork or a lost connection
        with channel.conn_or_acquire() as third:
            assert third is not first
            assert third.connection_pool is channel.pool is not old_pool
            assert third.ping()


def test_messages_are_delivered_acked_and_their_unacked_bookkeeping_cleared(redis_url: str) -> None:
    """A delivery records the message as unacked (the visibility-timeout restore reads it), the ack removes
    it: both through the shared client."""
    app = make_celery(Settings(), redis_url)
    probe = redis.Redis.from_url(redis_url)
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue("engram-test-broker")
        try:
            for n in range(5):
                queue.put({"n": n})
            got = []
            for _ in range(5):
                message = queue.get(timeout=5)
                got.append(message.payload["n"])
                tag = message.delivery_tag
                assert probe.hexists("unacked", tag)  # held as unacked until the ack
                assert probe.zscore("unacked_index", tag) is not None
                message.ack()
                assert not probe.hexists("unacked", tag)
                assert probe.zscore("unacked_index", tag) is None
            assert sorted(got) == [0, 1, 2, 3, 4]
        finally:
            queue.clear()
            queue.close()


def test_a_retry_that_cannot_be_published_puts_the_message_back_instead_of_dropping_it(tmp_path: Path) -> None:
    """A stage asks for a retry while the broker is away: Celery cannot publish the retry and would
    ``Reject(requeue=False)`` (the message dropped); the worker's fallback turns it into a requeue."""
    app = make_celery(Settings(data_dir=tmp_path), f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    app.conf.broker_connection_retry = False
    app.conf.task_publish_retry = False  # fail at once: the retry's publish, not the test, is what is slow

    @app.task(bind=True, name="engram.test.retried")
    def retried(self: Task) -> None:
        """A task of that app, only ever asked to retry here."""

    retried.push_request(id="t-1", retries=0, called_directly=False, delivery_info={})
    try:
        outcome = retry_or_requeue(retried, 1.0)
    finally:
        retried.pop_request()
    assert isinstance(outcome, Reject) and outcome.requeue is True
    assert "could not schedule the retry" in str(outcome.reason)
