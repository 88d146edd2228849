"""Recall answers dumped for comparison across checkouts, and the recall's own CPU, one reader process a tree.

``python ops/bench/recall_dump.py load --workdir DIR --facts 100000``
    bulk-loads a SQLite user of that many facts under ``DIR`` (``bulk.bulk_load``, the hosts bench's statements:
    seed = the size), once; later runs reuse it.
``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_dump.py dump --workdir DIR --facts N --out FILE``
    in this process (the checkout on ``PYTHONPATH``), the user's snapshot held, a fixed clock: ``--queries``
    distinct queries, each recalled four ways (k 10; k 30; k 10 ``since`` the middle of the user's time span;
    k 30 ``as_of`` three quarters through it), every item written as one JSON line: id, kind,
    channels, path, hops, score, statement and every breakdown field, floats as ``repr`` (exact). Two trees'
    dumps are compared with ``cmp``. ``--data DIR --user ID`` instead of ``--facts``: any SQLite user, e.g. a
    LoCoMo conversation from ``run.py --only quality --store sqlite --keep``'s work folder (``--query-file``:
    its questions, one a line, for any command but ``load``).
``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_dump.py replay --workdir DIR --facts N [--rounds 5]``
    ``recall_items`` (everything after the query's embedding) of recorded recalls run again in this process:
    each recall's least thread CPU over the rounds, their median.
``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_dump.py cpu --workdir DIR --facts N``
    thread CPU (``time.thread_time``) of the calling thread through each recall (the encoder runs on a reader
    thread for a result the cache lacks, so this is the recall's own work on its thread, before and after the
    embedding), of ``recall_items`` within it (everything after the embedding), the process's CPU of each
    recall, and the floor's (query embedding + one FAISS search, top 30) on the same queries, interleaved;
    medians, one JSON line. Alternate trees in fresh processes to compare.
``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_dump.py parts --workdir DIR --facts N [--rounds 5]``
    the recorded recalls of ``replay`` run again, the thread CPU of each part of ``recall_items`` (``PARTS``: the
    FAISS searches, the graph step and its walk, the channel shares, the similarities, the scoring, the result
    models, ...) summed per recall by wrappers on calls made a few times a recall; each part's median, in us.
``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_dump.py scans --workdir DIR --facts N [--rounds 7]``
    the recorded recalls run again, alternately with the FAISS searches run and answered from a memo of their
    own hits (the same hits, no scan): ``recall_items``' thread CPU less the searches' own, medians. What the
    Python after the scans pays for the caches the scans evict.

``--pools FV,EV,KW,G`` (any of the above but ``load``): the reader's recipe with these channel pools
(``RecallRecipe.k``: fact_vector, episode_vector, keyword, graph) in place of the default's, to compare pools
in fresh processes of one tree as trees are compared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
FIXED_NOW = datetime(2024, 9, 1, 12, 0, tzinfo=UTC)  # after every bulk fact and every LoCoMo turn


@contextlib.contextmanager
def _reader(workdir: Path, data: Path, user_id: str) -> Iterator[Any]:
    """A client of the SQLite store under ``data`` with a Redis of its own (``user_id``'s stamp published,
    as a reader process has it); both closed (the Redis's folder removed) after."""
    from recall_ab import backend_redis

    from engram_api import MemoryClient
    from engram_api.settings import Settings
    from engram_api.versions import publish_stamp
    from engram_workers.services import RedisServer

    folder = Path(tempfile.mkdtemp(prefix="redis-", dir=workdir))
    redis = RedisServer(data_dir=folder, appendonly=False)
    redis.start()
    try:
        settings = Settings(data_dir=data, neo4j_uri=None)
        client = MemoryClient(settings=settings, redis_url=backend_redis(redis.url, "sqlite"))
        try:
            if client.graph.user_version(user_id) > 0:
                publish_stamp(client.redis, user_id, client.graph.user_stamp(user_id))
            yield client
        finally:
            client.close()
    finally:
        redis.stop()
        shutil.rmtree(folder, ignore_errors=True)


def load(workdir: Path, facts: int) -> None:
    from bulk import bulk_load

    user_id = f"dump-{facts}"
    with _reader(workdir, workdir / f"data-{facts}", user_id) as client:
        if client.graph.user_version(user_id) == 0:
            reader = client.reader
            bulk_load(
                client.graph, reader.keeper, reader.embedder, client.redis, user_id, facts, str(facts), out=workdir
            )


def _fix_clock() -> None:
    """Every clock recall reads (``models.utcnow`` as each module imported it, ``validity``'s ``datetime``)
    answers ``FIXED_NOW``: recency and read-time decay then score alike in both trees' processes."""
    import engram_api.models.base as base
    from engram_api.storage.graph import validity

    original = base.utcnow

    def fixed() -> datetime:
        return FIXED_NOW

    class FixedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return FIXED_NOW

    for name, module in list(sys.modules.items()):
        if name.startswith("engram_api") and getattr(module, "utcnow", None) is original:
            module.utcnow = fixed  # type: ignore[attr-defined]
    validity.datetime = FixedDatetime  # type: ignore[misc]


def _warm(reader: Any, user_id: str) -> None:
    """Recalls until the user's snapshot is held at the current stamp (loaded on a reader thread)."""
    for i in range(50):
        reader.recall(user_id, f"warm-up query number {i}", k=10)
        reader.flush()
        if reader.snapshots.get(user_id, reader.graph.user_stamp(user_id)) is not None:
            return
    raise RuntimeError("the user's snapshot was never held")


def _ways(reader: Any, user_id: str) -> list[dict[str, Any]]:
    """k 10; k 30; k 10 since the middle of the user's time span (its facts' starts, its turns' times);
    k 30 as of three quarters through it."""
    snapshot = reader.snapshots.get(user_id, reader.graph.user_stamp(user_id))
    times = [f.valid_from for f in snapshot.facts.values()]
    times += [c.event_time for c in snapshot.chunks.values()]
    start, span = min(times), max(times) - min(times)
    return [{"k": 10}, {"k": 30}, {"k": 10, "since": start + span / 2}, {"k": 30, "as_of": start + span * 3 / 4}]


def dump(workdir: Path, data: Path, user_id: str, qs: list[str], out: Path) -> None:
    with _reader(workdir, data, user_id) as client:
        _fix_clock()
        reader = client.reader
        _warm(reader, user_id)
        ways, lines = _ways(reader, user_id), 0
        with out.open("w") as fh:
            for q in qs:
                for way in ways:
                    result = reader.recall(user_id, q, **way)
                    assert not result.cached
                    for rank, item in enumerate(result.items):
                        row = item.model_dump(mode="json", exclude={"breakdown", "score"})
                        row.update(
                            query=q, way=repr(sorted(way.items())), rank=rank, score=repr(item.score),
                            breakdown={f: repr(v) for f, v in item.breakdown.model_dump().items()},
                        )  # fmt: skip
                        fh.write(json.dumps(row, sort_keys=True) + "\n")
                        lines += 1
        import engram_api

        print(json.dumps({"items": lines, "recalls": len(qs) * len(ways), "tree": engram_api.__file__}))


def cpu(workdir: Path, data: Path, user_id: str, qs: list[str]) -> None:
    import engram_api.reader.recall as recall_module

    with _reader(workdir, data, user_id) as client:
        reader = client.reader
        _warm(reader, user_id)
        index = reader.keeper.current(user_id, reader.graph.user_stamp(user_id))
        own, proc, floor, after = [], [], [], []
        items = recall_module.recall_items

        def timed_items(**kw: Any) -> Any:  # everything after the query's embedding, on this thread
            start = time.thread_time()
            try:
                return items(**kw)
            finally:
                after.append((time.thread_time() - start) * 1e3)

        recall_module.recall_items = timed_items
        for q in qs:
            t, p = time.thread_time(), time.process_time()
            result = reader.recall(user_id, q, k=10)
            own.append((time.thread_time() - t) * 1e3)
            reader.flush()  # the recall log's thread: counted in the process's CPU of this recall
            proc.append((time.process_time() - p) * 1e3)
            assert not result.cached
            p = time.process_time()
            index.search(reader.embedder.encode([q])[0], 30)
            floor.append((time.process_time() - p) * 1e3)
        med = statistics.median
        print(
            json.dumps(
                {
                    "items_ms": med(after), "thread_ms": med(own), "process_ms": med(proc), "floor_ms": med(floor),
                    "ratio": med(proc) / med(floor), "load": os.getloadavg()[0],
                }
            )
        )  # fmt: skip


@contextlib.contextmanager
def _recorded(workdir: Path, data: Path, user_id: str, qs: list[str]) -> Iterator[list[dict[str, Any]]]:
    """The arguments of ``recall_items`` in recalls of ``qs`` (k 10 and k 30 by turns, the clock fixed), the
    keyword hits as they came, in a reader process whose snapshot of the user is held (closed after)."""
    import engram_api.reader.recall as recall_module

    with _reader(workdir, data, user_id) as client:
        _fix_clock()
        reader = client.reader
        _warm(reader, user_id)
        items = recall_module.recall_items
        recorded: list[dict[str, Any]] = []

        def recording(**kw: Any) -> Any:
            recorded.append({**kw, "keyword": None if kw["keyword"] is None else kw["keyword"].result()})
            return items(**kw)

        recall_module.recall_items = recording
        try:
            for i, q in enumerate(qs):
                reader.recall(user_id, q, k=(10, 30)[i % 2])
        finally:
            recall_module.recall_items = items
        yield recorded


def _again(kw: dict[str, Any]) -> float:
    """One recorded ``recall_items`` run again (its keyword hits handed over as they came); its thread CPU, ms."""
    from concurrent.futures import Future

    import engram_api.reader.recall as recall_module

    hits: Future[Any] | None = None
    if kw["keyword"] is not None:
        hits = Future()
        hits.set_result(kw["keyword"])
    start = time.thread_time()
    recall_module.recall_items(**{**kw, "keyword": hits, "timings": {}})
    return (time.thread_time() - start) * 1e3


def replay(workdir: Path, data: Path, user_id: str, qs: list[str], rounds: int) -> None:
    """``recall_items`` (everything a recall does after the query's embedding) of the recorded recalls
    (``_recorded``), run again ``rounds`` times in this process; each recall's least thread CPU over the rounds,
    the median and mean of those."""
    with _recorded(workdir, data, user_id, qs) as recorded:
        least = [float("inf")] * len(recorded)
        for _ in range(rounds):
            for i, kw in enumerate(recorded):
                least[i] = min(least[i], _again(kw))
        print(
            json.dumps(
                {"recall_items_ms": statistics.median(least), "mean_ms": statistics.fmean(least),
                 "load": os.getloadavg()[0]}
            )
        )  # fmt: skip


# The parts ``parts`` times: (module, class or None, attribute, label), each called a few times a recall (a
# wrapper costs ~1 us a call), nested parts counted in their parents too.
PARTS = (
    ("engram_api.storage.faiss.index", "UserIndex", "search", "faiss_search"),
    ("engram_api.reader.fusion", "_Run", "channels", "channels"),
    ("engram_api.reader.fusion", "_Run", "_graph_step", "graph_step"),
    ("engram_api.storage.snapshot.graph", "UserSnapshot", "graph_step", "snapshot_step"),
    ("engram_api.storage.snapshot.graph", "UserSnapshot", "_expand", "walk"),
    ("engram_api.reader.fusion", "_Run", "_rank", "channel_shares"),
    ("engram_api.reader.fusion", "_Run", "links", "links"),
    ("engram_api.reader.fusion", "_Run", "items", "items"),
    ("engram_api.storage.faiss.index", "UserIndex", "similarities", "similarities"),
    ("engram_api.reader.scoring", "Scoring", "rows", "scoring"),
    ("engram_api.reader.fusion", None, "similarity_step", "second_look"),
    ("engram_api.reader.fusion", None, "result_items", "result_models"),
)


def parts(workdir: Path, data: Path, user_id: str, qs: list[str], rounds: int) -> None:
    """Each part's thread CPU per recorded recall (``PARTS``), medians in us, with ``recall_items``' own."""
    import importlib

    spent: dict[str, int] = {}

    def timed(fn: Any, label: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0) + time.thread_time_ns() - start

        return run

    with _recorded(workdir, data, user_id, qs) as recorded:
        for module, owner, attr, label in PARTS:
            holder = getattr(importlib.import_module(module), owner) if owner else importlib.import_module(module)
            setattr(holder, attr, timed(getattr(holder, attr), label))
        per: dict[str, list[float]] = {"recall_items": []}
        for _ in range(rounds):
            for kw in recorded:
                spent.clear()
                per["recall_items"].append(_again(kw) * 1e3)
                for label, ns in spent.items():
                    per.setdefault(label, []).append(ns / 1e3)
        out = {label: round(statistics.median(v)) for label, v in per.items()}
        print(json.dumps({**out, "load": os.getloadavg()[0]}))


def scans(workdir: Path, data: Path, user_id: str, qs: list[str], rounds: int) -> None:
    """``recall_items``' thread CPU less its FAISS searches', with the searches run and answered from a memo of
    their own hits, alternated by pass (the first pass fills the memo and is not counted); medians in us."""
    from engram_api.storage.faiss.index import UserIndex

    real = UserIndex.search
    memo: dict[tuple[bytes, int, Any], list[Any]] = {}
    state = {"memo": False, "ns": 0}

    def search(self: Any, query: Any, k: int, kind: Any = None) -> Any:
        key = (query.tobytes(), k, kind)
        start = time.thread_time_ns()
        hits = list(memo[key]) if state["memo"] and key in memo else real(self, query, k, kind)
        memo.setdefault(key, list(hits))
        state["ns"] += time.thread_time_ns() - start
        return hits

    with _recorded(workdir, data, user_id, qs) as recorded:
        UserIndex.search = search  # type: ignore[method-assign]
        after: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            state["memo"] = bool(r % 2)
            for kw in recorded:
                state["ns"] = 0
                ms = _again(kw)
                if r:
                    after[bool(state["memo"])].append(ms * 1e3 - state["ns"] / 1e3)
        med = statistics.median
        print(
            json.dumps(
                {"after_scans_us": round(med(after[False])), "no_scans_us": round(med(after[True])),
                 "load": os.getloadavg()[0]}
            )
        )  # fmt: skip


def _use_pools(spec: str) -> None:
    """Every reader made after this asks its channels for ``spec``'s pools (the default recipe's ``k``)."""
    import engram_api.reader.recall as recall_module
    from engram_api.reader.recipe import CHANNELS

    k = dict(zip(CHANNELS, map(int, spec.split(",")), strict=True))
    recall_module.DEFAULT_RECIPE = recall_module.DEFAULT_RECIPE.model_copy(update={"k": k})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("load", "dump", "cpu", "replay", "parts", "scans"))
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--facts", type=int, default=1_000, help="the bulk user of this size (under --workdir)")
    parser.add_argument("--data", type=Path, help="another SQLite data folder (e.g. a kept bench run's)")
    parser.add_argument("--user", help="its user")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument(
        "--query-file", type=Path, help="these queries (one a line, repeats dropped) instead of --queries"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pools", help="FV,EV,KW,G: the recipe's channel pools (RecallRecipe.k) instead")
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    if args.pools:
        _use_pools(args.pools)
    args.workdir.mkdir(parents=True, exist_ok=True)
    data, user = args.data or args.workdir / f"data-{args.facts}", args.user or f"dump-{args.facts}"
    if args.what == "load":
        load(args.workdir, args.facts)
        return
    from corpus import queries

    # Distinct queries each (a repeated one would be a result-cache hit); cpu's new each run, so the encoder's
    # cache of an earlier run in the process never answers.
    label = {"dump": "recall-dump", "cpu": f"recall-cpu-{time.time_ns()}"}.get(args.what, "recall-replay")
    asked = args.query_file.read_text().splitlines() if args.query_file else queries(label, args.queries)
    qs = list(dict.fromkeys(q for q in asked if q.strip()))
    if args.what == "dump":
        dump(args.workdir, data, user, qs, args.out)
    elif args.what == "cpu":
        cpu(args.workdir, data, user, qs)
    elif args.what == "replay":
        replay(args.workdir, data, user, qs, args.rounds)
    else:
        (parts if args.what == "parts" else scans)(args.workdir, data, user, qs, args.rounds)


if __name__ == "__main__":
    main()
