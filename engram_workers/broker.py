"""The Celery broker transport for ``redis://`` URLs: kombu's Redis transport, with one redis-py client
object per channel and connection pool instead of one per operation.

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

Everything else is kombu's. ``celery_config`` selects this transport for ``redis://`` broker URLs only:
``rediss://`` (kombu turns TLS on by that scheme name), ``sentinel://`` and the rest keep kombu's own.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["TRANSPORT", "Channel", "Transport"]

TRANSPORT = f"{__name__}:Transport"  # what Celery's ``broker_transport`` names


class Channel(kombu_redis.Channel):
    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own client, which kombu already keeps (``Channel.client``)
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._shared_client
        if client is None or client.connection_pool is not pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
