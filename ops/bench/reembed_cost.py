"""What re-embedding a stored chunk costs (``engram maintenance reembed``): a focused bench of
``maintenance.reembed.run_reembed`` on one user's conversation, with no Redis (the jobs' guard without a
lease, as in the maintenance tests) and the real encoder.

``python ops/bench/reembed_cost.py [--chunks 1000] [--rounds 4] [--batch 500] [--neo4j-uri bolt://...]``

Stores ``--chunks`` single-turn messages of two alternating speakers (each carrying the two turns before it
as ``earlier``, as the quality bench ingests LoCoMo) with vectors of the words alone (``none``), then runs
the pass ``--rounds`` times, each to another policy (other_turn, prev_turn, dated, ...), so every round
re-embeds every chunk. Each round first times the encoder alone on the chunks' plain words in batches of
``--batch`` (the floor: what encoding them cost when they were stored), then the pass (batches of
``--batch``), and within it the encoder's share. Prints JSON: per round and the medians, in ms a chunk.
The machine's load moves every figure: read the shares and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from engram_api.models import ChatMessage, Envelope, EpisodeRecord, WritePlan
from engram_api.settings import Settings
from engram_api.storage import GraphStore, open_graph_store
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.episodes import EmbedContext, chunk_envelope
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from engram_api.storage.writer.userwrite import UserWrites
from engram_workers.maintenance import run_reembed

WORDS = [
    "the",
    "lake",
    "house",
    "painting",
    "violin",
    "brother",
    "dog",
    "weekend",
    "Austin",
    "support",
    "group",
    "city",
    "moved",
    "relax",
    "sunsets",
    "practise",
    "evening",
    "garden",
    "novel",
    "marathon",
]
POLICIES: tuple[EmbedContext, ...] = ("other_turn", "prev_turn", "dated")
T0 = datetime(2024, 1, 1, tzinfo=UTC)


class Timed:
    """The encoder, timing its calls."""

    def __init__(self, real: Embedder) -> None:
        self.real, self.dim, self.seconds = real, real.dim, 0.0

    def encode(self, texts: list[str]) -> np.ndarray:
        start = time.perf_counter()
        try:
            return self.real.encode(texts)
        finally:
            self.seconds += time.perf_counter() - start


class TimedStore:
    """The store, timing the calls the pass makes (``calls``: seconds by method)."""

    def __init__(self, store: GraphStore) -> None:
        self.store, self.calls = store, dict[str, float]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls[name] = self.calls.get(name, 0.0) + time.perf_counter() - start

        return timed


def load(store: GraphStore, embedder: Embedder, user: str, n: int) -> list[str]:
    """``n`` turns of ``user`` stored with vectors of their words alone; returns those words per chunk."""
    turns = [
        ("Caroline" if i % 2 else "Melanie", " ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(6 + i % 9)) + ".")
        for i in range(n)
    ]
    plain: list[str] = []
    for lo in range(0, n, 200):
        plans = []
        for i in range(lo, min(n, lo + 200)):
            who, text = turns[i]
            earlier = [ChatMessage(role="user", name=w, content=t) for w, t in turns[max(0, i - 2) : i]]
            when = T0 + timedelta(minutes=i)
            envelope = Envelope(
                user_id=user, message_id=f"m{i}", messages=[ChatMessage(content=text)], timestamp=when,
                metadata={"speaker": who}, earlier=earlier,
            )  # fmt: skip
            episode = EpisodeRecord(
                id=f"m{i}", user_id=user, content=text, event_time=when, metadata={"speaker": who}, created_at=when
            )
            plans.append(
                WritePlan(user_id=user, episode=episode, chunks=chunk_envelope(envelope), chunk_context="none")
            )
        texts = [c.indexed_text for p in plans for c in p.chunks]
        vectors = iter(embedder.encode(texts))
        for plan in plans:
            for chunk in plan.chunks:
                chunk.embedding = next(vectors).tolist()
            store.apply(plan)
        plain += texts
    return plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--neo4j-uri", default=None, help="measure on this Neo4j (migrated) instead of a SQLite file")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="reembed-cost-"))
    store: GraphStore = (
        open_graph_store(Settings(neo4j_uri=args.neo4j_uri)) if args.neo4j_uri else SqliteGraphStore(path=root / "g.db")
    )
    store.ensure_schema()
    embedder = Embedder(model=Settings().embedding_model)
    embedder.encode(["warm-up"])
    user = f"bench-reembed-{uuid.uuid4().hex[:8]}"
    plain = load(store, embedder, user, args.chunks)
    keeper = IndexKeeper(graph=store, vectors=VectorStore(root=root / "idx", dim=embedder.dim), persist=False)
    writes = UserWrites(graph=store, keeper=keeper, redis_client=None, lease_ttl_s=30)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        start = time.perf_counter()
        for lo in range(0, len(plain), args.batch):
            embedder.encode(plain[lo : lo + args.batch])
        floor = time.perf_counter() - start
        timed, policy, graph = Timed(embedder), POLICIES[r % len(POLICIES)], TimedStore(store)
        settings = Settings(chunk_embed_context=policy, maintenance_batch=args.batch)
        start = time.perf_counter()
        report = run_reembed(
            graph=graph, embedder=timed, settings=settings, guard=lambda u: writes.open(u, wait=30.0), user_ids=[user]
        )  # type: ignore[arg-type]
        total = time.perf_counter() - start
        assert not report.failed and report.chunks == len(plain), report
        n = len(plain)
        rounds.append(
            {
                "policy": policy,
                "pass_ms": 1e3 * total / n,
                "encoder_ms": 1e3 * timed.seconds / n,
                "floor_ms": 1e3 * floor / n,
                "store_ms": {k: round(1e3 * v / n, 2) for k, v in sorted(graph.calls.items())},
            }
        )
    median = {k: statistics.median(x[k] for x in rounds) for k in ("pass_ms", "encoder_ms", "floor_ms")}
    median["store_and_index_ms"] = statistics.median(x["pass_ms"] - x["encoder_ms"] for x in rounds)
    median["pass_over_floor"] = statistics.median(x["pass_ms"] / x["floor_ms"] for x in rounds)
    store.forget_user(user)
    store.close()
    out = {"store": "neo4j" if args.neo4j_uri else "sqlite", "chunks": len(plain), "batch": args.batch}
    print(json.dumps({**out, "median": {k: round(v, 2) for k, v in median.items()}, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
