"""The reads that are one graph-store query (history, a graph page, stats): argument checks, then the store.

They need no FAISS index, no embedder and no Redis, so ``MemoryClient`` runs them on its graph store
without building a ``Reader``: a one-shot `engram stats` or `engram history` then never imports numpy,
redis or the recall machinery. ``Reader`` runs the same functions (the gateway reads through it).
"""

from __future__ import annotations

from engram_api.errors import InvalidInputError
from engram_api.models import HISTORY_MAX_LIMIT, FactRecord, GraphPage, UserStats, check_user_id
from engram_api.naming import sanitize_predicate
from engram_api.storage.graph.contract import GraphStore

__all__ = ["check_k", "check_text", "history", "page", "stats"]


def check_k(k: object, field: str = "k", upper: int = 200) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= upper:
        raise InvalidInputError(field, f"must be an integer from 1 to {upper}")
    return k


def check_text(text: object, field: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError(field, "must be a non-empty string")
    if len(text) > 10_000:
        raise InvalidInputError(field, "is longer than 10000 characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(field, "is not valid UTF-8 (lone surrogate)") from None
    return text


def history(graph: GraphStore, user_id: str, subject: str, predicate: str | None, limit: int) -> list[FactRecord]:
    """The latest ``limit`` facts about ``subject``, superseded ones included, oldest first."""
    check_user_id(user_id)
    check_text(subject, "subject")
    if predicate is not None:
        check_text(predicate, "predicate")
    check_k(limit, "limit", upper=HISTORY_MAX_LIMIT)
    return graph.history(user_id, subject, sanitize_predicate(predicate) if predicate else None, limit)


def page(graph: GraphStore, user_id: str, page: int, page_size: int) -> GraphPage:
    check_user_id(user_id)
    check_k(page, "page", upper=10**9)
    check_k(page_size, "page_size", upper=1000)
    return graph.page(user_id, page, page_size)


def stats(graph: GraphStore, user_id: str) -> UserStats:
    check_user_id(user_id)
    return graph.stats(user_id)
