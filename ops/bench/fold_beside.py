"""What a held snapshot's fold costs the recall it runs beside: a focused micro-bench with no services, on
``snapshot_merge``'s synthetic records.

``python ops/bench/fold_beside.py [--facts 10000,100000] [--rounds 15]``

A removal's catch-up runs on a reader thread while its recall waits for it; the recall then reads the caught-up
snapshot in Python (keyword searches, the walk). Until the fold waited for the process's recalls to pause
(``ReaderThreads.when_idle``), the catch-up started the fold on another reader thread right then, and the two
took turns for the GIL. For each size: take one fact out of a held snapshot (``removal.without``), then time,
on this thread, a recall's in-memory tail (``--searches`` keyword searches and graph steps) once alone and once
with the fold (``UserSnapshot.merged``) started on another thread just before it, as the catch-up used to start
it; alternated round by round. Prints JSON: the tail's wall milliseconds, p50 of each, and the fold's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from typing import Any

from snapshot_merge import WORDS, _records


def measure(n: int, rounds: int, searches: int) -> dict[str, Any]:
    from engram_api.storage.graph.step import GraphStepQuery
    from engram_api.storage.snapshot.graph import UserSnapshot
    from engram_api.storage.snapshot.removal import without
    from engram_api.versions import Stamp

    rng = random.Random(n)
    facts, chunks = _records(n, rng)
    held = without(UserSnapshot.of("user-bench", Stamp(1, 1), facts, chunks), [rng.choice(facts).id])
    asked = [["user", *rng.sample(WORDS, 2)] for _ in range(searches)]
    seeds = [f.subject_id for f in rng.sample(facts, searches)]
    now = max(f.valid_from for f in facts if f.valid_from is not None)

    def tail() -> float:
        start = time.perf_counter()
        for words, seed in zip(asked, seeds, strict=True):
            held.keyword_search(words, 30)
            held.graph_step(GraphStepQuery(seeds=[seed], max_hops=2, limit=40, per_seed=8, now=now, avoid=[]))
        return (time.perf_counter() - start) * 1e3

    tail()  # warm (the stemmer, the first search's arrays): neither side's first round pays for it
    alone, beside, folds = [], [], []
    for i in range(rounds):
        for with_fold in (False, True)[:: 1 if i % 2 else -1]:
            if not with_fold:
                alone.append(tail())
                continue
            fold = threading.Thread(target=lambda: folds.append(_timed(held.merged)))
            fold.start()
            beside.append(tail())
            fold.join()
    return {
        "facts": n,
        "tail_alone_p50_ms": round(statistics.median(alone), 2),
        "tail_beside_fold_p50_ms": round(statistics.median(beside), 2),
        "fold_wall_p50_ms": round(statistics.median(folds), 1),
        "load": round(os.getloadavg()[0], 1),
    }


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="10000,100000", help="the snapshots' sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=15, help="tails timed alone and beside a fold, each")
    parser.add_argument("--searches", type=int, default=3, help="keyword searches and graph steps in a tail")
    args = parser.parse_args()
    for n in args.facts.split(","):  # each size as it is measured (the 100K build takes a while)
        print(json.dumps(measure(int(n), args.rounds, args.searches)), flush=True)


if __name__ == "__main__":
    main()
