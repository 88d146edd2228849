"""What one write costs a reader's held snapshot, and what the snapshot then costs a recall: a focused
micro-bench of ``UserSnapshot.updated`` (a change-feed entry merged into a held snapshot) at 10K and 100K
facts, with no services (synthetic records shaped as the ``hosts`` bench's bulk user: ~79 % of the facts
about the user's own node, the rest spread over a few thousand entities, one chunk per message).

``python ops/bench/snapshot_merge.py [--facts 10000,100000] [--writes 60] [--queries 40]``

For each size: build the snapshot whole, then merge ``--writes`` writes of one new fact and its chunk, one
at a time, each timed (thread CPU: what the reader's catch-up thread spends), a fact superseded every
fifth write (a changed record, as a one-valued slot's new value changes the old one); then time
``--queries`` graph steps and keyword searches on the snapshot as the writes left it and on one built
whole from the same records (``merged`` when the tree has one: the reads must cost the same). Prints JSON.
Run it from two trees (before and after a change) alternately to compare in one sitting.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

WORDS = tuple(
    [
        "coffee",
        "hiking",
        "paris",
        "violin",
        "sister",
        "garden",
        "python",
        "marathon",
        "chess",
        "museum",
        "tokyo",
        "bakery",
        "novel",
        "guitar",
        "cycling",
        "yoga",
        "kitchen",
        "lisbon",
        "camera",
        "piano",
        "ocean",
        "winter",
        "spring",
        "autumn",
        "summer",
        "river",
        "mountain",
        "library",
        "painting",
        "dance",
        "theatre",
        "football",
        "tennis",
        "recipe",
        "bread",
        "cheese",
        "wine",
        "tea",
        "dog",
        "cat",
        "horse",
    ]
)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _records(n: int, rng: random.Random) -> tuple[list[Any], list[Any]]:
    from engram_api.models import ChunkRecord, FactRecord

    owner = "user-bench::self"
    entities = [f"ent-{i:05d}" for i in range(max(10, n // 30))]
    facts, chunks = [], []
    for i in range(n):
        subject = owner if rng.random() < 0.79 else rng.choice(entities)
        words = " ".join(rng.choices(WORDS, k=4))
        facts.append(
            FactRecord(
                id=f"fact-{i:07d}",
                user_id="user-bench",
                subject_id=subject,
                subject_name="x",
                predicate="LIKES",
                object_id=rng.choice(entities),
                object_name="y",
                statement=f"The user likes {words} {i}",
                importance=round(rng.random(), 2),
                valid_from=T0 + timedelta(minutes=i),
            )
        )
        chunks.append(
            ChunkRecord(
                id=f"chunk-{i:07d}",
                user_id="user-bench",
                episode_id=f"ep-{i:07d}",
                seq=0,
                text=f"I like {words} a lot {i}",
                speaker="user",
                event_time=T0 + timedelta(minutes=i),
                fact_ids=[f"fact-{i:07d}"],
            )
        )
    return facts, chunks


def _cpu_ms(fn: Any) -> tuple[float, Any]:
    start = time.thread_time()
    out = fn()
    return (time.thread_time() - start) * 1e3, out


def measure(n: int, writes: int, queries: int) -> dict[str, Any]:
    from engram_api.storage.graph.step import GraphStepQuery
    from engram_api.storage.snapshot.graph import UserSnapshot
    from engram_api.versions import Stamp

    rng = random.Random(n)
    facts, chunks = _records(n, rng)
    stamp = Stamp(epoch=1, version=1)
    snapshot = UserSnapshot.of("user-bench", stamp, facts, chunks)
    merge_ms: list[float] = []
    written_f, written_c = list(facts), list(chunks)
    for w in range(writes):
        new_f, new_c = _records(1, random.Random(10_000 + w))
        fact = new_f[0].model_copy(update={"id": f"new-fact-{w:04d}", "valid_from": T0 + timedelta(days=400 + w)})
        chunk = new_c[0].model_copy(update={"id": f"new-chunk-{w:04d}", "episode_id": f"new-ep-{w:04d}"})
        changed = [fact]
        if w % 5 == 4:  # a supersession: an older fact ends where the new one starts
            old = rng.choice(written_f[: len(facts)])
            changed.append(old.model_copy(update={"valid_until": fact.valid_from, "superseded_by": fact.id}))
        stamp = Stamp(epoch=1, version=stamp.version + 1)
        ms, snapshot = _cpu_ms(partial(snapshot.updated, stamp, changed, [chunk]))
        merge_ms.append(ms)
        written_f += changed
        written_c.append(chunk)
    whole = UserSnapshot.of("user-bench", stamp, {f.id: f for f in written_f}.values(), written_c)
    merged = snapshot.merged() if hasattr(snapshot, "merged") else None

    def reads(held: Any) -> dict[str, float]:
        qrng = random.Random(7)
        step_ms, kw_ms = [], []
        for _ in range(queries):
            seeds = [f"fact-{qrng.randrange(n):07d}" for _ in range(8)]
            query = GraphStepQuery(
                fact_ids=seeds, seed_facts=seeds, max_hops=2, limit=60, per_seed=10,
                avoid=["user-bench::self"],
            )  # fmt: skip
            ms, _ = _cpu_ms(lambda q=query: held.graph_step(q))
            step_ms.append(ms)
            terms = [*qrng.choices(WORDS, k=3), "user"]
            ms, _ = _cpu_ms(lambda t=terms: held.keyword_search(t, 30))
            kw_ms.append(ms)
        return {"graph_step_ms": statistics.median(step_ms), "keyword_ms": statistics.median(kw_ms)}

    out = {
        "facts": n,
        "merge_ms_p50": round(statistics.median(merge_ms), 3),
        "merge_ms_max": round(max(merge_ms), 3),
        "reads_after_writes": reads(snapshot),
        "reads_built_whole": reads(whole),
    }
    if merged is not None:
        out["merge_into_base_ms"] = round(_cpu_ms(snapshot.merged)[0], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="10000,100000")
    parser.add_argument("--writes", type=int, default=60)
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    for n in (int(x) for x in args.facts.split(",") if x):
        print(json.dumps(measure(n, args.writes, args.queries)), flush=True)


if __name__ == "__main__":
    main()
