"""A writer process for the FAISS delta-log crash tests: ``python -m tests.support.index_writer DB ROOT USER``.

Writes one user's memory forever through the real path (``UserWrites`` over a SQLite graph, the
``IndexKeeper`` appending one delta record per write, compacting often with the tiny thresholds below):
each message adds two facts, every third one also forgets an earlier message (removals in the log).
Prints ``<epoch>:<version>`` after each finished write, so the test can SIGKILL it at any point after N.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from engram_api.storage.writer.userwrite import UserWrites
from tests.support.builders import DIM, UserGraph, write_step

# Compact whenever the log passes half the base: many compactions in a short run, so kills land in them.
COMPACT = {"compact_min_bytes": 0, "compact_ratio": 0.5}


def vector_store(root: Path) -> VectorStore:
    return VectorStore(root=root, dim=DIM, **COMPACT)  # type: ignore[arg-type]


def main(db: str, root: str, user: str) -> None:
    graph = SqliteGraphStore(path=Path(db))
    graph.ensure_schema()
    writes = UserWrites(
        graph=graph,
        keeper=IndexKeeper(graph=graph, vectors=vector_store(Path(root))),
        redis_client=None,
        lease_ttl_s=30,
    )
    said = UserGraph(graph, user)
    messages: list[str] = [e.id for e in graph.episodes(user)]
    step = len(messages)
    while True:
        print(
            writes.run(user, partial(write_step, said=said, step=step, messages=messages, things=2), wait=0), flush=True
        )
        messages += [e.id for e in graph.episodes(user) if e.id not in messages]
        step += 1


if __name__ == "__main__":
    main(*sys.argv[1:4])
