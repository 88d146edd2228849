"""What a held snapshot's keyword search costs a recall, and what building and catching up its keyword index
costs: a focused micro-bench on a bulk-loaded SQLite user (``recall_dump.py load``), no other service.

``PYTHONPATH=<tree>:ops/bench python ops/bench/keyword_search.py --workdir DIR --facts 10000 [--queries 200]``

The user's snapshot is loaded whole from the store (``GraphStore.snapshot``), then three states of it are
searched with the keyword channel's own calls (``fusion.keyword_hits``' terms and k, the query words of
``recall_dump``'s queries, each with no window, ``since`` the middle of the user's time span and ``as_of``
three quarters through it): as loaded (``held``), right after a write of one new fact and its chunk
(``written``: ``UserSnapshot.updated``; a chunk too when the user has any; the recent tables searched with the base under the union's
statistics) and right after a fact's removal (``removed``: a hole in the base table). Each search is timed
in thread CPU ``--rounds`` times; its least, their median and sum per state (``*_p50_us``, ``*_sum_ms``).
``digest`` hashes every answer (ids, kinds and the scores' ``repr``): two trees answer alike when their
digests are equal. ``build_ms`` is ``KeywordIndex.of`` over the user's texts, ``add_us`` one write's
``KeywordIndex.added`` (the catch-up, on the recall's path), ``fold_ms`` the fold of that write
(``merged`` then ``without_holes``), each the least of three. Prints one JSON line. Alternate trees in
fresh processes to compare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


def _least(fn: Callable[[], Any], rounds: int = 3) -> float:
    """The least thread CPU of ``rounds`` calls of ``fn``, ms."""
    spent = []
    for _ in range(rounds):
        start = time.thread_time()
        fn()
        spent.append((time.thread_time() - start) * 1e3)
    return min(spent)


def measure(data: Path, user_id: str, n: int, rounds: int) -> dict[str, Any]:
    from corpus import queries

    from engram_api.reader.fusion import keyword_terms
    from engram_api.settings import Settings
    from engram_api.storage import open_graph_store
    from engram_api.storage.snapshot.keywords import KeywordIndex
    from engram_api.storage.snapshot.removal import without_holes
    from engram_api.versions import Stamp

    graph = open_graph_store(Settings(data_dir=data, neo4j_uri=None))
    held = graph.snapshot(user_id, max_records=10**7)
    assert held is not None, f"no user {user_id} under {data}"
    fact_rows, chunk_rows = held.facts.rows(), held.chunks.rows()
    facts = [held.facts.shape.record(r) for r in fact_rows.values()]
    chunks = [held.chunks.shape.record(r) for r in chunk_rows.values()]
    times = sorted([f.valid_from for f in facts] + [c.event_time for c in chunks])
    start, span = times[0], times[-1] - times[0]
    windows: list[dict[str, Any]] = [{}, {"since": start + span / 2}, {"as_of": start + span * 3 / 4}]
    calls = [(keyword_terms(q), w) for q in queries("recall-dump", n) for w in windows]

    stamp = Stamp(held.stamp.epoch, held.stamp.version + 1)
    fact = facts[len(facts) // 2].model_copy(update={"id": "kw-bench-fact", "statement": "User likes kw bench tea"})
    new_chunks = [c.model_copy(update={"id": "kw-bench-chunk", "text": "I like kw bench tea"}) for c in chunks[:1]]
    written = held.updated(stamp, [fact], new_chunks)
    removed = held.refreshed(stamp, 1, [], [], max_records=10**7, gone=[facts[len(facts) // 3].id])
    assert removed is not None
    out: dict[str, Any] = {"facts": len(facts), "chunks": len(chunks), "searches": len(calls)}
    digest = hashlib.sha256()
    for name, snapshot in (("held", held), ("written", written), ("removed", removed)):
        least = [float("inf")] * len(calls)
        for r in range(rounds):
            for i, (terms, window) in enumerate(calls):
                begun = time.thread_time()
                hits = snapshot.keyword_search(terms, 40, **window)
                least[i] = min(least[i], (time.thread_time() - begun) * 1e6)
                if r == 0:
                    digest.update(repr([(h.node_id, h.kind, repr(h.score)) for h in hits]).encode())
        out[f"{name}_p50_us"] = round(statistics.median(least), 1)
        out[f"{name}_sum_ms"] = round(sum(least) / 1e3, 1)
    texts = (
        [(c.id, c.indexed_text) for c in chunks],
        [(f.id, f.statement) for f in facts],
    )
    index = KeywordIndex.of(*texts)
    out["build_ms"] = round(_least(lambda: KeywordIndex.of(*texts)), 1)
    new = ([(c.id, c.indexed_text) for c in new_chunks], [(fact.id, fact.statement)])
    out["add_us"] = round(_least(lambda: index.added(*new), 5) * 1e3, 1)
    grown = index.added(*new)
    out["fold_ms"] = round(_least(lambda: without_holes(grown.merged())), 1)
    out["digest"] = digest.hexdigest()[:16]
    out["load"] = round(os.getloadavg()[0], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="recall_dump.py load's folder")
    parser.add_argument("--facts", type=int, default=10_000, help="the bulk user of this size (under --workdir)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    result = measure(args.workdir / f"data-{args.facts}", f"dump-{args.facts}", args.queries, args.rounds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
