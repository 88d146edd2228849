"""Recall's graph step (``GraphStore.graph_step``, one round trip) against the two-step path it replaced,
and the reader's per-user fact cache on top of it, on every backend.

The oracle is the old path: ``get_facts`` for the hits, the seeds taken from the hydrated seed facts that
pass the recall window (``TimeWindow.fact_ok``, as the reader did), then the expansion contract written out
in plain Python (breadth-first from each seed through facts valid at ``as_of``, the per-seed cap, the
minimum hop over the seeds, the total cap). The converted ``expand`` tests in ``test_graph_store.py`` pin
the old query's hop numbers on hand-built graphs; this suite compares whole answers on a bigger one.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from engram_api.models import FactRecord
from engram_api.reader.facts import FactCache, UserFacts
from engram_api.reader.fusion import TimeWindow
from engram_api.storage import GraphStep, GraphStepQuery, GraphStore
from engram_api.storage.snapshot.graph import HeldStep
from engram_api.storage.snapshot.rows import CHUNK_ROWS, FACT_ROWS, ChunkView, FactView
from tests.support.factories import at, make_entity, make_fact
from tests.support.graph_world import FAR, WINDOWS, build_world, said


def reachable(facts: list[FactRecord], seeds: list[str], q: GraphStepQuery) -> list[tuple[str, int]]:
    """The expansion contract (``GraphStore.graph_step``) in plain Python."""
    valid = [
        f
        for f in facts
        if not f.archived
        and (
            f.valid_until is None
            if q.as_of is None
            else f.valid_from <= q.as_of and (f.valid_until is None or q.as_of < f.valid_until)
        )
    ]
    importance = {f.id: f.importance for f in facts}
    touching: dict[str, list[FactRecord]] = defaultdict(list)
    for f in valid:
        for e in {f.subject_id, f.object_id} - {None}:
            touching[e].append(f)  # type: ignore[index]
    best: dict[str, int] = {}
    for seed in seeds:
        if seed in q.avoid:
            continue
        seen, frontier, level = {seed}, [seed], {}
        for depth in range(q.max_hops + 1):
            later = []
            for e in frontier:
                for f in touching[e]:
                    level.setdefault(f.id, depth)
                    for x in (f.subject_id, f.object_id):
                        if depth < q.max_hops and x and x not in q.avoid and x not in seen:
                            seen.add(x)
                            later.append(x)
            frontier = later
        by_id = sorted(level.items(), reverse=True)  # ties by id descending: the stores' index order
        nearest = sorted(by_id, key=lambda kv: (kv[1], -importance[kv[0]]))[: q.per_seed]
        for fid, hops in nearest:
            best[fid] = min(hops, best.get(fid, hops))
    return sorted(best.items(), key=lambda kv: (kv[1], -importance[kv[0]], kv[0]))[: q.limit]


def two_step(store: GraphStore, user: str, q: GraphStepQuery) -> GraphStep:
    """Today's path before the single round trip: hydrate, seeds from the hydrated facts, expand."""
    hydrated = {f.id: f for f in store.get_facts(user, [*q.fact_ids, *q.seed_facts])}
    window = TimeWindow(as_of=q.as_of, since=q.since, until=q.until)
    seeds = list(q.seeds)
    for fid in q.seed_facts:
        fact = hydrated.get(fid)
        if fact is not None and window.fact_ok(fact):
            seeds.extend(x for x in (fact.subject_id, fact.object_id) if x)
    seeds = [s for s in dict.fromkeys(seeds) if s not in q.avoid]
    hops = reachable(store.page(user, 1, FAR).facts, seeds, q)
    wanted = set(q.fact_ids) | {fid for fid, _ in hops}
    facts = [f for f in store.get_facts(user, sorted(wanted)) if f.id not in q.known]
    return GraphStep(facts=facts, hops=hops)


def model(record: Any) -> Any:
    """A held snapshot's view as the model the stores return; a model as it is."""
    if isinstance(record, FactView):
        return FACT_ROWS.record(record)
    return CHUNK_ROWS.record(record) if isinstance(record, ChunkView) else record


def same(got: GraphStep | HeldStep, want: GraphStep | HeldStep) -> None:
    assert got.hops == want.hops  # ids, hops and order
    assert sorted(map(model, got.facts), key=lambda f: f.id) == sorted(map(model, want.facts), key=lambda f: f.id)


def test_graph_step_answers_like_the_two_step_path(graph_store: GraphStore, user: str, other_user: str) -> None:
    world, theirs = build_world(graph_store, user), build_world(graph_store, other_user, seed=8)
    rng = random.Random(11)
    fact_ids = [f.id for f in world.facts]
    entity_ids = [e.id for e in world.entities]
    strangers = [theirs.facts[0].id, theirs.facts[1].id, "fact-missing"]
    checked = reached = 0
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None
    for window in WINDOWS:
        for max_hops in (0, 1, 2):
            for per_seed, limit in ((FAR, FAR), (2, FAR), (3, 5), (1, 4)):
                q = GraphStepQuery(
                    fact_ids=[*rng.sample(fact_ids, 6), world.archived, *world.superseded, strangers[0]],
                    seeds=[*rng.sample(entity_ids, 2), theirs.entities[1].id, "ent-missing"],
                    seed_facts=[*rng.sample(fact_ids, 3), *world.superseded, strangers[1]],
                    max_hops=max_hops,
                    limit=limit,
                    per_seed=per_seed,
                    avoid=[world.hub],
                    **window,
                )
                got = graph_store.graph_step(user, q)
                same(got, two_step(graph_store, user, q))
                same(snapshot.graph_step(q), got)  # the reader's in-process step answers alike
                assert not {f.id for f in got.facts} & set(strangers)  # another user's ids are never read
                checked, reached = checked + 1, reached + len(got.hops)
    assert checked == len(WINDOWS) * 3 * 4 and reached > 100  # the grid did reach facts


def test_graph_step_hydrates_alone_and_leaves_known_records_out(graph_store: GraphStore, user: str) -> None:
    world = build_world(graph_store, user)
    ids = [f.id for f in world.facts[:5]]
    alone = graph_store.graph_step(user, GraphStepQuery(fact_ids=ids))
    assert alone.hops == [] and {f.id for f in alone.facts} == set(ids)
    q = GraphStepQuery(fact_ids=ids, seeds=[world.entities[1].id], max_hops=2, limit=FAR, per_seed=FAR)
    full = graph_store.graph_step(user, q)
    known = [fid for fid, _ in full.hops[::2]] + ids[:2]
    part = graph_store.graph_step(user, q.model_copy(update={"known": known}))
    assert part.hops == full.hops  # what is known changes what is sent back, never what is reached
    assert {f.id for f in part.facts} == {f.id for f in full.facts} - set(known)
    same(part, two_step(graph_store, user, q.model_copy(update={"known": known})))


def test_graph_step_brings_the_chunks_the_caller_lacks_and_the_facts_of_their_messages(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    """The ``chunk_*`` fields answer as the plain query given the facts the chunks' messages produced."""
    ana, bo, paris = (make_entity(user, n) for n in ("Ana", "Bo", "Paris"))
    likes, lives = make_fact(user, ana, "LIKES", bo), make_fact(user, bo, "LIVES_IN", paris)
    (c1,) = said(graph_store, user, "m1", ["Ana likes Bo."], at(1), entities=[ana, bo, paris], facts=[likes])
    c2a, c2b = said(graph_store, user, "m2", ["Bo moved.", "He lives in Paris."], at(2), facts=[lives])
    (c3,) = said(graph_store, user, "m3", ["Nice weather today."], at(3))
    theirs = make_entity(other_user, "Cy")
    (x1,) = said(graph_store, other_user, "x1", ["Cy is here."], at(1), entities=[theirs],
                 facts=[make_fact(other_user, theirs, "IS_HERE")])  # fmt: skip
    base = GraphStepQuery(max_hops=1, limit=FAR, per_seed=FAR)
    asked = base.model_copy(
        update={
            "chunk_ids": [c1, c3, x1, "chunk-missing"],
            "chunk_facts": [c2a, x1],
            "seed_chunks": ["chunk-missing", x1, c3, c1, c2b],
            "seed_chunk_count": 2,  # the first two of the user's: c3 (no fact) and c1
        }
    )
    got = graph_store.graph_step(user, asked)
    assert sorted(c.id for c in got.chunks) == sorted([c1, c3])
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None
    for q in (
        asked,
        *(asked.model_copy(update=u) for u in ({"seed_chunk_count": 1}, {"limit": 0}, {"known": [lives.id]})),
    ):
        in_process, stored = snapshot.graph_step(q), graph_store.graph_step(user, q)
        same(in_process, stored)
        assert sorted(map(model, in_process.chunks), key=lambda c: c.id) == sorted(stored.chunks, key=lambda c: c.id)
    by_chunk_id = {c.id: c for c in graph_store.get_chunks(user, [c1, c3])}
    assert {c.id: c for c in got.chunks} == by_chunk_id  # the same records get_chunks reads
    same(
        got,
        graph_store.graph_step(
            user, base.model_copy(update={"fact_ids": [lives.id, likes.id], "seed_facts": [likes.id]})
        ),
    )
    assert got.hops  # the seed chunk's fact seeded the walk

    # One seed chunk: c3, whose message made no fact, so nothing to walk from.
    fewer = graph_store.graph_step(user, asked.model_copy(update={"seed_chunk_count": 1}))
    assert fewer.hops == [] and {f.id for f in fewer.facts} == {lives.id}
    # No expansion (limit 0): seed chunks play no part; the chunks and the facts of chunk_facts still come.
    flat = graph_store.graph_step(user, asked.model_copy(update={"limit": 0}))
    assert flat.hops == [] and {f.id for f in flat.facts} == {lives.id}
    assert sorted(c.id for c in flat.chunks) == sorted([c1, c3])
    # Known facts are not sent back, whichever field brought them.
    part = graph_store.graph_step(user, asked.model_copy(update={"known": [lives.id, likes.id]}))
    assert (
        part.hops == got.hops
        and likes.id not in {f.id for f in part.facts}
        and lives.id not in {f.id for f in part.facts}
    )


def test_a_snapshot_holds_the_users_whole_graph_at_its_stamp_and_nothing_of_another_user(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    world = build_world(graph_store, user)
    (chunk,) = said(graph_store, user, "m9", ["Nothing to extract here."], at(30))
    theirs = build_world(graph_store, other_user, seed=8)
    stamp = graph_store.user_stamp(user)
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None and snapshot.stamp == stamp
    stored = {f.id: f for f in graph_store.page(user, 1, FAR).facts}
    assert {i: model(f) for i, f in snapshot.facts.items()} == stored
    assert set(stored) == {f.id for f in world.facts}  # archived, superseded too
    assert {i: model(c) for i, c in snapshot.chunks.items()} == {c.id: c for c in graph_store.get_chunks(user, [chunk])}
    assert [model(c) for c in snapshot.episode_chunks(["m9", "m1", "missing"])] == graph_store.get_chunks(
        user, episode_ids=["m9", "m1"]
    )
    assert not set(snapshot.facts) & {f.id for f in theirs.facts}
    size = snapshot.size
    assert size == len(world.facts) + 1
    assert graph_store.snapshot(user, max_records=size) is not None
    assert graph_store.snapshot(user, max_records=size - 1) is None  # too big: the store keeps the step
    absent = graph_store.snapshot("nobody-here", max_records=FAR)
    assert absent is not None and absent.size == 0 and absent.stamp == graph_store.user_stamp("nobody-here")


# ---------------------------------------------------------------------------------- the fact cache


class Counting:
    """The real store, with the records each read sent back counted (the cache's whole point)."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self.sent: list[str] = []

    def graph_step(self, user_id: str, query: GraphStepQuery) -> GraphStep:
        step = self.store.graph_step(user_id, query)
        self.sent += [f.id for f in step.facts]
        return step

    def get_facts(self, user_id: str, fact_ids: list[str]) -> list[FactRecord]:
        facts = self.store.get_facts(user_id, fact_ids)
        self.sent += [f.id for f in facts]
        return facts


def test_a_warm_fact_cache_rereads_nothing_until_the_users_stamp_moves(graph_store: GraphStore, user: str) -> None:
    world = build_world(graph_store, user)
    counting, cache = Counting(graph_store), FactCache()
    ids = [f.id for f in world.facts[:8]]
    q = GraphStepQuery(fact_ids=ids, seeds=[world.entities[2].id], max_hops=1, limit=FAR, per_seed=FAR)

    def facts() -> UserFacts:
        return UserFacts(counting, cache, user, graph_store.user_stamp(user))  # type: ignore[arg-type]

    def step(q: GraphStepQuery) -> tuple[dict[str, FactRecord], list[tuple[str, int]]]:
        done = facts().step(q)
        return {f.id: f for f in done.facts}, done.hops

    cold_records, cold_hops = step(q)
    assert counting.sent and set(cold_records) == set(ids) | {fid for fid, _ in cold_hops}
    counting.sent.clear()
    warm_records, warm_hops = step(q)
    assert (warm_records, warm_hops) == (cold_records, cold_hops)
    assert counting.sent == []  # nothing re-read
    assert facts().load(ids) == {i: cold_records[i] for i in ids} and counting.sent == []

    # A write moves the stamp: the next read comes from the store and shows the change.
    old_stamp = graph_store.user_stamp(user)
    graph_store.reinforce(user, [ids[0]], amount=0.5, now=at(31))
    assert graph_store.user_stamp(user) > old_stamp
    after_write, _ = step(q)
    assert set(counting.sent) >= set(ids)
    # Reinforced at day 31: its strength faded to then plus 0.5, measured then (read-time decay).
    assert (cold_records[ids[0]].last_decay_at, after_write[ids[0]].last_decay_at) == (None, at(31))
    assert after_write[ids[0]].strength != cold_records[ids[0]].strength
    assert cache.held(user, old_stamp) == {}  # the old stamp's records are gone
    counting.sent.clear()

    # A forget moves it again: the forgotten fact is no longer served, though the cache held it.
    assert facts().load(ids) == {i: after_write[i] for i in ids} and counting.sent == []
    graph_store.forget_fact(user, ids[1])
    assert ids[1] not in facts().load(ids)
    assert ids[1] not in step(q)[0]
    assert counting.sent


def test_an_older_stamp_never_replaces_a_newer_ones_records(graph_store: GraphStore, user: str) -> None:
    world = build_world(graph_store, user)
    cache = FactCache()
    now = graph_store.user_stamp(user)
    before = now._replace(version=now.version - 1)
    fact = world.facts[0]
    cache.put(user, now, [fact])
    cache.put(user, before, [world.facts[1]])  # a slow reader that read the stamp before the last write
    assert cache.held(user, now) == {fact.id: fact}
    assert cache.held(user, before) == {}


def test_the_fact_cache_is_bounded(graph_store: GraphStore, user: str, other_user: str) -> None:
    world = build_world(graph_store, user)
    theirs = build_world(graph_store, other_user, seed=8)
    cache = FactCache(users=1, per_user=3)
    stamp = graph_store.user_stamp(user)
    cache.put(user, stamp, world.facts[:5])
    assert list(cache.held(user, stamp)) == [f.id for f in world.facts[2:5]]  # least recently used dropped
    cache.put(other_user, graph_store.user_stamp(other_user), theirs.facts[:1])
    assert cache.held(user, stamp) == {}  # one user at most
