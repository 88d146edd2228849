"""The Redis message ledger: where a message stands between the producer and the graph.

A message is ``queued`` (payload, status, backlog entry, extract task on the queue), then ``extracted``
(its extraction stored, filed as ready to apply), then ``applied`` (payload and extraction gone), or
``dead`` (a dead letter kept for operators) or ``forgotten`` (a tombstone; no later write lands).

- ``messages.MessageLedger``: one method per transition; the producer, the stages, the CLI's and the
  gateway's dead-letter commands and erasure go through it.
- ``scripts``: every Lua script Engram runs, each behind named KEYS/ARGV (``lua.LuaScript``).
- ``controls`` and ``maintenance``: the scripts outside a message's life (the published stamp, the LLM
  controls; the maintenance fan-out and its changed set).
- ``wire``: kombu's task-message format, written by the producer and read by the redelivery sweep.
- ``turns``: each user's extraction turn (one model-path message of a user extracted at a time, in
  event-time order), passed on by every finishing transition (``MessageLedger.turns``).
- ``deadletters.DeadLetterStore`` (one key per letter, per-user and fleet-wide indexes;
  ``MessageLedger.dead_letters``), ``erasure``
  (the Redis side of erasure, ``MessageLedger.forget`` / ``forget_user``, by per-user indexes) and
  ``reindex`` (once, after an upgrade: indexes what was written before those indexes).

The keys themselves are in ``engram_api.keys`` (every key Engram or its libraries use in Redis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram_api.ledger.messages import DeadLetterStore, Enqueued, Entered, MessageLedger, Record

__all__ = ["DeadLetterStore", "Enqueued", "Entered", "MessageLedger", "Record"]


def __getattr__(name: str) -> Any:
    # Lazy: importing ``engram_api.ledger.erasure`` or ``.controls`` (a reader, a stopped fleet's CLI read)
    # must not load ``messages`` and redis-py with it.
    if name in __all__:
        from engram_api.ledger import messages

        return getattr(messages, name)
    raise AttributeError(name)
