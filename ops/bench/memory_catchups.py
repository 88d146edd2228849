"""Two catch-ups with no services but a SQLite file, at a user's size, on the code of one or more trees,
alternated: a FAISS copy held in memory only (``IndexKeeper(persist=False)``, a maintenance run's copies)
one write behind, and a reader's held snapshot refreshed off the recall's path after a forget
(``GraphStore.refresh_snapshot``, as ``SnapshotCache`` does, loading the user whole when it refuses).

``python ops/bench/memory_catchups.py [--facts 10000] [--writes 30] [--rounds 2] [--trees DIR,DIR]``

One SQLite graph store in a temp directory, one user of ``--facts`` facts with random unit vectors (MiniLM's
dimension) and a distinct number in each statement (a real user's tables hold many rare terms), written in
batches through ``GraphStore.apply``. A persist=False keeper loads the user whole (one rebuild), then
``--writes`` times one fact is written and the keeper's ``current`` catches the copy up (the graph's read of
what changed, then the copy moved to the new stamp, ``VectorStore.moved``). Then a snapshot of the user is
loaded whole and 8 times one fact is forgotten and the snapshot refreshed. Prints each p50 in ms (the whole
catch-up, the copy's move alone, the refresh after a forget) and the refresh's whole loads. With ``--trees``,
each round runs this script once per tree in a fresh process (``PYTHONPATH`` = the tree), the trees' order
alternating round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_BATCH = 1_000
_FORGETS = 8
_DIM = 384


def measure(facts: int, writes: int) -> dict[str, Any]:
    """In this process's tree (see the module docstring)."""
    import numpy as np

    from engram_api.models import EntityRecord, EpisodeRecord, FactRecord, WritePlan, utcnow
    from engram_api.naming import normalize_name, self_entity_id
    from engram_api.storage.faiss.files import VectorStore
    from engram_api.storage.faiss.keeper import IndexKeeper
    from engram_api.storage.graph.sqlite.store import SqliteGraphStore

    root = Path(tempfile.mkdtemp(prefix="memory-catchups-"))
    graph = SqliteGraphStore(path=root / "g.db")
    graph.ensure_schema()
    user, rng = "bench-memory-catchups", np.random.default_rng(7)

    def vectors(n: int) -> np.ndarray:
        v = rng.standard_normal((n, _DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def write(lo: int, n: int) -> None:
        now = utcnow()
        me = self_entity_id(user)
        entities = [] if lo else [EntityRecord(id=me, user_id=user, name="User", norm_name=normalize_name("User"), label="Person")]  # fmt: skip
        new_facts = [
            FactRecord(
                id=f"fact-{i}",
                user_id=user,
                subject_id=me,
                predicate="NOTED",
                statement=f"The user noted item {i}.",
                valid_from=now,
                created_at=now,
                embedding=vec.tolist(),
            )
            for i, vec in zip(range(lo, lo + n), vectors(n), strict=True)
        ]
        episode = EpisodeRecord(id=f"ep-{lo}", user_id=user, content=f"item {lo}", event_time=now)
        graph.apply(WritePlan(user_id=user, episode=episode, new_entities=entities, new_facts=new_facts))

    for lo in range(0, facts, _BATCH):
        write(lo, min(_BATCH, facts - lo))
    keeper = IndexKeeper(graph=graph, vectors=VectorStore(root=root / "idx", dim=_DIM), persist=False)
    keeper.current(user, graph.user_stamp(user))
    moved: list[float] = []
    real = keeper.vectors.moved

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            moved.append((time.perf_counter() - start) * 1e3)

    keeper.vectors.moved = timed  # type: ignore[method-assign]
    catchup: list[float] = []
    for i in range(writes):
        write(facts + i, 1)
        start = time.perf_counter()
        index = keeper.current(user, graph.user_stamp(user))
        catchup.append((time.perf_counter() - start) * 1e3)
    assert len(index) == facts + writes and (keeper.rebuilds, keeper.catchups) == (1, writes)
    bound = 2 * (facts + writes)
    held, refresh, whole = graph.snapshot(user, max_records=bound), [], 0
    for i in range(_FORGETS):
        graph.forget_fact(user, f"fact-{i * facts // _FORGETS}")
        start = time.perf_counter()
        fresh = graph.refresh_snapshot(held, max_records=bound)
        if fresh is None:  # what ``SnapshotCache`` does then
            whole += 1
            fresh = graph.snapshot(user, max_records=bound)
        refresh.append((time.perf_counter() - start) * 1e3)
        held = fresh
    return {
        "vectors": len(index),
        "catchup_p50_ms": statistics.median(catchup),
        "moved_p50_ms": statistics.median(moved),
        "overlay_rows": index.overlay_size,
        "refresh_after_forget_p50_ms": statistics.median(refresh),
        "refresh_whole_loads": whole,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--writes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trees", default="", help="comma-separated checkouts to compare, alternated")
    args = parser.parse_args()
    if not args.trees:
        print(json.dumps(measure(args.facts, args.writes)))
        return
    trees = args.trees.split(",")
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree}
            cmd = [sys.executable, __file__, "--facts", str(args.facts), "--writes", str(args.writes)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            print(json.dumps({"round": r, "tree": tree, "load_1min": os.getloadavg()[0], **json.loads(out)}))


if __name__ == "__main__":
    main()
