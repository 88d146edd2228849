"""What a removal (a fact forgotten on another host) costs a reader's held snapshot, and what the snapshot then
costs a keyword search: a focused micro-bench with no services, on ``snapshot_merge``'s synthetic records
(~79 % of the facts about the user's own node, so a fact's statement holds the user's most common words).

``python ops/bench/snapshot_removal.py [--facts 10000,100000] [--removals 40] [--queries 40]``

For each size: build the snapshot whole, then take ``--removals`` facts out of it one at a time as a catch-up
does (``UserSnapshot.refreshed`` with the removed id: ``removal.without``), each timed in thread CPU (what the
reader's catch-up thread spends, on the recall's path when the recall waits for it); then the fold that follows
a removal (``UserSnapshot.merged``, on a reader thread off the path: the least of three, thread CPU); then time ``--queries``
keyword searches on the snapshot as the removals left it and on one built whole from the remaining records,
and check that both answer the same (ids and scores). Prints JSON. Run it from two trees (before and after a
change) alternately to compare in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

from snapshot_merge import WORDS, _records


def measure(n: int, removals: int, queries: int) -> dict[str, Any]:
    from engram_api.storage.snapshot.graph import UserSnapshot
    from engram_api.versions import Stamp

    rng = random.Random(n)
    facts, chunks = _records(n, rng)
    held = UserSnapshot.of("user-bench", Stamp(1, 1), facts, chunks)
    gone = rng.sample([f.id for f in facts], removals)
    costs = []
    for i, fid in enumerate(gone):
        stamp = Stamp(1, 2 + i)
        start = time.thread_time()
        fresh = held.refreshed(stamp, stamp.version, [], [], max_records=10 * n, gone=[fid])
        costs.append((time.thread_time() - start) * 1e3)
        assert fresh is not None
        held = fresh
    folds = []
    for _ in range(3):
        start = time.thread_time()
        held.merged()
        folds.append((time.thread_time() - start) * 1e3)
    dropped = set(gone)
    whole = UserSnapshot.of("user-bench", held.stamp, [f for f in facts if f.id not in dropped], chunks)
    asked = [["user", *rng.sample(WORDS, 2)] for _ in range(queries)]

    def searches(snapshot: Any) -> tuple[float, list[Any]]:
        spent, answers = [], []
        for words in asked:
            start = time.thread_time()
            hits = snapshot.keyword_search(words, 30)
            spent.append((time.thread_time() - start) * 1e3)
            answers.append([(h.node_id, h.kind, h.score) for h in hits])
        return statistics.median(spent), answers

    held_ms, held_answers = searches(held)
    whole_ms, whole_answers = searches(whole)
    return {
        "facts": n,
        "removals": removals,
        "removal_p50_ms": round(statistics.median(costs), 3),
        "removal_max_ms": round(max(costs), 3),
        "fold_ms": round(min(folds), 1),
        "search_p50_ms": round(held_ms, 3),
        "search_whole_p50_ms": round(whole_ms, 3),
        "same_answers": held_answers == whole_answers,
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="10000,100000", help="the snapshots' sizes, comma-separated")
    parser.add_argument("--removals", type=int, default=40, help="facts taken out, one at a time")
    parser.add_argument("--queries", type=int, default=40, help="keyword searches after the removals")
    args = parser.parse_args()
    results = [measure(int(n), args.removals, args.queries) for n in args.facts.split(",")]
    print("\n".join(json.dumps(r) for r in results))


if __name__ == "__main__":
    main()
