"""The Celery broker transports (``celery_config.broker_connection`` picks one for every Redis URL):
kombu's Redis transport, and its Sentinel transport, with one redis-py client object per channel and
connection pool instead of one per operation, and keep-alive of held messages.

kombu 5.7's Redis channel builds a new ``redis.Redis`` object for every operation that is not the
consumer's own BRPOP (``Channel.conn_or_acquire`` -> ``_create_client``): the unacked-message bookkeeping
of every delivery and every ack, every publish. A client object is only a view over the channel's
connection pool (it holds no connection of its own), but building one costs ~56 us of Python (its
response-callback tables): 7 % of the extract worker's Python CPU in an ingest burst (py-spy GIL samples,
``ops/bench/profile_ingest.py``; docs/benchmarks/history.md, stop 31). Here a channel keeps the one it built until
its pool is replaced (``_disconnect_pools``: after a fork, a lost connection, a close), then builds one for
the new pool. A redis-py client is safe to share between threads: each command takes a connection from the
pool and gives it back. Measured (``ops/bench/client_cpu_ab.py``): a publish, delivery and ack cost 0.69x
the CPU they cost through kombu's transport.

Keep-alive: kombu hands a message out again once its ``unacked_index`` entry (the time it was delivered) is
older than the visibility timeout, whoever holds it. Alone, that forces a timeout longer than any task's run
plus its retry countdown (an hour), and a SIGKILLed worker's messages stay invisible that long. Here a
consuming worker's event loop re-stamps, every ``keep_alive_interval`` seconds (a transport option that
``celery_config`` sets to a quarter of the timeout), the entries of every message it still holds unacked
(running, prefetched, or waiting for a retry's ETA), with ``ZADD XX``: an entry acked or restored meanwhile
is never re-created. So only a dead worker's entries age: its messages are handed out again within the
timeout plus kombu's restore interval of its death, and a live worker's never are, however long they run.

A channel whose connection was closed under it (the consumer reconnecting after Redis went away) raises a
connection error to a late ack or reject, which Celery logs and survives, instead of kombu's AttributeError,
which stopped the worker (``tests/test_sentinel_failover.py``).

Sentinel: ``SentinelTransport`` is kombu's Sentinel channel with the same two changes; it reads the
Sentinels from a transport option (``SENTINELS_OPTION``) instead of kombu's ';'-separated broker URL, which
kombu's reconnect would switch to its own transport (``kombu.Connection.switch``). TLS: kombu's channel
takes ``broker_use_ssl`` (certificates verified, ``engram_api.connections.RedisTls``) whatever the
transport's name; only kombu's own handling of a bare ``rediss://`` turns the checks off, and Engram
never hands it one. Everything else is kombu's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from redis.sentinel import Sentinel

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_ALIVE_OPTION",
    "SENTINELS_OPTION",
    "SENTINEL_TRANSPORT",
    "TRANSPORT",
    "Channel",
    "SentinelChannel",
    "SentinelTransport",
    "Transport",
]

TRANSPORT = f"{__name__}:Transport"  # what Celery's ``broker_transport`` names
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
KEEP_ALIVE_OPTION = "keep_alive_interval"  # seconds; a transport option only this transport reads
SENTINELS_OPTION = "sentinels"  # [[host, port], ...]; read by ``SentinelChannel`` only


class Channel(kombu_redis.Channel):
    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            # Redis went away (a failover) and the consumer closed this channel's connection to reconnect,
            # while a task's ack or reject of one of its messages was still on its way here. kombu would fail
            # with an AttributeError that stops the worker; a connection error is what Celery logs and
            # survives, and the message, still in ``unacked``, is handed out again.
            raise redis.ConnectionError("this channel's broker connection was closed (reconnecting)")
        if asynchronous:  # the consumer's own client, which kombu already keeps (``Channel.client``)
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = super()._create_client()
        return client

    def keep_alive(self, now: float) -> int:
        """Re-stamp the ``unacked_index`` entries of the messages this channel holds; returns how many."""
        qos = self.qos
        try:
            # Acks of the threads pool run on its threads: copy first, and skip a round that raced one.
            held = [tag for tag in tuple(qos._delivered) if tag not in qos._dirty]
        except RuntimeError:
            return 0
        if not held:
            return 0
        with self.conn_or_acquire() as client:
            # XX: only entries that still exist (an acked or restored message is not brought back).
            client.zadd(self.unacked_index_key, dict.fromkeys(held, now), xx=True)
        return len(held)


class Transport(kombu_redis.Transport):
    Channel = Channel

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        cycle = self.cycle
        # A reconnect registers again: cancel the previous connection's timer, as kombu does with its own.
        old = getattr(cycle, "_keep_alive_tref", None)
        if old is not None:
            old.cancel()
        every = connection.client.transport_options.get(KEEP_ALIVE_OPTION)
        if every:
            cycle._keep_alive_tref = loop.call_repeatedly(float(every), self._keep_alive)

    def _keep_alive(self) -> None:
        now = time.time()
        for channel in list(self.cycle._channels):
            try:
                channel.keep_alive(now)
            except channel.connection_errors:
                # The connection is down: kombu reconnects; the next round (or the restore) catches up.
                log.debug("keep-alive of unacked messages skipped: connection error", exc_info=True)


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with this module's client sharing and keep-alive; the Sentinels come from
    the ``SENTINELS_OPTION`` transport option (kombu would read them from the broker URL's alternates)."""

    from_transport_options = (*kombu_redis.SentinelChannel.from_transport_options, SENTINELS_OPTION)
    sentinels: list[list[Any]] | None = None

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        if not self.sentinels or not getattr(self, "master_name", None):
            raise ValueError(f"the {SENTINELS_OPTION!r} and 'master_name' transport options must be set")
        params = self._connparams(asynchronous)
        params.pop("host", None)
        params.pop("port", None)
        manager = Sentinel(
            [(str(host), int(port)) for host, port in self.sentinels],
            min_other_sentinels=getattr(self, "min_other_sentinels", 0),
            sentinel_kwargs=getattr(self, "sentinel_kwargs", None),
            **params,
        )
        # Kept as kombu keeps its own, so that ``_disconnect_pools`` closes the Sentinels' connections too.
        if asynchronous:
            self._async_sentinel_manager = manager
        else:
            self._sentinel_manager = manager
        credentials = {k: params[k] for k in ("username", "password") if k in params}
        return manager.master_for(self.master_name, redis.Redis, **credentials).connection_pool


class SentinelTransport(Transport):
    default_port = kombu_redis.SentinelTransport.default_port
    Channel = SentinelChannel
