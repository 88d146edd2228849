"""Readers learn of a published stamp without a read: writers send each stamp that moves forward on a
Redis channel (``publish_stamp``, ``keys.stamps_channel``), and each reader process listens on one daemon
thread and hands every stamp to the reader's ``signalled_stamp``, which drops the results and records kept at
older stamps of that user and catches up the copies it holds (``CatchUps``) before the user's next recall.

    StampSignals(redis, reader.signalled_stamp).start()   # MemoryClient.reader, once per process
    ... .stop()                                           # MemoryClient.close

Invariants: a signal is a hint, never the truth. Redis pub/sub is at most once: a message sent while this
process is not subscribed (starting, reconnecting after Redis went away, or slow enough that Redis drops
its output buffer) is lost, and a recall then reads the published stamp as it always does and catches up
itself (``engram_api.reader.catchup``). So nothing here retries a message or replays missed ones; after an
error the thread subscribes again after a pause. A message that does not parse is dropped. No error of
Redis or of its socket escapes the thread (Redis going away, the client closed under it): ``stop`` ends it
quietly, and ``MemoryClient`` starts one listener however many threads open its reader at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from engram_api import keys
from engram_api.versions import Stamp

if TYPE_CHECKING:
    import redis

__all__ = ["StampSignals", "parse_signal"]

log = logging.getLogger(__name__)

_POLL_S = 0.25  # how long one wait for a message lasts: how soon ``stop`` is noticed
_RETRY_S = 2.0  # the pause before subscribing again after a Redis error


def parse_signal(data: str | bytes) -> tuple[str, Stamp] | None:
    """``(user_id, stamp)`` of a message "<user_id> <epoch>:<version>"; None when it is not one."""
    text = data.decode() if isinstance(data, bytes) else data
    user_id, _, raw = text.partition(" ")
    try:
        stamp = Stamp.parse(raw)
    except ValueError:
        return None
    return (user_id, stamp) if user_id and stamp.epoch >= 0 and stamp.version > 0 else None


def _closed(pubsub: redis.client.PubSub) -> None:
    """Close ``pubsub``'s connection; a Redis already gone (its connection reset) has nothing left to close."""
    import redis  # only with a client, so loaded already

    try:
        pubsub.close()
    except (redis.RedisError, OSError) as exc:
        log.debug("stamp signals' connection not closed cleanly: %s", exc)


class StampSignals:
    """One process's listener on the stamps channel (see the module docstring)."""

    def __init__(self, client: redis.Redis, on_stamp: Callable[[str, Stamp], None]) -> None:
        self.client = client
        self.on_stamp = on_stamp
        self.received = 0  # signals handed on (tests read it)
        self.subscribed = threading.Event()  # set while subscribed: a signal sent now is received
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StampSignals:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engram-stamp-signals", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; returns once no signal is being handed on (a caller may then close the stores)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=_POLL_S + 5.0)

    def _run(self) -> None:
        import redis  # only with a client, so loaded already

        away = False  # logged once an outage, not at every retry
        while not self._stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.stamps_channel())
                self.subscribed.set()
                if away:
                    log.info("stamp signals received again")
                    away = False
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=_POLL_S)
                    if message is not None and message.get("type") == "message":
                        self._handle(message["data"])
            except (redis.RedisError, OSError) as exc:  # signals sent until we are back are lost: recalls catch up
                if not self._stop.is_set() and not away:  # a client closed under us is a stop, not an outage
                    log.warning("stamp signals lost (%s); subscribing again every %.0f s", exc, _RETRY_S)
                    away = True
                self._stop.wait(_RETRY_S)
            finally:
                self.subscribed.clear()
                _closed(pubsub)

    def _handle(self, data: str | bytes) -> None:
        parsed = parse_signal(data)
        if parsed is None:
            log.debug("stamp signal dropped: %r", data[:200])
            return
        self.received += 1
        try:
            self.on_stamp(*parsed)
        except Exception:  # a hint's handler must never end the listener
            log.exception("stamp signal for %s not handled", parsed[0])
