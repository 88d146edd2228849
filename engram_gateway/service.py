"""What the HTTP routes and the MCP tools share: one ``MemoryClient``, the key ring, and the checks that
come before every call into the library.

Invariants:
- The gateway validates, enqueues and reads; it never calls an LLM and never waits for extraction
  (``MemoryClient.enqueue`` is one Redis round trip; reads go to the reader).
- Every user id passes ``Principal.user`` (syntax, then namespace, then cell) before the library sees it, and every
  check runs before anything is written, so a refused request changed nothing.
- Per-key quotas (``engram_gateway.quotas``): a request rate and a cap on open MCP sessions, per key.
- With the embedded default, a Redis error makes the gateway look up the Redis ``engram up`` runs now
  (``follow_redis``): after a restart of the fleet on another port, the next request reaches it.
- One Prometheus registry per gateway (``registry``): its HTTP counters and its ``MemoryClient``'s reader
  metrics, served together by ``/v1/metrics``.
- Back-pressure: when the extract queue is longer than ``ENGRAM_GATEWAY_MAX_QUEUE_DEPTH`` an enqueue is
  refused with ``BackPressureError`` (429) instead of growing a ``noeviction`` Redis without bound. The
  depth is read at most every ``_DEPTH_TTL_S`` so the check costs no round trip per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from engram_api import MemoryClient, keys
from engram_api.cells import Cell
from engram_api.errors import BackPressureError, NotFoundError, StoreUnavailableError
from engram_api.models import ChatMessage, Receipt, check_message_id
from engram_api.settings import Settings
from engram_gateway.auth import KeyRing, Principal
from engram_gateway.quotas import KeyRates, SessionLedger

__all__ = ["Gateway"]

log = logging.getLogger("engram.gateway")

_DEPTH_TTL_S = 0.25


class Gateway:
    def __init__(self, settings: Settings, client: MemoryClient | None = None) -> None:
        self.settings = settings
        # What /v1/metrics serves: the HTTP counters (``app``) and the reader's recall and index-load metrics.
        # A ``client`` passed in records its reader's metrics where its maker said, not here.
        self.registry = CollectorRegistry()
        self.client = client or MemoryClient(settings=settings, metrics_registry=self.registry)
        self.ring = KeyRing(settings.api_keys, Cell.of(settings))
        self.rates = KeyRates(settings.gateway_key_rate, settings.gateway_key_burst)
        self.sessions = SessionLedger(settings.gateway_key_mcp_sessions, settings.gateway_mcp_session_idle_s)
        self._depth = (0.0, 0)
        self._depth_lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    def follow_redis(self) -> bool:
        """After a Redis error: with the embedded default, follow the Redis that ``engram up`` restarted on
        another port (``MemoryClient.follow_embedded_redis``). True when the connections moved."""
        moved = self.client.follow_embedded_redis()
        if moved:
            log.warning("the embedded Redis moved (engram up restarted): following it")
        return moved

    # ------------------------------------------------------------------------------------ write side
    def _check_backlog(self, adding: int) -> None:
        now = time.monotonic()
        with self._depth_lock:
            checked_at, depth = self._depth
            if now - checked_at > _DEPTH_TTL_S:
                try:
                    depth = int(self.client.redis.llen(keys.queue_key(keys.EXTRACT_QUEUE)))
                except redis.RedisError as exc:
                    raise StoreUnavailableError(f"Redis unavailable, nothing enqueued: {exc}") from exc
                self._depth = (now, depth)
        limit = self.settings.gateway_max_queue_depth
        if depth + adding > limit:
            raise BackPressureError(f"{depth} messages are waiting for extraction (limit {limit}); nothing enqueued")

    def enqueue(
        self,
        principal: Principal,
        user_id: str,
        messages: str | Sequence[ChatMessage],
        *,
        message_id: str | None = None,
        timestamp: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        **context: Any,
    ) -> Receipt:
        """``context``: ``owner_name``, ``earlier``, ``utc_offset_minutes`` as the producer takes them."""
        principal.require("write")
        uid = principal.user(user_id)
        self._check_backlog(1)
        return self.client.producer.enqueue(
            uid, messages, message_id=message_id, timestamp=timestamp, metadata=metadata, **context
        )

    def enqueue_many(self, principal: Principal, items: Sequence[Mapping[str, Any]]) -> list[Receipt]:
        principal.require("write")
        for i, item in enumerate(items):
            principal.user(item.get("user_id"), f"items[{i}].user_id")
        self._check_backlog(len(items))
        return self.client.producer.enqueue_many(items)

    def status(self, principal: Principal, user_id: str, message_id: str) -> dict[str, str]:
        principal.require("read")
        uid = principal.user(user_id)
        mid = check_message_id(message_id)
        try:
            fields = self.client.producer.ledger.status(uid, mid)
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"Redis unavailable: {exc}") from exc
        if not fields:
            raise NotFoundError(f"no message {mid!r} for {uid!r} (unknown, or its status expired)")
        return {"user_id": uid, "message_id": mid, **{k: v for k, v in fields.items() if k in ("state", "task_id")}}

    # ------------------------------------------------------------------------------- dead letters
    def dead_letters(self, principal: Principal, user_id: str | None) -> list[Any]:
        principal.require("operator")
        if user_id is not None:
            return self.client.dead_letters(principal.user(user_id))
        return self.client.producer.ledger.dead_letters.list(where=principal.owns)

    def _letter(self, principal: Principal, user_id: str, message_id: str) -> tuple[str, str]:
        principal.require("operator")
        uid, mid = principal.user(user_id), check_message_id(message_id)
        if self.client.producer.ledger.dead_letters.get(uid, mid) is None:
            raise NotFoundError(f"no dead letter {mid!r} for {uid!r}")
        return uid, mid

    def replay(self, principal: Principal, user_id: str, message_id: str) -> Receipt:
        return self.client.replay(*self._letter(principal, user_id, message_id))

    def drop(self, principal: Principal, user_id: str, message_id: str) -> bool:
        return self.client.drop_dead_letter(*self._letter(principal, user_id, message_id))

    # ------------------------------------------------------------------------------- read side
    def reader_for(self, principal: Principal, user_id: str, scope: str = "read") -> tuple[Any, str]:
        """(the reader, the checked user id): the one door to every read and forget."""
        principal.require(scope)  # type: ignore[arg-type]
        return self.client.reader, principal.user(user_id)

    def warm(self) -> None:
        """Load the embedding model and open the stores now, not on the first user's request."""
        self.client.reader.embedder.encode_one("warm-up")
