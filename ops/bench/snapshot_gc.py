"""What a held snapshot costs the garbage collector: a full ``gc.collect()`` (thread CPU, the median of 15
after two warm-up collections) in this process before and while it holds one user's snapshot built from
``snapshot_merge``'s synthetic records, and the objects the snapshot leaves tracked. No services.

``PYTHONPATH=<tree>:ops/bench python ops/bench/snapshot_gc.py [--facts 10000,100000]``

Run it from two trees alternately to compare in one sitting. Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time

from snapshot_merge import _records


def _full_collection() -> tuple[float, int]:
    """A full collection's thread CPU (ms, median of 15) and the objects the collector tracks."""
    gc.collect()
    gc.collect()
    spent = []
    for _ in range(15):
        start = time.thread_time()
        gc.collect()
        spent.append((time.thread_time() - start) * 1e3)
    return statistics.median(spent), len(gc.get_objects())


def measure(n: int) -> dict[str, float | int]:
    from engram_api.storage.snapshot.graph import UserSnapshot
    from engram_api.versions import Stamp

    before_ms, before_objects = _full_collection()
    facts, chunks = _records(n, random.Random(n))
    start = time.thread_time()
    snapshot = UserSnapshot.of("user-bench", Stamp(1, 1), facts, chunks)
    build_ms = (time.thread_time() - start) * 1e3
    del facts, chunks
    held_ms, held_objects = _full_collection()
    assert len(snapshot.facts) == n
    return {
        "facts": n,
        "collection_before_ms": round(before_ms, 2),
        "collection_held_ms": round(held_ms, 2),
        "snapshot_ms": round(held_ms - before_ms, 2),
        "tracked_by_snapshot": held_objects - before_objects,
        "build_ms": round(build_ms),
        "load": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="10000,100000")
    args = parser.parse_args()
    for n in (int(x) for x in args.facts.split(",")):
        print(json.dumps(measure(n)))


if __name__ == "__main__":
    main()
