"""Every API of ``MemoryClient`` called with a given user id and otherwise valid arguments.

The user id is the one argument every API takes: the bad-input suite (embedded store) feeds each call
malformed ids, the isolation suite (data of several users present) missing or empty ones; both expect
``InvalidInputError`` naming the field given here, and nothing written.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from engram_api import MemoryClient

AS_OF = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

# api -> (call(client, user_id), the field its InvalidInputError names)
API_CALLS: dict[str, tuple[Callable[[MemoryClient, Any], object], str]] = {
    "enqueue": (lambda c, u: c.enqueue(u, "I live in Austin."), "user_id"),
    "enqueue_many": (
        lambda c, u: c.enqueue_many([{"user_id": u, "messages": "I live in Austin."}]),
        "items[0].user_id",
    ),
    "recall": (lambda c, u: c.recall(u, "where does the user live?"), "user_id"),
    "recall_as_of": (lambda c, u: c.recall(u, "where does the user live?", as_of=AS_OF), "user_id"),
    "search_broad": (lambda c, u: c.search(u, "where does the user live?", detail_level="broad"), "user_id"),
    "search_detailed": (lambda c, u: c.search(u, "where does the user live?", detail_level="detailed"), "user_id"),
    "get_context": (lambda c, u: c.get_context(u, "where does the user live?"), "user_id"),
    "history": (lambda c, u: c.history(u, "user"), "user_id"),
    "get_graph": (lambda c, u: c.get_graph(u), "user_id"),
    "stats": (lambda c, u: c.stats(u), "user_id"),
    "feedback": (lambda c, u: c.feedback(u, "recall", []), "user_id"),
    "forget": (lambda c, u: c.forget(u, "seed-0"), "user_id"),
    "forget_user": (lambda c, u: c.forget_user(u), "user_id"),
}
