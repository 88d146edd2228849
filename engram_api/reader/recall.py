"""Recall, the read side's hot path, and the state every ``Reader`` call shares: stores, caches, threads.

Zero LLM calls and no Celery: ``recall`` embeds the query locally, searches the user's own FAISS index,
expands through the graph in one query, fuses and scores. Results, and the fact records and chunks recall
read, are cached per user and keyed by the per-user stamp (epoch, version) the workers publish in Redis, so a
cache entry can never outlive a write nor survive into another lifetime of the user; a stamp read from Redis
that fails falls back to the graph's (slower, never wrong). Safe to share between threads: caches are
locked, and indexes handed out are never mutated (``IndexKeeper`` swaps copies). The query's model call
runs on the recall's own thread, its tokens and feed made ready before anything else; what needs no vector
(the stamp, the catch-up, the keyword search, the weights) runs beside it on the reader's own threads
(``ReaderThreads``), as does the recall log, and ``close`` ends them: none outlives it.
``Reader`` (``reader.py``) adds the other reads and the writes on top of this class.
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import suppress
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from pydantic_core import to_json

from engram_api import tracing
from engram_api.errors import InvalidInputError
from engram_api.graph_reads import check_k, check_text
from engram_api.models import KeywordHit, RecallItem, RecallResult, check_aware, check_user_id
from engram_api.reader.background import ReaderThreads, ResultCache
from engram_api.reader.catchup import CatchUps
from engram_api.reader.cues import QueryCues
from engram_api.reader.facts import ChunkCache, FactCache, SnapshotCache, UserChunks, UserFacts
from engram_api.reader.fusion import TimeWindow, keyword_hits, query_stems, recall_items
from engram_api.reader.metrics import ReaderMetrics, timed_recall
from engram_api.reader.recipe import DEFAULT_RECIPE, RecallRecipe
from engram_api.reader.scoring import Weights, effective_weights
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.writer.userwrite import UserWrites
from engram_api.versions import Stamp, read_stamp

if TYPE_CHECKING:
    import redis

__all__ = ["RecallReader"]

_WEIGHTS_TTL_S = 60.0
_WEIGHTS_CACHE_USERS = 10_000
_IO_THREADS = 4  # concurrent recalls' keyword searches in flight; more wait their turn


class _Begun(NamedTuple):
    """What a recall read and started before it needed the query's vector (``RecallReader._begin``)."""

    version: Stamp
    snapshot: UserSnapshot | None
    catching: Future[None] | None
    keyword: Future[list[KeywordHit]] | None
    weights: Weights
    weights_source: str
    cues: QueryCues
    qstems: frozenset[str]


class RecallReader:
    """What a ``Reader`` holds (the stores, its caches, its threads, the writer of its own writes) and
    ``recall``; every cache drops a user when that user's write goes through ``self.writes``."""

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
        self._threads = ReaderThreads(threads=_IO_THREADS, deadline_s=settings.snapshot_fold_deadline_s)
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

    def learned(self, user_id: str, stamp: Stamp) -> None:
        """The user's stamp is at ``stamp`` or newer: the results and records kept at stamps it outdates
        (``outdated``: older ones, or all once the user is absent) go, and with them the texts another host's
        forget or ``forget_user`` erased; a lookup per cache when there are none."""
        self.cache.drop_outdated(user_id, stamp)
        self.facts.drop_outdated(user_id, stamp)
        self.chunks.drop_outdated(user_id, stamp)

    def signalled_stamp(self, user_id: str, stamp: Stamp) -> None:
        """A writer's signal (``StampSignals``): what is kept at older stamps goes (``learned``), held copies
        catch up (``CatchUps``)."""
        self.learned(user_id, stamp)
        self.catchups.signalled_stamp(user_id, stamp)

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
        ``until`` keep what happened in [since, until) by event time. While it runs, this process's folds of
        held snapshots wait (``ReaderThreads.recalling``)."""
        with self._threads.recalling():
            return self._recall(user_id, query, k, as_of, since, until, graph_expansion, recipe)

    def _recall(
        self,
        user_id: str,
        query: str,
        k: int,
        as_of: datetime | None,
        since: datetime | None,
        until: datetime | None,
        graph_expansion: bool,
        recipe: RecallRecipe | None,
    ) -> RecallResult:
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
        key = (user_id, "recall", query, k, as_of, since, until, graph_expansion, recipe_key)
        window = TimeWindow(as_of=as_of, since=since, until=until)
        known = None
        if self.cache.holds(key):  # a result kept under this key: at the stamp, a hit runs no encoder
            known = self._version(user_id)
            hit = self.cache.get(key, known)
            if hit is not None:
                return self._hit(hit, t0)
        # The query's model call is made ready here, holding the GIL (``Embedder.prepare_one``); what needs no
        # vector then runs on a reader thread (``_begin``), let go only as this thread enters the model, whose
        # ``run`` lets go of the GIL: that Python runs inside the model call instead of between the encoder's
        # steps, and the encoder's path takes the GIL back once, after the model.
        embedding = self.embedder.prepare_one(query, user_id=user_id, states=recipe.late_interaction)
        if embedding.ready:  # kept by the encoder's cache: no model call to overlap
            begun = self._begin(user_id, query, key, recipe, window, known)
        else:
            entering = threading.Event()
            beside = self._threads.submit(
                contextvars.copy_context().run, self._begin, user_id, query, key, recipe, window, known, entering
            )  # in this thread's context: what it reads is in the recall's trace
            entering.set()
            embedding.vector()  # the model, on this thread, while ``_begin`` runs on that one
            begun = beside.result()
        if isinstance(begun, RecallResult):  # another recall put it under the stamp meanwhile
            return self._hit(begun, t0)
        qvec = embedding.vector()
        version, snapshot, catching, keyword = begun.version, begun.snapshot, begun.catching, begun.keyword
        weights, weights_source, cues, qstems = begun.weights, begun.weights_source, begun.cues, begun.qstems
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
        self.learned(user_id, version)  # the stamp read, as far as the graph answers (no churn while it lags)
        timings["index"] = (time.perf_counter() - t1) * 1e3
        if snapshot is None:
            vectors = index.count("fact") + index.count("episode")
            self.snapshots.missed(self.graph, user_id, version, vectors, self._threads.behind, self._threads.when_idle)
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
            cues=cues,
            qstems=qstems,
            terms=self.snapshots.terms(user_id, version, snapshot),
            qstates=embedding.states(),
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

    @staticmethod
    def _hit(hit: RecallResult, t0: float) -> RecallResult:
        return hit.model_copy(update={"cached": True, "timings_ms": {"cache": (time.perf_counter() - t0) * 1e3}})

    def _begin(
        self,
        user_id: str,
        query: str,
        key: tuple[object, ...],
        recipe: RecallRecipe,
        window: TimeWindow,
        version: Stamp | None,
        entering: threading.Event | None = None,
    ) -> _Begun | RecallResult:
        """What a recall reads and starts before it needs the query's vector, on a reader thread while the
        recall's own thread runs the model (once ``entering`` is set: as it enters it), or on the recall's
        thread: the stamp (unless ``version`` is known), the result kept under ``key`` at it (returned as
        it is), the catch-up, the keyword search, the weights and the query's words. It waits for no job
        (the catch-up and a keyword search it submits run after it; the recall waits for them)."""
        if entering is not None:
            entering.wait()
        if version is None:
            version = self._version(user_id)
            hit = self.cache.get(key, version)
            if hit is not None:
                return hit
        snapshot = self.snapshots.get(user_id, version)
        # After a write (any host's), copies a few writes behind are caught up here, while the query is
        # embedded (one read of what changed, ``CatchUps``), unless a writer's signal already did; one a
        # signal is running is joined, and "catchup" is how long the recall waited for it after embedding.
        catching = self.catchups.start(user_id, version)
        if snapshot is None and catching is not None and catching.done():
            snapshot = self.snapshots.get(user_id, version)  # the one this catch-up left
        # The keyword search needs the snapshot at ``version``: when the one held is older and a signal's
        # catch-up runs, it waits for that catch-up on a reader thread, so both run while the query is
        # embedded (with no snapshot held it asks the store, which is current).
        running = catching is not None and not catching.done()
        after = catching if running and snapshot is None and self.snapshots.peek(user_id) is not None else None
        keyword = self._keyword(user_id, query, recipe, window, snapshot, after=after, version=version)
        weights, weights_source = self.weights_for(user_id)  # a store read now and then
        cues, qstems = QueryCues.of(query), query_stems(query)  # the query's words need no vector either
        return _Begun(version, snapshot, catching, keyword, weights, weights_source, cues, qstems)

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
        """The keyword channel's search; None without one. A held snapshot's searches here: it is Python,
        which another thread would only run by turns with this one (the GIL), and ``_begin`` already runs
        beside the encoder. The store's runs on a reader thread, where it waits for the store (letting go of
        the GIL) while the rest goes on. With ``after`` (a signal's catch-up of the user, still running: submitted
        to the same threads earlier, so FIFO order starts it first and this wait cannot starve the pool), a
        reader thread waits
        for it and searches the snapshot held at ``version`` then (the one the recall reads after it, or a
        newer one a later catch-up left)."""
        if not recipe.uses("keyword"):
            return None
        if after is None and snapshot is not None:
            searched: Future[list[KeywordHit]] = Future()
            searched.set_result(keyword_hits(snapshot.keyword_search, query, recipe, window))
            return searched
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
        # Each breakdown's fields as the model holds them (``vars``: its extra fields are forbidden), in one
        # call of pydantic's core, Infinity and NaN written as ``json.dumps`` writes them: ~16 us for ten
        # items, where ``model_dump`` each and ``json.dumps`` took ~140 us (``dict(model)`` alone ~90).
        rows = to_json({item.id: vars(item.breakdown) for item in items}, inf_nan_mode="constants").decode()
        self._threads.log_recall(self.redis, user_id, recall_id, rows)

    def flush(self) -> None:
        """Wait for this process's recall logs still being written and snapshot loads still running
        (``MemoryClient.close`` calls it: closing right after a recall neither loses the log ``feedback``
        needs nor closes the store under a load)."""
        self._threads.flush()

    def close(self) -> None:
        """``flush``, then end the reader's threads (``MemoryClient.close``): none outlives the client."""
        self._threads.close()
