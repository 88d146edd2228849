"""A reader's snapshot brought to the user's new stamp with only the records written since
(``GraphStore.refresh_snapshot``), against a whole load, after every kind of write, on every backend.

The oracle is ``GraphStore.snapshot``: after each write the refreshed snapshot must hold exactly the
records (and the walk's indexes) a whole load reads at the same stamp, also after a write that removed
records (their ids taken out in memory); in another lifetime, past the bound, or below the removal horizon
the refresh must refuse (None) so the reader loads it whole.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from engram_api.models import ChatMessage, EntityChange, Envelope, FactRecord
from engram_api.storage import GraphStore
from engram_api.storage.faiss.feed import changes_of, entry_of
from engram_api.storage.graph.episodes import chunk_envelope, keyword_terms
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.versions import Stamp
from tests.support.factories import at, make_entity, make_fact, plan, supersede, vec
from tests.support.graph_world import FAR, build_world, said


def _counted(graph_store: GraphStore, held: UserSnapshot, max_records: int) -> UserSnapshot | None:
    """The refresh a snapshot load off the recall's path makes: the records and the user's count."""
    return graph_store.refresh_snapshot(held, max_records=max_records)


def _with_vectors(graph_store: GraphStore, held: UserSnapshot, max_records: int) -> UserSnapshot | None:
    """The refresh a recall's catch-up makes (``engram_api.reader.catchup``): one read with the vectors'
    changes, whose horizon stands for the count."""
    return held.caught_up(graph_store.user_changes(held.user_id, held.stamp.version), max_records=max_records)


def _via_feed(graph_store: GraphStore, held: UserSnapshot, max_records: int) -> UserSnapshot | None:
    """The refresh a reader makes from the writers' change feed (``engram_api.storage.faiss.feed``): the
    entry a writer builds from the same read, through its JSON and back; None when the writer would add
    no entry (another lifetime): the reader then reads the graph, which refuses too."""
    changes = graph_store.user_changes(held.user_id, held.stamp.version)
    after = changes.vectors.stamp
    if after == held.stamp:
        return held.caught_up(changes, max_records=max_records)  # nothing written: no entry to read
    entry, _ = entry_of(held.stamp, after, changes)
    if not entry:
        return None
    fed = changes_of([entry], held.stamp.version, after)
    assert fed is not None
    return held.caught_up(fed, max_records=max_records)


Refresh = Callable[[GraphStore, UserSnapshot, int], UserSnapshot | None]
RANKS = (0.2, 0.5, 0.9)  # tied importances: the id breaks the ties


@pytest.fixture(params=[_counted, _with_vectors, _via_feed], ids=["counted", "with-vectors", "via-feed"])
def refresh(request: pytest.FixtureRequest) -> Refresh:
    return request.param


def _same(refreshed: UserSnapshot | None, whole: UserSnapshot | None) -> UserSnapshot:
    assert refreshed is not None and whole is not None
    assert refreshed.stamp == whole.stamp
    assert dict(refreshed.facts) == dict(whole.facts)
    assert dict(refreshed.chunks) == dict(whole.chunks)
    # Read through the overlay (``engram_api.storage.snapshot.overlay``) and folded into a new base: the same.
    assert {e: tuple(refreshed.entity_facts(e)) for e in whole.touching} == whole.touching
    assert {e: refreshed.episode_chunk_ids(e) for e in whole.episodes} == whole.episodes
    merged = refreshed.merged()
    assert merged.recent_size == 0 and dict(merged.facts) == dict(whole.facts)
    assert merged.touching == whole.touching and merged.episodes == whole.episodes
    for query in ("Ana lives in Rome", "Paris, the City of Light", "late words said again", "E1 E2 REL3 REL17"):
        terms = keyword_terms(query)
        assert refreshed.keyword_search(terms, 5) == whole.keyword_search(terms, 5)  # its keyword index too
    return refreshed


def test_a_refreshed_snapshot_is_what_a_whole_load_reads_after_every_kind_of_write(
    graph_store: GraphStore, user: str, other_user: str, refresh: Refresh
) -> None:
    world = build_world(graph_store, user)  # new facts, two supersessions, a decay that archives
    held = graph_store.snapshot(user, max_records=FAR)
    assert held is not None
    assert refresh(graph_store, held, FAR) is held  # nothing written: the same one

    def step(note: str) -> None:
        nonlocal held
        assert held is not None
        before = held.stamp
        held = _same(refresh(graph_store, held, FAR), graph_store.snapshot(user, max_records=FAR))
        assert held.stamp > before, note

    ana, paris = world.entities[1], world.entities[2]
    rome = make_entity(user, "Rome")
    moved = make_fact(user, ana, "LIVES_IN", rome, valid_from=at(31), single_valued=True)
    old_city = next(f for f in world.facts if f.predicate == "LIVES_IN" and f.valid_until is None)
    said(
        graph_store, user, "m20", ["Ana moved to Rome."], at(31),
        entities=[rome], facts=[moved], fact_changes=[supersede(old_city, moved)],
        entity_changes=[EntityChange(id=paris.id, add_aliases=["City of Light"], summary="a city")],
    )  # fmt: skip
    step("an apply: a new entity, fact and chunk, a superseded fact, a changed entity")
    again = world.facts[3]
    said(graph_store, user, "m21", ["Ana said it again."], at(32), reinforced=[again.id], linked=[world.facts[4].id])
    step("an apply that reinforces one fact and links another")
    assert "m21" in held.facts[again.id].source_ids
    assert "m21" in held.facts[world.facts[4].id].source_ids  # a link adds a source to an unchanged fact

    graph_store.apply(plan(user, "m22", at(33)))
    envelope = Envelope(user_id=user, message_id="m22", messages=[ChatMessage(content="Late words.")], timestamp=at(33))
    chunks = [c.model_copy(update={"embedding": vec(c.id)}) for c in chunk_envelope(envelope)]
    assert graph_store.add_chunks(user, chunks) == 1
    step("chunks added to a stored message")
    assert graph_store.decay(user, now=at(400), batch=FAR)[0] > 0
    step("a decay")
    archived = [fid for fid, f in held.facts.items() if f.archived]
    assert archived and graph_store.reinforce(user, archived[:2], amount=0.5, now=at(401)) > 0
    step("a reinforcement")

    build_world(graph_store, other_user, seed=8)  # another user's writes move nothing of this one's
    assert refresh(graph_store, held, FAR) is held

    said(graph_store, user, "m22b", ["One more turn."], at(34))
    assert refresh(graph_store, held, held.size) is None  # past the bound: the store's
    step("a write within the bound")

    # Writes that removed records: every read lists the removed ids (the count's read and the catch-up's
    # from the removal records, the feed's entry from that read), so the snapshot takes them out in memory.
    graph_store.remove_chunks(user, [chunks[0].id])
    step("chunks removed (decay's expired excerpts)")
    graph_store.forget_fact(user, moved.id)
    step("a forget of one fact: the fact it superseded is current again")
    assert held is not None and held.facts[old_city.id].valid_until is None
    graph_store.forget_message(user, "m21")
    step("a forget of a message: the facts it reinforced or linked keep their other sources")
    assert held is not None and "m21" not in held.facts[again.id].source_ids
    said(graph_store, user, "m23", ["After the forget."], at(402))
    step("a write after a removal refreshes again")

    graph_store.forget_user(user)
    said(graph_store, user, "m24", ["A new life."], at(403))
    assert refresh(graph_store, held, FAR) is None  # another lifetime


def test_a_snapshot_behind_the_removal_horizon_is_not_refreshed(
    graph_store: GraphStore, user: str, refresh: Refresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removal records older than ``REMOVAL_RETAIN`` versions are pruned (the horizon moves up): a snapshot
    below the horizon cannot know every id removed since, so no refresh takes place (the reader loads it
    whole); one at or above it is refreshed across removals as a whole load reads it."""
    monkeypatch.setattr("engram_api.storage.graph.neo4j.connection.REMOVAL_RETAIN", 2)
    monkeypatch.setattr("engram_api.storage.graph.sqlite.rows.REMOVAL_RETAIN", 2)
    world = build_world(graph_store, user)
    held = graph_store.snapshot(user, max_records=FAR)
    assert held is not None
    for fact in world.facts[:3]:  # three removals: the horizon passes the held snapshot's version
        graph_store.forget_fact(user, fact.id)
    assert refresh(graph_store, held, FAR) is None
    held = graph_store.snapshot(user, max_records=FAR)
    assert held is not None
    graph_store.forget_fact(user, world.facts[3].id)
    _same(refresh(graph_store, held, FAR), graph_store.snapshot(user, max_records=FAR))


def test_a_merge_ranks_each_entitys_facts_as_a_whole_build_does() -> None:
    """``UserSnapshot.updated`` re-ranks by binary insertion in its overlay: random graphs with tied
    importances, new facts and facts whose importance changed (twice over, so a fact placed in the overlay
    moves again), against ``UserSnapshot.of`` over the merged records, read through the overlay and folded."""
    rng = random.Random(5)
    user = "u-merge"
    people = [make_entity(user, f"P{i}") for i in range(6)]

    def new_facts(predicate: str, n: int) -> list[FactRecord]:
        return [
            make_fact(user, rng.choice(people), predicate, rng.choice([None, *people]), importance=rng.choice(RANKS))
            for _ in range(n)
        ]

    for _ in range(40):
        facts = new_facts("R", rng.randint(1, 30))
        held = UserSnapshot.of(user, Stamp(1, 1), facts, [])
        every = {f.id: f for f in facts}
        for version in (2, 3):
            changed = [
                f.model_copy(update={"importance": rng.choice(RANKS)})
                for f in rng.sample(list(every.values()), rng.randint(0, len(every)))
            ]
            written = [*changed, *new_facts("S", rng.randint(0, 5))]
            every.update((f.id, f) for f in written)
            held = held.updated(Stamp(1, version), written, [])
            whole = UserSnapshot.of(user, Stamp(1, version), every.values(), [])
            assert {e: tuple(held.entity_facts(e)) for e in whole.touching} == whole.touching
            assert held.merged().touching == whole.touching
