"""The read side: recall, search, context, history, graph pages, stats, forget, feedback, health.

``Reader`` is ``RecallReader`` (``recall.py``: the stores, the caches keyed by the per-user stamp, the
reader's threads, and recall itself, with zero LLM calls and no Celery) plus, here, the reads built on
recall or on the store (search, context, history, pages, stats) and the writes a reader makes. Writes
(forget, forget_user, feedback) go through ``UserWrites`` like every other writer, waiting at most
``_WRITE_WAIT_S`` for a worker's write of the user; an erasure is refused, with nothing erased, without
Redis, and ends with the purge that takes the bytes out of the files. Safe to share between threads.

Invariant: nothing a read keeps at a stamp outlives a newer stamp learned while the read ran (a writer's
signal, another recall's stamp): a recall (and the records ``context_items`` reads after it) keeps its
result and records at the stamp it read, and a newer stamp learned meanwhile drops them when it ends
(``_Crossings``), as ``learned`` drops what was kept before; so another host's forget takes its texts out of
this reader's result and record caches at its signal even when a recall at the older stamp was running.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from engram_api import graph_reads, keys
from engram_api.errors import InvalidInputError, NotFoundError, StoreUnavailableError
from engram_api.graph_reads import check_k, check_text
from engram_api.ledger.erasure import purge_redis
from engram_api.models import (
    HISTORY_LIMIT,
    SCORE_COMPONENTS,
    ClusterHit,
    FactRecord,
    FeedbackRow,
    ForgetResult,
    GraphPage,
    RecallItem,
    SearchResult,
    UserStats,
    check_message_id,
    check_user_id,
    utcnow,
)
from engram_api.reader.context import render_context, select_context
from engram_api.reader.facts import UserChunks, UserFacts
from engram_api.reader.recall import RecallReader
from engram_api.storage.faiss.erasure import record_removal
from engram_api.storage.writer.userwrite import UserWrite
from engram_api.versions import Stamp, outdated

if TYPE_CHECKING:
    import redis

    from engram_api.ledger import MessageLedger

__all__ = ["Reader"]

DetailLevel = Literal["auto", "broad", "detailed"]
F = TypeVar("F", bound=Callable[..., Any])
_CONTEXT_CANDIDATES = 40
_WRITE_WAIT_S = 30.0  # a caller's forget/feedback waits this long for a worker's write of the user
_PURGE_TIMEOUT_S = 300.0  # an erasure waits this long for Redis to rewrite its files (O(dataset) each)


class _Crossings:
    """The users with a read running in this reader, and the newest stamp learned of each while one ran
    (see the module docstring). A stamp is noted before what it outdates is dropped, and a read takes the
    note after it kept what it read: whichever drop comes last, the learner's or the read's, comes after the
    keeping. Bounded by the reads running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, list[Any]] = {}  # user -> [reads running, newest stamp learned meanwhile]

    def note(self, user_id: str, stamp: Stamp) -> None:
        with self._lock:
            entry = self._running.get(user_id)
            if entry is not None and (entry[1] is None or outdated(entry[1], stamp)):
                entry[1] = stamp

    def begin(self, user_id: str) -> list[Any]:
        with self._lock:
            entry = self._running.setdefault(user_id, [0, None])
            entry[0] += 1
            return entry

    def end(self, user_id: str, entry: list[Any]) -> Stamp | None:
        """The newest stamp learned of the user while any read of it ran here since ``entry``'s began."""
        with self._lock:
            entry[0] -= 1
            if entry[0] == 0:
                del self._running[user_id]
            return entry[1]


def _kept_current(read: F) -> F:
    """A read of a user (its first argument) that keeps results or records at the stamp it read: a newer
    stamp learned while it ran drops them when it ends, as ``learned`` drops what was kept before."""

    @functools.wraps(read)
    def reading(reader: Reader, user_id: str, *args: Any, **kwargs: Any) -> Any:
        check_user_id(user_id)  # before the id is a key here: bad input gets the read's typed error
        entry = reader._crossings.begin(user_id)
        try:
            return read(reader, user_id, *args, **kwargs)
        finally:
            learned = reader._crossings.end(user_id, entry)
            if learned is not None:
                RecallReader.learned(reader, user_id, learned)

    return reading  # type: ignore[return-value]


class Reader(RecallReader):
    """The read side's one object (``MemoryClient`` holds one): ``recall`` and its state from
    ``RecallReader``, the other reads and the reader's writes here."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._crossings = _Crossings()

    def learned(self, user_id: str, stamp: Stamp) -> None:
        self._crossings.note(user_id, stamp)  # first: a read running now drops what it keeps at older stamps
        super().learned(user_id, stamp)

    recall = _kept_current(RecallReader.recall)

    # ----------------------------------------------------------------------------- other reads
    def search(self, user_id: str, query: str, k: int = 10, detail_level: DetailLevel = "auto") -> SearchResult:
        check_user_id(user_id)
        check_text(query, "query")
        check_k(k)
        if detail_level not in ("auto", "broad", "detailed"):
            raise InvalidInputError("detail_level", "must be 'auto', 'broad' or 'detailed'")
        if detail_level != "detailed":
            qvec = self.embedder.encode_one(query, user_id=user_id)
            hits = []
            for cluster in self.graph.clusters(user_id):
                if not cluster.centroid:
                    continue
                sim = float(np.dot(np.asarray(cluster.centroid, dtype=np.float32), qvec))
                hits.append(
                    ClusterHit(
                        id=cluster.id,
                        label=cluster.label,
                        summary=cluster.summary,
                        score=round(sim, 6),
                        member_fact_ids=cluster.member_fact_ids,
                    )
                )
            hits.sort(key=lambda h: -h.score)
            if hits and (detail_level == "broad" or hits[0].score >= self.settings.broad_min_score):
                return SearchResult(user_id=user_id, query=query, level="broad", clusters=hits[:k])
        note = ""
        if detail_level == "broad":
            note = (
                "no topic clusters for this user yet (the hierarchy job builds them; "
                "`engram maintenance hierarchy` does it now): showing individual facts"
            )
        facts = self.recall(user_id, query, k).items
        return SearchResult(user_id=user_id, query=query, level="detailed", facts=facts, note=note)

    def get_context(self, user_id: str, query: str, max_tokens: int = 800) -> str:
        """A prompt-ready block within ``max_tokens``: current facts, then dated conversation excerpts
        (see ``reader.context`` and docs/api.md for the contract)."""
        return render_context(self.context_items(user_id, query, max_tokens))

    def context_items(self, user_id: str, query: str, max_tokens: int = 800) -> list[RecallItem]:
        """The recalled items ``get_context`` shows, in recall order."""
        check_k(max_tokens, "max_tokens", upper=100_000)
        items = self.recall(user_id, query, k=_CONTEXT_CANDIDATES).items
        return select_context(items, max_tokens, replaced=self._replaced_excerpts(user_id, items))

    @_kept_current
    def _replaced_excerpts(self, user_id: str, items: Sequence[RecallItem]) -> set[str]:
        """The excerpts the query did not name (no keyword match) of messages whose every extracted fact
        has ended: what they say was replaced ("I live in Tampa." after a move), and the fact that replaced
        it may not be in the context next to them. Read through the reader's caches (a held snapshot: none)."""
        unnamed = [i.id for i in items if i.kind == "episode" and "keyword" not in i.channels]
        if not unnamed:
            return set()
        stamp = self._version(user_id)
        snapshot = self.snapshots.get(user_id, stamp)
        chunks = UserChunks(self.graph, self.chunks, user_id, stamp, snapshot).load(unnamed)
        facts = UserFacts(self.graph, self.facts, user_id, stamp, snapshot).load(
            [f for chunk in chunks.values() for f in chunk.fact_ids]
        )
        return {
            cid
            for cid, chunk in chunks.items()
            if chunk.fact_ids and all(f in facts and facts[f].valid_until is not None for f in chunk.fact_ids)
        }

    def history(
        self, user_id: str, subject: str, predicate: str | None = None, limit: int = HISTORY_LIMIT
    ) -> list[FactRecord]:
        """The latest ``limit`` facts about ``subject``, superseded ones included, oldest first."""
        return graph_reads.history(self.graph, user_id, subject, predicate, limit)

    def get_graph(self, user_id: str, page: int = 1, page_size: int = 50) -> GraphPage:
        return graph_reads.page(self.graph, user_id, page, page_size)

    def stats(self, user_id: str) -> UserStats:
        return graph_reads.stats(self.graph, user_id)

    # ---------------------------------------------------------------------------------- writes
    def feedback(self, user_id: str, recall_id: str, useful_ids: Sequence[str]) -> int:
        """Record which results of a recall helped; the others of that recall count as not useful."""
        check_user_id(user_id)
        if not isinstance(recall_id, str) or not recall_id or len(recall_id) > 64 or not recall_id.isalnum():
            raise InvalidInputError("recall_id", "must be the recall_id of a recent recall")
        if isinstance(useful_ids, str) or not isinstance(useful_ids, Sequence | set | frozenset):
            raise InvalidInputError("useful_ids", "must be a list of memory ids")
        if not all(isinstance(i, str) for i in useful_ids):
            raise InvalidInputError("useful_ids", "must contain only memory id strings")
        if self.redis is None:
            raise StoreUnavailableError("feedback needs Redis (the recall log lives there)")
        self._threads.wait_logged(recall_id)
        raw = self.redis.get(keys.recall_log(user_id, recall_id))
        if raw is None:
            raise InvalidInputError("recall_id", f"unknown or expired recall {recall_id[:40]!r} for this user")
        logged: dict[str, dict[str, float]] = json.loads(raw)
        useful = set(useful_ids)
        unknown = useful - logged.keys()
        if unknown:
            raise InvalidInputError("useful_ids", f"not results of that recall: {sorted(unknown)[:3]}")
        rows = [
            FeedbackRow(
                user_id=user_id,
                recall_id=recall_id,
                fact_id=fid,
                useful=fid in useful,
                **{c: b[c] for c in SCORE_COMPONENTS},
            )
            for fid, b in logged.items()
        ]
        self.graph.add_feedback(rows)
        if useful:

            def reinforce(write: UserWrite) -> None:
                self.graph.reinforce(user_id, sorted(useful), amount=self.settings.reinforce_amount, now=utcnow())
                write.finish()

            self.writes.run(user_id, reinforce, wait=_WRITE_WAIT_S)
        return len(rows)

    def forget(self, user_id: str, memory_id: str) -> ForgetResult:
        """Forget a message (its episode and chunks, the facts and entities only it stated, and every Redis
        trace of it), or given a recall item's ``id``: a fact id forgets that one fact, an excerpt (chunk)
        id forgets the message it is a piece of. ``NotFoundError`` when the user has none of them, and then
        nothing is written (no tombstone: the id may still be enqueued later). Then the purge (``_purge``);
        refused (``StoreUnavailableError``, nothing erased) without Redis."""
        check_user_id(user_id)
        check_message_id(memory_id, "memory_id")
        redis_client = self._erasure_redis()
        message_id = memory_id if self._knows_message(redis_client, user_id, memory_id) else None
        if message_id is None and not self.graph.get_facts(user_id, [memory_id]):
            # An excerpt is verbatim text of its message: forgetting it alone would leave the message.
            excerpt = self.graph.get_chunks(user_id, [memory_id])
            if not excerpt:
                raise NotFoundError(f"{user_id!r} has no message, fact or excerpt {memory_id[:80]!r}")
            message_id = excerpt[0].episode_id
        if message_id is not None:
            # First: from here on no stage can write this message back (see engram_api.ledger.erasure).
            self._ledger(redis_client).forget(user_id, message_id)

        def forget(write: UserWrite) -> ForgetResult:
            if message_id is None:
                result = self.graph.forget_fact(user_id, memory_id)
            elif self.graph.is_applied(user_id, message_id):
                result = self.graph.forget_message(user_id, message_id)
            else:  # not applied yet: the tombstone keeps it so; an apply it stopped midway may have encoded it
                record_removal(redis_client, user_id)
                return ForgetResult(user_id=user_id, episodes=1)
            write.finish(removals=[*result.removed_fact_ids, *result.removed_entity_ids, *result.removed_chunk_ids])
            return result  # its vector count is the store's, which deleted the embeddings

        result = self.writes.run(user_id, forget, wait=_WRITE_WAIT_S)
        self.embedder.forget(user_id)  # the forgotten texts are not known here: all of the user's cached texts
        self._purge(redis_client)
        return result

    def _erasure_redis(self) -> redis.Redis:
        """Checked before anything is erased: a queued message of an erased user would come back."""
        if self.redis is None:
            raise StoreUnavailableError(
                "forget needs Redis (the user's queued messages and dead letters live there, and would be "
                "applied or listed later): start the fleet with `engram up` or set REDIS_URL; the `engram "
                "forget` and `engram forget-user` commands start the embedded Redis themselves"
            )
        return self.redis

    def _purge(self, redis_client: redis.Redis) -> None:  # every erasure's last step: bytes leave the files
        self.graph.purge_erased()
        purge_redis(redis_client, timeout_s=_PURGE_TIMEOUT_S)

    def _knows_message(self, redis_client: redis.Redis, user_id: str, message_id: str) -> bool:
        """Applied, or still known to Redis (queued, in a stage, finished recently, or dead-lettered)."""
        if self.graph.is_applied(user_id, message_id):
            return True
        return self._ledger(redis_client).knows(user_id, message_id)

    def _ledger(self, redis_client: redis.Redis) -> MessageLedger:
        # Imported here: a recall (a stopped fleet's, say) never needs the ledger or redis-py.
        from engram_api.ledger import MessageLedger

        return MessageLedger(redis_client, status_ttl_s=self.settings.status_ttl_s)

    def forget_user(self, user_id: str) -> ForgetResult:
        """Everything of one user: graph, vectors, caches, queued payloads, dead letters; then the purge
        (``_purge``). Refused (``StoreUnavailableError``, nothing erased) without Redis."""
        check_user_id(user_id)
        redis_client = self._erasure_redis()

        def forget_user(write: UserWrite) -> ForgetResult:
            result = self.graph.forget_user(user_id)
            write.finish()  # the stamp is ABSENT now: the index file, cache and published stamp go
            self._ledger(redis_client).forget_user(user_id)
            return result

        result = self.writes.run(user_id, forget_user, wait=_WRITE_WAIT_S)
        self._weights.drop_user(user_id)
        self.embedder.forget(user_id)  # other processes: their erasure sweep (``engram_api.storage.faiss.erasure``)
        self._purge(redis_client)
        return result
