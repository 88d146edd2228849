"""The read side: recall, search, context, history, graph pages, stats, forget, feedback, health.

Zero LLM calls and no Celery: it embeds the query locally, searches the user's own FAISS index, expands
through the graph in one query, fuses and scores. Results, and the fact records recall read, are cached
per user and keyed by the per-user stamp (epoch, version) the workers publish in Redis, so a cache entry
can never outlive a write nor survive into another lifetime of the user. Writes (forget, forget_user, feedback) go through
``UserWrites`` like every other writer. Safe to share between threads: caches are locked, and indexes
handed out are never mutated (``IndexKeeper`` swaps copies).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import suppress
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Literal

import numpy as np

from engram_api import graph_reads, keys, tracing
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
    KeywordHit,
    RecallItem,
    RecallResult,
    SearchResult,
    UserStats,
    check_aware,
    check_message_id,
    check_user_id,
    utcnow,
)
from engram_api.reader.background import ReaderThreads, ResultCache
from engram_api.reader.catchup import CatchUps
from engram_api.reader.context import render_context, select_context
from engram_api.reader.facts import ChunkCache, FactCache, SnapshotCache, UserChunks, UserFacts
from engram_api.reader.fusion import TimeWindow, keyword_hits, recall_items
from engram_api.reader.metrics import ReaderMetrics, timed_recall
from engram_api.reader.recipe import DEFAULT_RECIPE, RecallRecipe
from engram_api.reader.scoring import Weights, effective_weights
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_api.versions import Stamp, read_stamp

if TYPE_CHECKING:
    import redis

    from engram_api.ledger import MessageLedger

__all__ = ["Reader"]

DetailLevel = Literal["auto", "broad", "detailed"]
_WEIGHTS_TTL_S = 60.0
_CONTEXT_CANDIDATES = 40
_WEIGHTS_CACHE_USERS = 10_000
_IO_THREADS = 4  # concurrent recalls' keyword searches in flight; more wait their turn
_WRITE_WAIT_S = 30.0  # a caller's forget/feedback waits this long for a worker's write of the user
_PURGE_TIMEOUT_S = 300.0  # an erasure waits this long for Redis to rewrite its files (O(dataset) each)


class Reader:
    def __init__(
        self,
        *,
        settings: Settings,
        graph: GraphStore,
        keeper: IndexKeeper,
        embedder: Embedder,
        redis_client: redis.Redis | None,
        metrics: ReaderMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics  # None: nothing recorded (``engram_api.reader.metrics``)
        self.graph = graph
        self.keeper = keeper
        self.embedder = embedder
        self.redis = redis_client
        self.cache = ResultCache()
        self.facts = FactCache()
        self.chunks = ChunkCache()
        self.snapshots = SnapshotCache(
            max_records=settings.snapshot_max_records, budget_records=settings.snapshot_budget_records
        )
        self._threads = ReaderThreads(threads=_IO_THREADS)
        self.catchups = CatchUps(
            graph=graph, keeper=keeper, snapshots=self.snapshots, threads=self._threads, redis_client=redis_client
        )
        self._weights = ResultCache(size=_WEIGHTS_CACHE_USERS)  # bounded: a reader may serve millions of users
        # Settings are frozen: the default recipe and its cache-key form are built once, not per recall.
        self._recipe = DEFAULT_RECIPE.model_copy(update={"window": settings.recall_window, "rrf_k": settings.rrf_k})
        self._recipe_key = self._recipe.model_dump_json()
        self.writes = UserWrites(
            graph=graph,
            keeper=keeper,
            redis_client=redis_client,
            lease_ttl_s=settings.apply_lock_ttl_s,
            on_change=[self.cache.drop_user, self.facts.drop_user, self.chunks.drop_user, self.snapshots.drop_user],
        )

    # ------------------------------------------------------------------------------------ helpers
    def _version(self, user_id: str) -> Stamp:
        if self.redis is not None:
            import redis  # only with a client, so loaded already: a reader without Redis never imports it

            # On a Redis error fall back to the graph: slower, never wrong.
            with suppress(redis.RedisError):
                stamp = read_stamp(self.redis, user_id)
                if stamp is not None:
                    return stamp
        return self.graph.user_stamp(user_id)

    def weights_for(self, user_id: str) -> tuple[Weights, str]:
        """Learned per-user weights, else learned global ones, else the configured ones."""
        cached = self._weights.get((user_id,), 0)
        if cached is not None:
            return cached
        weights, source = effective_weights(self.graph, self.settings, user_id)
        self._weights.put((user_id,), 0, _WEIGHTS_TTL_S, (weights, source))
        return weights, source

    # ------------------------------------------------------------------------------------- recall
    def recipe(self) -> RecallRecipe:
        """The default recipe with the configured fusion constant and neighbour window."""
        return self._recipe

    @tracing.traced_recall
    @timed_recall
    def recall(
        self,
        user_id: str,
        query: str,
        k: int = 10,
        *,
        as_of: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        graph_expansion: bool = True,
        recipe: RecallRecipe | None = None,
    ) -> RecallResult:
        """Facts and conversation excerpts for ``query``, fused from the recipe's channels.

        ``as_of`` answers as of that instant (facts valid then, nothing said after it); ``since`` /
        ``until`` keep what happened in [since, until) by event time."""
        check_user_id(user_id)
        check_text(query, "query")
        check_k(k)
        as_of = check_aware(as_of, "as_of")
        since = check_aware(since, "since")
        until = check_aware(until, "until")
        if since is not None and until is not None and until <= since:
            raise InvalidInputError("until", "must be later than since")
        if recipe is not None and not isinstance(recipe, RecallRecipe):
            raise InvalidInputError("recipe", "must be a RecallRecipe")
        recipe_key = self._recipe_key if recipe is None else recipe.model_dump_json()
        recipe = recipe or self._recipe
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        version = self._version(user_id)
        key = (user_id, "recall", query, k, as_of, since, until, graph_expansion, recipe_key)
        hit = self.cache.get(key, version)
        if hit is not None:
            return hit.model_copy(update={"cached": True, "timings_ms": {"cache": (time.perf_counter() - t0) * 1e3}})

        window = TimeWindow(as_of=as_of, since=since, until=until)
        snapshot = self.snapshots.get(user_id, version)
        # After a write (any host's), copies a few writes behind are caught up on a reader thread while the
        # query is embedded (one read of what changed, ``CatchUps``), unless a writer's signal already did;
        # "catchup" is how long the recall waited for it after embedding.
        catching = self.catchups.start(user_id, version)
        # The keyword search needs the snapshot at ``version``: when the one held is older and a catch-up runs,
        # it waits for that catch-up on its reader thread, so both run while the query is embedded (with no
        # snapshot held it asks the store, which is current).
        after = catching if snapshot is None and self.snapshots.peek(user_id) is not None else None
        keyword = self._keyword(user_id, query, recipe, window, snapshot, after=after, version=version)
        qvec = self.embedder.encode_one(query)
        t1 = time.perf_counter()
        timings["embed"] = (t1 - t0) * 1e3
        if catching is not None:
            catching.result()
            timings["catchup"] = (time.perf_counter() - t1) * 1e3
            if snapshot is None:
                snapshot = self.snapshots.get(user_id, version)
        index = self.keeper.current(user_id, version)
        if index.stamp < version:  # the graph's reads lag the stamp (a replica): nothing cached under it
            version = index.stamp
        timings["index"] = (time.perf_counter() - t1) * 1e3
        weights, weights_source = self.weights_for(user_id)
        if snapshot is None:
            vectors = index.count("fact") + index.count("episode")
            self.snapshots.missed(self.graph, user_id, version, vectors, self._threads.behind)
        items = recall_items(
            graph=self.graph,
            user_facts=UserFacts(self.graph, self.facts, user_id, version, snapshot),
            user_chunks=UserChunks(self.graph, self.chunks, user_id, version, snapshot),
            settings=self.settings,
            index=index,
            qvec=qvec,
            user_id=user_id,
            k=k,
            recipe=recipe,
            weights=weights,
            window=window,
            graph_expansion=graph_expansion,
            keyword=keyword,
            timings=timings,
            query=query,
        )
        recall_id = uuid.uuid4().hex
        result = RecallResult(
            recall_id=recall_id,
            user_id=user_id,
            query=query,
            as_of=as_of,
            items=items,
            weights=weights_source,
            timings_ms=timings,
        )
        self._log_recall(user_id, recall_id, items)
        self.cache.put(key, version, self.settings.cache_ttl_s, result)
        return result

    def _keyword(
        self,
        user_id: str,
        query: str,
        recipe: RecallRecipe,
        window: TimeWindow,
        snapshot: UserSnapshot | None,
        *,
        after: Future[None] | None,
        version: Stamp,
    ) -> Future[list[KeywordHit]] | None:
        """The keyword channel's search on a reader thread (a held snapshot's, else the store's); None without
        one. With ``after`` (the user's catch-up, submitted to the same threads earlier, so FIFO order starts
        it first and this wait cannot starve the pool), the thread waits for it and searches the snapshot
        held at ``version`` then (the one the recall reads after it, or a newer one a later catch-up left)."""
        if not recipe.uses("keyword"):
            return None
        if after is None:
            return self._threads.submit(keyword_hits, self._searcher(user_id, snapshot), query, recipe, window)

        def caught_up() -> list[KeywordHit]:
            after.result()
            return keyword_hits(self._searcher(user_id, self.snapshots.get(user_id, version)), query, recipe, window)

        return self._threads.submit(caught_up)

    def _searcher(self, user_id: str, snapshot: UserSnapshot | None) -> Callable[..., list[KeywordHit]]:
        return snapshot.keyword_search if snapshot is not None else partial(self.graph.keyword_search, user_id)

    def _log_recall(self, user_id: str, recall_id: str, items: Sequence[RecallItem]) -> None:
        """Keep the score components briefly so ``feedback`` can turn them into training rows (written
        after the recall returned: ``ReaderThreads.log_recall``)."""
        if self.redis is None or not items:
            return
        rows = json.dumps({item.id: item.breakdown.model_dump() for item in items})
        self._threads.log_recall(self.redis, user_id, recall_id, rows)

    def flush(self) -> None:
        """Wait for this process's recall logs still being written and snapshot loads still running
        (``MemoryClient.close`` calls it: closing right after a recall neither loses the log ``feedback``
        needs nor closes the store under a load)."""
        self._threads.flush()

    def close(self) -> None:
        """``flush``, then end the reader's threads (``MemoryClient.close``): none outlives the client."""
        self._threads.close()

    # ----------------------------------------------------------------------------- other reads
    def search(self, user_id: str, query: str, k: int = 10, detail_level: DetailLevel = "auto") -> SearchResult:
        check_user_id(user_id)
        check_text(query, "query")
        check_k(k)
        if detail_level not in ("auto", "broad", "detailed"):
            raise InvalidInputError("detail_level", "must be 'auto', 'broad' or 'detailed'")
        if detail_level != "detailed":
            qvec = self.embedder.encode_one(query)
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
            else:
                return ForgetResult(user_id=user_id, episodes=1)  # not applied yet: the tombstone keeps it so
            write.finish(removals=[*result.removed_fact_ids, *result.removed_entity_ids, *result.removed_chunk_ids])
            return result  # its vector count is the store's, which deleted the embeddings

        result = self.writes.run(user_id, forget, wait=_WRITE_WAIT_S)
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
        self._purge(redis_client)
        return result
