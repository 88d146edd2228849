"""The graph-store contract (engram_api/storage/graph/contract.py): one suite, every backend.

Decisions on points the contract leaves open are written as ``DECISION:`` comments next to the test
that pins them. Where the contract says nothing about order (ids in a result, cluster members, the
entities of a page), results are compared as sets.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import TypeVar

import pytest

from engram_api.errors import StoreUnavailableError
from engram_api.models import (
    HISTORY_LIMIT,
    ApplyOutcome,
    ChunkRecord,
    EntityChange,
    EntityRecord,
    EpisodeRecord,
    FactChange,
    FactRecord,
    ForgetResult,
    Usage,
    UserStats,
    WritePlan,
)
from engram_api.naming import normalize_name
from engram_api.storage import GraphStepQuery, GraphStore
from engram_api.storage.graph.fading import Fading
from tests.support.factories import (
    DIM,
    T0,
    apply_in_process,
    at,
    make_cluster,
    make_entity,
    make_fact,
    make_feedback,
    make_weights,
    new_id,
    plan,
    supersede,
)

FAR = 10_000  # a limit no test reaches
R = TypeVar("R", FactRecord, EntityRecord)


def ids(records: Iterable[FactRecord | EntityRecord]) -> set[str]:
    return {r.id for r in records}


def by_id(records: Iterable[R]) -> dict[str, R]:
    return {r.id: r for r in records}


class HopFact(FactRecord):
    hops: int


def expand(
    store: GraphStore,
    user_id: str,
    seeds: Sequence[str],
    *,
    max_hops: int,
    as_of: datetime | None,
    limit: int,
    per_seed: int,
    avoid: Sequence[str] = (),
) -> list[HopFact]:
    """The expansion half of ``graph_step`` (nothing to hydrate), reached facts with their hops."""
    query = GraphStepQuery(
        seeds=list(seeds), as_of=as_of, max_hops=max_hops, limit=limit, per_seed=per_seed, avoid=list(avoid)
    )
    step = store.graph_step(user_id, query)
    records = by_id(step.facts)
    return [HopFact(**records[fid].model_dump(), hops=n) for fid, n in step.hops]


def hops(result: Sequence[HopFact]) -> list[tuple[str, int]]:
    return [(f.id, f.hops) for f in result]


def one_fact(store: GraphStore, user: str, fact_id: str) -> FactRecord:
    found = store.get_facts(user, [fact_id])
    assert len(found) == 1, f"expected fact {fact_id} for {user}, got {found}"
    return found[0]


def assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.utcoffset() == timedelta(0), f"{value!r} is not timezone-aware UTC"


def assert_fact(got: FactRecord, want: FactRecord, *, source_ids: list[str], **changed: object) -> None:
    """Every stored field of ``want`` (with ``changed`` applied) round-trips; no embedding on reads."""
    expected = want.model_copy(update=changed)
    for field in (
        "id", "user_id", "subject_id", "subject_name", "predicate", "object_id", "object_name",
        "statement", "memory_type", "single_valued", "valid_from", "valid_until", "superseded_by",
        "archived", "last_decay_at", "created_at",
    ):  # fmt: skip
        assert getattr(got, field) == getattr(expected, field), field
    assert got.importance == pytest.approx(expected.importance, abs=1e-12)
    assert got.strength == pytest.approx(expected.strength, abs=1e-9)
    assert got.source_ids == source_ids
    assert got.embedding is None


# --------------------------------------------------------------------------------------- lifecycle


def test_ping_answers(graph_store: GraphStore) -> None:
    assert graph_store.ping() is None


def test_ping_raises_store_unavailable_when_backend_cannot_answer(unreachable_store: GraphStore) -> None:
    with pytest.raises(StoreUnavailableError):
        unreachable_store.ping()


def test_ensure_schema_is_idempotent_and_keeps_data(graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m1", entities=[me], facts=[make_fact(user, me, "IS_HAPPY")]))
    before = graph_store.stats(user)
    graph_store.ensure_schema()
    graph_store.ensure_schema()
    assert graph_store.stats(user) == before
    assert before.facts == 1 and before.entities == 1 and before.episodes == 1


def test_unknown_user_reads_as_empty(graph_store: GraphStore, user: str) -> None:
    assert graph_store.user_version(user) == 0
    assert graph_store.stats(user) == UserStats(user_id=user)
    assert not graph_store.is_applied(user, "m1")
    assert graph_store.vectors(user) == ([], 0)
    assert graph_store.history(user, "Ana", None) == []
    assert graph_store.clusters(user) == []
    assert graph_store.feedback(user, 10) == []
    page = graph_store.page(user, 1, 10)
    assert (page.total_facts, page.facts, page.entities) == (0, [], [])
    assert user not in graph_store.list_users()


# ------------------------------------------------------------------------------------------- apply


def test_apply_stores_episode_entities_and_facts(graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana", "Person", aliases=["Annie"], summary="the user")
    paris = make_entity(user, "Paris", "Place")
    lives = make_fact(
        user, me, "LIVES_IN", paris, importance=0.75, strength=0.875, valid_from=at(1), single_valued=True
    )
    tired = make_fact(user, me, "FEELS", statement="Ana feels tired", memory_type="episodic", valid_from=at(2))
    usage = Usage(prompt_tokens=100, completion_tokens=20, cost_usd=0.25, llm_calls=1)
    assert not graph_store.is_applied(user, "m1")

    outcome = graph_store.apply(plan(user, "m1", at(2), entities=[me, paris], facts=[lives, tired], usage=usage))

    assert outcome == ApplyOutcome(applied=True, version=1)
    assert graph_store.is_applied(user, "m1")
    assert graph_store.user_version(user) == 1
    entities = by_id(graph_store.get_entities(user, [me.id, paris.id]))
    assert set(entities) == {me.id, paris.id}
    got_me = entities[me.id]
    assert (got_me.user_id, got_me.name, got_me.norm_name, got_me.label) == (user, "Ana", "ana", "Person")
    assert (got_me.aliases, got_me.summary) == (["Annie"], "the user")
    assert got_me.embedding == pytest.approx(me.embedding)
    assert got_me.created_at == T0
    facts = by_id(graph_store.get_facts(user, [lives.id, tired.id]))
    assert set(facts) == {lives.id, tired.id}
    assert_fact(facts[lives.id], lives, source_ids=["m1"])
    assert_fact(facts[tired.id], tired, source_ids=["m1"], object_id=None, object_name=None)
    stats = graph_store.stats(user)
    assert (stats.entities, stats.facts, stats.current_facts, stats.episodes) == (2, 2, 2, 1)
    assert stats.usage == usage
    assert stats.version == 1


def test_datetimes_come_back_as_utc_instants(graph_store: GraphStore, user: str) -> None:
    plus_two = timezone(timedelta(hours=2))
    me = make_entity(user, "Ana")
    fact = make_fact(user, me, "STARTED_JOB", valid_from=datetime(2024, 3, 1, 12, 0, tzinfo=plus_two))
    graph_store.apply(plan(user, "m1", datetime(2024, 3, 1, 13, 0, tzinfo=plus_two), entities=[me], facts=[fact]))

    got = one_fact(graph_store, user, fact.id)
    assert got.valid_from == datetime(2024, 3, 1, 10, 0, tzinfo=UTC)
    assert_utc(got.valid_from)
    assert_utc(got.created_at)
    # The instant is what counts: expand at 10:00 UTC sees the fact, one second earlier does not.
    assert ids(expand(graph_store, user, [me.id], max_hops=0, as_of=got.valid_from, limit=FAR, per_seed=FAR)) == {
        fact.id
    }
    before = got.valid_from - timedelta(seconds=1)
    assert expand(graph_store, user, [me.id], max_hops=0, as_of=before, limit=FAR, per_seed=FAR) == []


def test_every_written_time_comes_back_to_the_microsecond_before_1970_too(graph_store: GraphStore, user: str) -> None:
    """Each time an apply writes (episode, chunk, entity, fact, a supersession's valid_until), on either side
    of the epoch, with microseconds: Neo4j's write path sends them as [seconds, nanoseconds]."""
    early, late = datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), datetime(2024, 3, 1, 10, 0, 0, 7, tzinfo=UTC)
    me = make_entity(user, "Ana", created_at=early)
    old = make_fact(
        user, me, "LIVES_IN Oslo", valid_from=datetime(1901, 6, 1, 0, 0, 0, 1, tzinfo=UTC), created_at=early
    )
    old = old.model_copy(update={"last_decay_at": late, "updated_at": late})
    chunk = ChunkRecord(
        id=new_id("chunk"), user_id=user, episode_id="m1", seq=0, text="I live in Oslo", speaker="Ana",
        event_time=early, created_at=early, updated_at=early,
    )  # fmt: skip
    first = plan(user, "m1", early, entities=[me], facts=[old]).model_copy(update={"chunks": [chunk]})
    graph_store.apply(first)
    new = make_fact(user, me, "LIVES_IN Rome", valid_from=late)
    graph_store.apply(
        plan(
            user, "m2", late, facts=[new], fact_changes=[FactChange(id=old.id, valid_until=late, superseded_by=new.id)]
        )
    )

    got = one_fact(graph_store, user, old.id)
    assert (got.valid_from, got.valid_until, got.last_decay_at) == (old.valid_from, late, late)
    assert (got.created_at, got.updated_at >= late) == (early, True)  # the change stamps updated_at
    assert graph_store.get_entities(user, [me.id])[0].created_at == early
    episodes = {e.id: e for e in graph_store.episodes(user)}
    assert (episodes["m1"].event_time, episodes["m1"].created_at, episodes["m2"].event_time) == (early, early, late)
    (stored,) = graph_store.get_chunks(user, [chunk.id])
    assert (stored.event_time, stored.created_at) == (early, early)
    for value in (got.valid_from, got.valid_until, stored.event_time, episodes["m1"].event_time):
        assert_utc(value)


def test_apply_is_idempotent_by_episode(graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana")
    jazz = make_entity(user, "Jazz")
    likes = make_fact(user, me, "LIKES", jazz)
    usage = Usage(prompt_tokens=10, completion_tokens=5, cost_usd=0.5, llm_calls=1)
    first = plan(user, "m1", entities=[me, jazz], facts=[likes], usage=usage)

    assert graph_store.apply(first) == ApplyOutcome(applied=True, version=1)
    assert graph_store.apply(first) == ApplyOutcome(applied=False, version=1)
    # A different plan for an already stored episode is skipped as a whole too.
    other = make_fact(user, me, "HATES", jazz)
    assert graph_store.apply(plan(user, "m1", facts=[other], usage=usage)) == ApplyOutcome(applied=False, version=1)

    stats = graph_store.stats(user)
    assert (stats.episodes, stats.entities, stats.facts, stats.version) == (1, 2, 1, 1)
    assert stats.usage == usage
    assert one_fact(graph_store, user, likes.id).source_ids == ["m1"]
    assert graph_store.get_facts(user, [other.id]) == []


def test_message_ids_are_scoped_per_user(graph_store: GraphStore, user: str, other_user: str) -> None:
    # DECISION: episodes are unique per (user_id, message id), as apply's idempotency key says; two
    # users may use the same message id and both messages are stored.
    for owner in (user, other_user):
        me = make_entity(owner, "Ana")
        outcome = graph_store.apply(plan(owner, "m1", entities=[me], facts=[make_fact(owner, me, "IS_HAPPY")]))
        assert outcome == ApplyOutcome(applied=True, version=1)
    assert graph_store.is_applied(user, "m1") and graph_store.is_applied(other_user, "m1")
    assert graph_store.stats(user).episodes == 1 and graph_store.stats(other_user).episodes == 1


def test_version_bumps_once_per_applied_plan(graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana")
    versions = [graph_store.apply(plan(user, "m1", entities=[me])).version]
    for i in (2, 3):
        versions.append(graph_store.apply(plan(user, f"m{i}", mentioned=[me.id])).version)
    assert versions == [1, 2, 3]
    assert graph_store.user_version(user) == 3
    assert graph_store.stats(user).version == 3


def test_usage_accumulates_over_plans(graph_store: GraphStore, user: str) -> None:
    graph_store.apply(plan(user, "m1", usage=Usage(prompt_tokens=100, completion_tokens=10, cost_usd=0.25)))
    graph_store.apply(plan(user, "m2", usage=Usage(prompt_tokens=50, completion_tokens=5, llm_calls=2)))
    usage = graph_store.stats(user).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.llm_calls) == (150, 15, 2)
    assert usage.cost_usd == pytest.approx(0.25)


@pytest.mark.parametrize("role", ["subject", "object"])
def test_apply_rejects_a_fact_on_an_unknown_entity_and_writes_nothing(
    graph_store: GraphStore, user: str, role: str
) -> None:
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m1", entities=[me]))
    before = graph_store.stats(user)
    ghost = make_entity(user, "Ghost")  # never stored, not in the plan
    fresh = make_entity(user, "Fresh")
    bad = make_fact(user, ghost, "KNOWS", me) if role == "subject" else make_fact(user, me, "KNOWS", ghost)
    good = make_fact(user, me, "LIKES", fresh)

    with pytest.raises(ValueError):
        graph_store.apply(plan(user, "m2", entities=[fresh], facts=[good, bad], reinforced=[], mentioned=[me.id]))

    assert not graph_store.is_applied(user, "m2")
    assert graph_store.stats(user) == before
    assert graph_store.get_entities(user, [fresh.id, ghost.id]) == []
    assert graph_store.get_facts(user, [good.id, bad.id]) == []
    assert graph_store.user_version(user) == 1


def test_apply_rejects_a_fact_on_another_users_entity(graph_store: GraphStore, user: str, other_user: str) -> None:
    theirs = make_entity(other_user, "Bob")
    graph_store.apply(plan(other_user, "m1", entities=[theirs]))
    me = make_entity(user, "Ana")
    with pytest.raises(ValueError):
        graph_store.apply(plan(user, "m1", entities=[me], facts=[make_fact(user, me, "KNOWS", theirs)]))
    assert graph_store.stats(user) == UserStats(user_id=user)
    assert graph_store.stats(other_user).facts == 0


def test_apply_skips_changes_to_ids_the_user_does_not_have(graph_store: GraphStore, user: str) -> None:
    # DECISION: only a new fact's subject/object must exist (ValueError otherwise). Entity changes,
    # fact changes, reinforcements and mentions naming an id the user does not (or no longer) has are
    # skipped: a forget may delete those between consolidation and apply, and that must not turn the
    # message into a dead letter.
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m1", entities=[me]))
    outcome = graph_store.apply(
        plan(
            user,
            "m2",
            entity_changes=[EntityChange(id=new_id("ent"), add_aliases=["x"], summary="s")],
            fact_changes=[FactChange(id=new_id("fact"), valid_until=at(1), superseded_by=None)],
            reinforced=[new_id("fact")],
            mentioned=[new_id("ent"), me.id],
        )
    )
    assert outcome == ApplyOutcome(applied=True, version=2)
    stats = graph_store.stats(user)
    assert (stats.entities, stats.facts, stats.episodes) == (1, 0, 2)


# ------------------------------------------------------------------------------------ entity lookup


def test_lookup_entities_by_norm_name_and_normalized_alias(graph_store: GraphStore, user: str, other_user: str) -> None:
    ana = make_entity(user, "Ana", "Person", aliases=["Annie B.", "Nana"])
    sao = make_entity(user, "São Paulo", "Place")
    bob = make_entity(user, "Bob", "Person", embedding=False)
    graph_store.apply(plan(user, "m1", entities=[ana, sao, bob]))
    twin = make_entity(other_user, "Ana", "Person", aliases=["Nana"])
    graph_store.apply(plan(other_user, "m1", entities=[twin]))

    def find(*names: str) -> set[str]:
        return ids(named(graph_store, user, [normalize_name(n) for n in names]))

    assert find("ANA") == {ana.id}
    assert find("annie-b") == {ana.id}  # alias "Annie B." normalizes to "annie b"
    assert find("Sao Paulo!") == {sao.id}
    found = named(graph_store, user, ["ana", "nana", "bob"])
    assert sorted(e.id for e in found) == sorted([ana.id, bob.id])  # each entity once
    assert find("zed") == set()
    assert named(graph_store, user, []) == []
    got = by_id(named(graph_store, user, ["ana", "sao paulo", "bob"]))
    assert got[sao.id].name == "São Paulo" and got[sao.id].norm_name == "sao paulo"
    assert ids(named(graph_store, other_user, ["ana", "nana"])) == {twin.id}


def named(store: GraphStore, user: str, norm_names: list[str]) -> list[EntityRecord]:
    """The user's entities named or aliased ``norm_names`` (``lookup_entities`` by name only)."""
    return store.lookup_entities(user, entity_ids=[], norm_names=norm_names)


def test_get_entities_is_scoped_to_the_user(graph_store: GraphStore, user: str, other_user: str) -> None:
    mine = make_entity(user, "Ana")
    theirs = make_entity(other_user, "Ana")
    graph_store.apply(plan(user, "m1", entities=[mine]))
    graph_store.apply(plan(other_user, "m1", entities=[theirs]))
    assert ids(graph_store.get_entities(user, [mine.id, theirs.id, "ent-missing"])) == {mine.id}
    assert graph_store.get_entities(user, []) == []


def test_lookup_entities_finds_by_id_or_name_in_one_call(graph_store: GraphStore, user: str, other_user: str) -> None:
    ana = make_entity(user, "Ana", "Person", aliases=["Nana"], created_at=at(1) + timedelta(microseconds=123457))
    sao = make_entity(user, "São Paulo", "Place")
    bob = make_entity(user, "Bob", "Person", embedding=False)
    graph_store.apply(plan(user, "m1", entities=[ana, sao, bob]))
    twin = make_entity(other_user, "Ana", "Person", aliases=["Nana"])
    graph_store.apply(plan(other_user, "m1", entities=[twin]))

    found = graph_store.lookup_entities(user, entity_ids=[bob.id, ana.id, twin.id], norm_names=["nana", "sao paulo"])
    assert sorted(e.id for e in found) == sorted([ana.id, sao.id, bob.id])  # each once; never another user's
    got = by_id(found)
    # Without embeddings (consolidation never reads one back), everything else as get_entities has it.
    assert all(e.embedding is None for e in found) and got[ana.id].aliases == ["Nana"]
    whole = by_id(graph_store.get_entities(user, [ana.id, sao.id, bob.id]))
    assert whole[ana.id].embedding == pytest.approx(ana.embedding)
    assert {i: e.model_copy(update={"embedding": None}) for i, e in whole.items()} == got
    assert got[ana.id].created_at == ana.created_at  # to the microsecond
    assert ids(graph_store.lookup_entities(user, entity_ids=[sao.id], norm_names=[])) == {sao.id}
    assert ids(graph_store.lookup_entities(user, entity_ids=[], norm_names=["bob", "zed"])) == {bob.id}
    assert graph_store.lookup_entities(user, entity_ids=[], norm_names=[]) == []
    assert ids(graph_store.lookup_entities(other_user, entity_ids=[ana.id], norm_names=["nana"])) == {twin.id}


def test_entity_changes_add_aliases_once_and_replace_given_fields(graph_store: GraphStore, user: str) -> None:
    ana = make_entity(user, "Ana", "Person", aliases=["Annie"], summary="first")
    graph_store.apply(plan(user, "m1", entities=[ana]))

    graph_store.apply(
        plan(user, "m2", entity_changes=[EntityChange(id=ana.id, add_aliases=["Annie", "Nana A."], summary="second")])
    )
    got = graph_store.get_entities(user, [ana.id])[0]
    # DECISION: aliases keep their order (old ones first, new ones appended); an exact repeat is dropped.
    assert got.aliases == ["Annie", "Nana A."]
    assert (got.summary, got.label) == ("second", "Person")  # label None = unchanged
    assert ids(named(graph_store, user, [normalize_name("nana a")])) == {ana.id}

    graph_store.apply(plan(user, "m3", entity_changes=[EntityChange(id=ana.id, label="Organization")]))
    got = graph_store.get_entities(user, [ana.id])[0]
    assert (got.summary, got.label, got.aliases) == ("second", "Organization", ["Annie", "Nana A."])
    assert got.embedding == pytest.approx(ana.embedding)


# ------------------------------------------------------------------------------------------- facts


def test_slot_facts_are_current_superseded_and_archived(graph_store: GraphStore, user: str, other_user: str) -> None:
    graph_store.fading = Fading(0.5, 0.01)
    ana, bob, paris, berlin, jazz = (make_entity(user, n) for n in ("Ana", "Bob", "Paris", "Berlin", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(30), single_valued=True)
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(31), single_valued=True)
    likes_jazz = make_fact(user, ana, "LIKES", jazz, valid_from=at(0))  # old: decay archives it
    bob_likes = make_fact(user, bob, "LIKES", jazz, valid_from=at(30))
    graph_store.apply(plan(user, "m1", entities=[ana, bob, paris, jazz], facts=[in_paris, likes_jazz, bob_likes]))
    graph_store.apply(
        plan(user, "m2", entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)])
    )
    assert graph_store.decay(user, now=at(30), batch=100) == (1, 1)

    found = by_id(slot_facts(graph_store, user, [(ana.id, "LIVES_IN"), (ana.id, "LIKES"), (bob.id, "WORKS_AT")]))

    assert set(found) == {in_paris.id, in_berlin.id, likes_jazz.id}
    assert found[in_paris.id].valid_until == at(31) and found[in_paris.id].superseded_by == in_berlin.id
    assert found[in_berlin.id].valid_until is None
    assert found[likes_jazz.id].archived is True
    assert slot_facts(graph_store, user, []) == []
    assert slot_facts(graph_store, other_user, [(ana.id, "LIVES_IN")]) == []


def slot_facts(store: GraphStore, user: str, slots: list[tuple[str, str]]) -> list[FactRecord]:
    """Every fact of the (subject, predicate) ``slots`` (``facts_and_slots`` with no fact ids)."""
    return store.facts_and_slots(user, fact_ids=[], slots=slots)[1]


def test_the_extraction_context_is_the_four_reads_it_replaces(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    """``extraction_context``: entities (without embeddings) and facts by id, the facts of the slots
    (superseded ones too) and the last ``turns`` episodes before the instant, exactly as
    ``lookup_entities``, ``get_facts`` and ``facts_and_slots`` answer them; scoped to the user, empty
    without inputs."""
    ana, paris, berlin, jazz = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(1), single_valued=True)
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(2), single_valued=True)
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(1))
    graph_store.apply(plan(user, "m1", at(1), entities=[ana, paris, jazz], facts=[in_paris, likes]))
    graph_store.apply(
        plan(user, "m2", at(2), entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)])
    )
    graph_store.apply(plan(user, "m3", at(3)))
    graph_store.apply(plan(other_user, "m1", at(1)))
    entity_ids, fact_ids = [ana.id, berlin.id, "missing", ana.id], [likes.id, in_berlin.id, "missing"]
    slots = [(ana.id, "LIVES_IN"), (ana.id, "WORKS_AT")]

    read = graph_store.extraction_context(
        user, entity_ids=entity_ids, fact_ids=fact_ids, slots=slots, before=at(3), turns=1
    )
    assert read.entities == graph_store.lookup_entities(user, entity_ids=entity_ids, norm_names=[])
    assert len(read.entities) == 2 and all(e.embedding is None for e in read.entities)
    assert read.facts == graph_store.get_facts(user, fact_ids) and len(read.facts) == 2
    assert read.slot_facts == slot_facts(graph_store, user, slots)
    assert ids(read.slot_facts) == {in_paris.id, in_berlin.id}
    assert [e.id for e in read.episodes] == ["m2"]
    every = graph_store.extraction_context(user, entity_ids=[], fact_ids=[], slots=[], before=at(9), turns=9)
    assert [e.id for e in every.episodes] == ["m1", "m2", "m3"] and every.facts == every.entities == []
    theirs = graph_store.extraction_context(
        other_user, entity_ids=entity_ids, fact_ids=fact_ids, slots=slots, before=at(9), turns=5
    )
    assert (theirs.entities, theirs.facts, theirs.slot_facts, [e.id for e in theirs.episodes]) == ([], [], [], ["m1"])
    nothing = graph_store.extraction_context(user, entity_ids=[], fact_ids=[], slots=[], before=at(9), turns=0)
    assert nothing == type(nothing)()


def test_facts_and_slots_is_the_two_reads_it_replaces(graph_store: GraphStore, user: str, other_user: str) -> None:
    """Consolidation's read: ``get_facts`` and the slots' facts (superseded ones too) in one call."""
    ana, paris, berlin, jazz = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(1), single_valued=True)
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(2), single_valued=True)
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(1))
    graph_store.apply(plan(user, "m1", at(1), entities=[ana, paris, jazz], facts=[in_paris, likes]))
    graph_store.apply(
        plan(user, "m2", at(2), entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)])
    )
    fact_ids, slots = [likes.id, in_berlin.id, "missing", likes.id], [(ana.id, "LIVES_IN"), (ana.id, "WORKS_AT")]

    named, slotted = graph_store.facts_and_slots(user, fact_ids=fact_ids, slots=slots)
    assert named == graph_store.get_facts(user, fact_ids) and ids(named) == {likes.id, in_berlin.id}
    assert ids(slotted) == {in_paris.id, in_berlin.id} and [f.valid_from for f in slotted] == [at(1), at(2)]
    assert graph_store.facts_and_slots(user, fact_ids=fact_ids, slots=[]) == (named, [])
    assert graph_store.facts_and_slots(user, fact_ids=[], slots=slots) == ([], slotted)
    assert graph_store.facts_and_slots(other_user, fact_ids=fact_ids, slots=slots) == ([], [])
    assert graph_store.facts_and_slots(user, fact_ids=[], slots=[]) == ([], [])


def test_fact_changes_supersede(graph_store: GraphStore, user: str) -> None:
    ana, paris, berlin = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin"))
    old = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), single_valued=True)
    new = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10), single_valued=True)
    graph_store.apply(plan(user, "m1", entities=[ana, paris], facts=[old]))
    outcome = graph_store.apply(
        plan(user, "m2", at(10), entities=[berlin], facts=[new], fact_changes=[supersede(old, new)])
    )
    assert outcome.version == 2

    facts = by_id(graph_store.get_facts(user, [old.id, new.id]))
    assert_fact(facts[old.id], old, source_ids=["m1"], valid_until=at(10), superseded_by=new.id)
    assert_fact(facts[new.id], new, source_ids=["m2"])
    stats = graph_store.stats(user)
    assert (stats.facts, stats.current_facts, stats.superseded_facts, stats.archived_facts) == (2, 1, 1, 0)


def test_reinforced_facts_regain_strength_and_provenance(graph_store: GraphStore, user: str) -> None:
    graph_store.fading = Fading(0.5, 0.01)
    ana, jazz = make_entity(user, "Ana"), make_entity(user, "Jazz")
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(0))
    # Message ids chosen so that source order (sorted) differs from apply order.
    graph_store.apply(plan(user, "m-b", entities=[ana, jazz], facts=[likes]))
    assert graph_store.decay(user, now=at(10), batch=10) == (1, 1)
    assert graph_store.stats(user).archived_facts == 1

    graph_store.apply(plan(user, "m-a", at(11), reinforced=[likes.id]))

    got = one_fact(graph_store, user, likes.id)
    assert got.strength == pytest.approx(1.0, abs=1e-12)
    assert got.archived is False
    assert got.source_ids == ["m-a", "m-b"]
    assert graph_store.stats(user).archived_facts == 0


def test_linked_facts_gain_provenance_but_keep_their_strength(graph_store: GraphStore, user: str) -> None:
    ana, jazz = make_entity(user, "Ana"), make_entity(user, "Jazz")
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(0), strength=0.4).model_copy(update={"archived": True})
    graph_store.apply(plan(user, "m-1", entities=[ana, jazz], facts=[likes]))
    graph_store.apply(plan(user, "m-2", at(1), linked=[likes.id, "fact-unknown"], mentioned=[ana.id]))

    got = one_fact(graph_store, user, likes.id)
    assert (got.strength, got.archived, got.source_ids) == (pytest.approx(0.4), True, ["m-1", "m-2"])


def test_episodes_list_every_episode_with_its_provenance(graph_store: GraphStore, user: str, other_user: str) -> None:
    ana, jazz = make_entity(user, "Ana"), make_entity(user, "Jazz")
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(0))
    graph_store.apply(plan(user, "m-late", at(2), entities=[ana, jazz], facts=[likes], content="late"))
    graph_store.apply(plan(user, "m-early", at(1), linked=[likes.id], mentioned=[jazz.id], content="early"))
    graph_store.apply(plan(other_user, "m-other", at(0)))

    episodes = graph_store.episodes(user)
    assert [(e.id, e.content, e.event_time) for e in episodes] == [
        ("m-early", "early", at(1)),
        ("m-late", "late", at(2)),
    ]
    assert (episodes[0].fact_ids, episodes[0].entity_ids) == ([likes.id], [jazz.id])
    assert (episodes[1].fact_ids, episodes[1].entity_ids) == ([likes.id], sorted([ana.id, jazz.id]))
    assert episodes[1].metadata == {"source": "contract-test", "turn": 1}
    assert graph_store.episodes("nobody-" + user) == []


def test_get_facts_fills_names_and_sorted_sources_and_is_scoped(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    ana, jazz = make_entity(user, "Ana"), make_entity(user, "Jazz")
    likes = make_fact(user, ana, "LIKES", jazz)
    graph_store.apply(plan(user, "m3", entities=[ana, jazz], facts=[likes]))
    graph_store.apply(plan(user, "m1", reinforced=[likes.id]))
    graph_store.apply(plan(user, "m2", reinforced=[likes.id]))
    twin = make_entity(other_user, "Ana")
    theirs = make_fact(other_user, twin, "LIKES")
    graph_store.apply(plan(other_user, "m1", entities=[twin], facts=[theirs]))

    got = graph_store.get_facts(user, [likes.id, theirs.id, "fact-missing"])

    assert [f.id for f in got] == [likes.id]
    assert (got[0].subject_name, got[0].object_name) == ("Ana", "Jazz")
    assert got[0].source_ids == ["m1", "m2", "m3"]
    assert got[0].embedding is None
    assert graph_store.get_facts(user, []) == []


# ------------------------------------------------------------------------------------------ expand


@dataclass
class Chain:
    """a -f0- b -f1- c -f2- d -f3- e, plus an attribute fact fa on a (no object)."""

    a: EntityRecord
    b: EntityRecord
    c: EntityRecord
    d: EntityRecord
    e: EntityRecord
    f0: FactRecord
    fa: FactRecord
    f1: FactRecord
    f2: FactRecord
    f3: FactRecord


def build_chain(store: GraphStore, user: str) -> Chain:
    a, b, c, d, e = (make_entity(user, n) for n in ("A", "B", "C", "D", "E"))
    f0 = make_fact(user, a, "KNOWS", b, importance=0.5)
    fa = make_fact(user, a, "FEELS", importance=0.9)
    f1 = make_fact(user, b, "KNOWS", c, importance=0.4)
    f2 = make_fact(user, d, "KNOWS", c, importance=0.3)  # c as OBJECT: traversal goes both ways
    f3 = make_fact(user, d, "KNOWS", e, importance=0.2)
    store.apply(plan(user, "m1", entities=[a, b, c], facts=[f0, fa, f1]))
    store.apply(plan(user, "m2", entities=[d, e], facts=[f2, f3]))
    return Chain(a, b, c, d, e, f0, fa, f1, f2, f3)


def test_expand_hops_are_bounded_by_max_hops(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)

    def walk(max_hops: int) -> list[tuple[str, int]]:
        return hops(expand(graph_store, user, [g.a.id], max_hops=max_hops, as_of=None, limit=FAR, per_seed=FAR))

    assert walk(0) == [(g.fa.id, 0), (g.f0.id, 0)]  # same hop: importance desc
    assert walk(1) == [(g.fa.id, 0), (g.f0.id, 0), (g.f1.id, 1)]
    assert walk(2) == [(g.fa.id, 0), (g.f0.id, 0), (g.f1.id, 1), (g.f2.id, 2)]
    assert walk(3) == [(g.fa.id, 0), (g.f0.id, 0), (g.f1.id, 1), (g.f2.id, 2), (g.f3.id, 3)]
    assert walk(4) == walk(3)


def test_expand_never_visits_an_avoided_hub(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)
    # From b, c is the only way on to d; avoiding c stops there, but facts mentioning c are still found.
    result = expand(graph_store, user, [g.b.id], max_hops=4, as_of=None, limit=FAR, per_seed=FAR, avoid=[g.c.id])
    assert hops(result) == [(g.f0.id, 0), (g.f1.id, 0), (g.fa.id, 1)]
    # An avoided entity is not a seed either.
    assert expand(graph_store, user, [g.c.id], max_hops=1, as_of=None, limit=FAR, per_seed=FAR, avoid=[g.c.id]) == []


def test_expand_returns_each_fact_once_at_its_minimum_hop(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)
    result = expand(graph_store, user, [g.a.id, g.c.id], max_hops=1, as_of=None, limit=FAR, per_seed=FAR)
    assert hops(result) == [(g.fa.id, 0), (g.f0.id, 0), (g.f1.id, 0), (g.f2.id, 0), (g.f3.id, 1)]
    # From b, f0 and f1 are both hop 0 even though each is also one hop away through the other.
    result = expand(graph_store, user, [g.b.id], max_hops=4, as_of=None, limit=FAR, per_seed=FAR)
    assert hops(result) == [(g.f0.id, 0), (g.f1.id, 0), (g.fa.id, 1), (g.f2.id, 1), (g.f3.id, 2)]


def test_expand_limit_keeps_the_nearest(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)
    assert hops(expand(graph_store, user, [g.a.id], max_hops=3, as_of=None, limit=3, per_seed=FAR)) == [
        (g.fa.id, 0),
        (g.f0.id, 0),
        (g.f1.id, 1),
    ]


def test_expand_caps_each_seeds_fan_out(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)
    seeds = [g.a.id, g.c.id]
    # Uncapped, c's hop-1 fact f3 comes too; each seed keeps only its nearest per_seed facts.
    uncapped = expand(graph_store, user, seeds, max_hops=1, as_of=None, limit=FAR, per_seed=FAR)
    assert (g.f3.id, 1) in hops(uncapped)
    two = expand(graph_store, user, seeds, max_hops=1, as_of=None, limit=FAR, per_seed=2)
    assert hops(two) == [(g.fa.id, 0), (g.f0.id, 0), (g.f1.id, 0), (g.f2.id, 0)]  # a: fa, f0; c: f1, f2
    one = expand(graph_store, user, seeds, max_hops=1, as_of=None, limit=FAR, per_seed=1)
    assert hops(one) == [(g.fa.id, 0), (g.f1.id, 0)]
    # The total limit still applies over the seeds' union.
    assert hops(expand(graph_store, user, seeds, max_hops=1, as_of=None, limit=3, per_seed=2)) == hops(two)[:3]


def test_expand_returns_read_shaped_facts(graph_store: GraphStore, user: str) -> None:
    g = build_chain(graph_store, user)
    graph_store.apply(plan(user, "m3", reinforced=[g.f1.id]))
    result = by_id(expand(graph_store, user, [g.a.id], max_hops=1, as_of=None, limit=FAR, per_seed=FAR))
    assert all(isinstance(f, HopFact) for f in result.values())
    assert_fact(result[g.f0.id], g.f0, source_ids=["m1"])
    restated = result[g.f1.id]  # reinforced: full strength as of the write, its reference instant
    assert restated.last_decay_at is not None and restated.last_decay_at > g.f1.created_at
    assert_fact(restated, g.f1, source_ids=["m1", "m3"], last_decay_at=restated.last_decay_at)
    assert result[g.fa.id].object_name is None


def test_expand_with_no_or_unknown_seeds_is_empty(graph_store: GraphStore, user: str, other_user: str) -> None:
    g = build_chain(graph_store, user)
    assert expand(graph_store, user, [], max_hops=2, as_of=None, limit=FAR, per_seed=FAR) == []
    assert expand(graph_store, user, ["ent-missing"], max_hops=2, as_of=None, limit=FAR, per_seed=FAR) == []
    assert expand(graph_store, other_user, [g.a.id], max_hops=2, as_of=None, limit=FAR, per_seed=FAR) == []


def test_expand_as_of_uses_facts_valid_then(graph_store: GraphStore, user: str) -> None:
    ana, paris, berlin, france = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin", "France"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), single_valued=True)
    paris_in_france = make_fact(user, paris, "IS_IN", france, valid_from=at(0))
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10), single_valued=True)
    graph_store.apply(plan(user, "m1", entities=[ana, paris, france], facts=[in_paris, paris_in_france]))
    graph_store.apply(
        plan(user, "m2", at(10), entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)])
    )

    def walk(as_of: datetime | None, max_hops: int = 0) -> list[tuple[str, int]]:
        return hops(expand(graph_store, user, [ana.id], max_hops=max_hops, as_of=as_of, limit=FAR, per_seed=FAR))

    assert walk(None) == [(in_berlin.id, 0)]
    assert walk(at(5)) == [(in_paris.id, 0)]  # superseded now, but valid then
    assert walk(at(10)) == [(in_berlin.id, 0)]  # valid_from inclusive, valid_until exclusive
    assert walk(at(15)) == [(in_berlin.id, 0)]
    assert walk(at(-1)) == []  # before anything was true
    # Traversal uses only facts valid at as_of: France is reachable through Paris only while Ana
    # lived there.
    assert walk(at(5), max_hops=1) == [(in_paris.id, 0), (paris_in_france.id, 1)]
    assert walk(None, max_hops=1) == [(in_berlin.id, 0)]
    assert ids(expand(graph_store, user, [paris.id], max_hops=0, as_of=None, limit=FAR, per_seed=FAR)) == {
        paris_in_france.id
    }


def test_expand_never_uses_archived_facts(graph_store: GraphStore, user: str) -> None:
    graph_store.fading = Fading(0.5, 0.01)
    a, b, c, x = (make_entity(user, n) for n in ("A", "B", "C", "X"))
    old = make_fact(user, a, "KNOWS", b, valid_from=at(0))  # decays below the threshold
    b_c = make_fact(user, b, "KNOWS", c, valid_from=at(30))
    a_x = make_fact(user, a, "LIKES", x, valid_from=at(30))
    graph_store.apply(plan(user, "m1", entities=[a, b, c, x], facts=[old, b_c, a_x]))
    assert graph_store.decay(user, now=at(30), batch=10) == (1, 1)

    assert hops(expand(graph_store, user, [a.id], max_hops=2, as_of=None, limit=FAR, per_seed=FAR)) == [(a_x.id, 0)]
    assert hops(expand(graph_store, user, [a.id], max_hops=2, as_of=at(31), limit=FAR, per_seed=FAR)) == [(a_x.id, 0)]
    assert hops(expand(graph_store, user, [b.id], max_hops=2, as_of=None, limit=FAR, per_seed=FAR)) == [(b_c.id, 0)]


# ----------------------------------------------------------------------------------------- history


def test_history_lists_every_fact_of_the_subject_by_valid_from(graph_store: GraphStore, user: str) -> None:
    graph_store.fading = Fading(0.5, 0.01)
    ana = make_entity(user, "Ana", aliases=["Annie"])
    bob, paris, berlin, rome, jazz = (make_entity(user, n) for n in ("Bob", "Paris", "Berlin", "Rome", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), created_at=at(40))
    jazz_fact = make_fact(user, ana, "LIKES", jazz, valid_from=at(5), created_at=at(0))  # archived below
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10), created_at=at(40))
    in_rome = make_fact(user, ana, "LIVES_IN", rome, valid_from=at(20), created_at=at(40))
    bob_knows = make_fact(user, bob, "KNOWS", ana, valid_from=at(1), created_at=at(40))  # ana as object
    # Stored out of valid_from order on purpose.
    graph_store.apply(plan(user, "m1", entities=[ana, bob, rome, jazz, paris], facts=[in_rome, jazz_fact, bob_knows]))
    graph_store.apply(plan(user, "m2", entities=[berlin], facts=[in_berlin, in_paris]))
    graph_store.apply(plan(user, "m3", fact_changes=[supersede(in_paris, in_berlin), supersede(in_berlin, in_rome)]))
    graph_store.decay(user, now=at(40), batch=10)

    everything = graph_store.history(user, "Ana", None)
    assert [f.id for f in everything] == [in_paris.id, jazz_fact.id, in_berlin.id, in_rome.id]
    got = by_id(everything)
    assert_fact(got[in_paris.id], in_paris, source_ids=["m2"], valid_until=at(10), superseded_by=in_berlin.id)
    assert got[jazz_fact.id].archived is True
    assert got[in_rome.id].valid_until is None
    lives = [f.id for f in graph_store.history(user, " ANNIE! ", "LIVES_IN")]
    assert lives == [in_paris.id, in_berlin.id, in_rome.id]
    assert graph_store.history(user, "Ana", "WORKS_AT") == []
    assert graph_store.history(user, "nobody", None) == []
    # A limit keeps the latest facts, still told oldest first.
    assert [f.id for f in graph_store.history(user, "Ana", None, limit=2)] == [in_berlin.id, in_rome.id]
    assert [f.id for f in graph_store.history(user, "Annie", "LIVES_IN", limit=1)] == [in_rome.id]
    assert graph_store.history(user, "Ana", None, limit=4) == everything


def test_history_is_bounded_by_default(graph_store: GraphStore, user: str) -> None:
    ana, paris = make_entity(user, "Ana"), make_entity(user, "Paris")
    facts = [make_fact(user, ana, f"VISITED_{i}", paris, valid_from=at(i)) for i in range(HISTORY_LIMIT + 5)]
    graph_store.apply(plan(user, "m1", entities=[ana, paris], facts=facts))
    got = graph_store.history(user, "Ana", None)
    assert [f.id for f in got] == [f.id for f in facts[-HISTORY_LIMIT:]]


# ----------------------------------------------------------------------------------- page and stats


def test_page_orders_facts_by_created_at_then_id(graph_store: GraphStore, user: str) -> None:
    ana, jazz, paris, cat = (make_entity(user, n) for n in ("Ana", "Jazz", "Paris", "Cat"))
    c3 = make_fact(user, ana, "LIKES", jazz, created_at=at(3))
    c1 = make_fact(user, ana, "LIVES_IN", paris, created_at=at(1))
    c5 = make_fact(user, cat, "IS_CUTE", created_at=at(5))
    c2 = make_fact(user, paris, "IS_BIG", created_at=at(2))
    c4 = make_fact(user, ana, "HAS_PET", cat, created_at=at(4))
    ties = sorted(
        [make_fact(user, ana, "IS", statement=f"tie {i}", created_at=at(6)) for i in range(2)], key=lambda f: f.id
    )
    graph_store.apply(plan(user, "m1", entities=[ana, jazz, paris], facts=[c3, c1]))
    graph_store.apply(plan(user, "m2", entities=[cat], facts=[c5, ties[1], c2, c4, ties[0]]))

    first = graph_store.page(user, 1, 2)
    assert (first.user_id, first.page, first.page_size, first.total_facts) == (user, 1, 2, 7)
    assert [f.id for f in first.facts] == [c1.id, c2.id]
    assert ids(first.entities) == {ana.id, paris.id}
    assert all(f.embedding is None and f.source_ids for f in first.facts)
    second = graph_store.page(user, 2, 2)
    assert [f.id for f in second.facts] == [c3.id, c4.id]
    assert ids(second.entities) == {ana.id, jazz.id, cat.id}
    third = graph_store.page(user, 3, 2)
    assert [f.id for f in third.facts] == [c5.id, ties[0].id]
    assert ids(third.entities) == {cat.id, ana.id}
    assert [f.id for f in graph_store.page(user, 4, 2).facts] == [ties[1].id]
    empty = graph_store.page(user, 5, 2)
    assert (empty.total_facts, empty.facts, empty.entities) == (7, [], [])
    assert [f.id for f in graph_store.page(user, 1, 100).facts] == [c1.id, c2.id, c3.id, c4.id, c5.id] + [
        t.id for t in ties
    ]


def test_stats_counts(graph_store: GraphStore, user: str) -> None:
    graph_store.fading = Fading(0.5, 0.01)
    ana, paris, berlin, jazz = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0))
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(0))
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(30))
    usage = Usage(prompt_tokens=7, completion_tokens=3, cost_usd=0.5, llm_calls=1)
    graph_store.apply(plan(user, "m1", entities=[ana, paris, jazz], facts=[in_paris, likes], usage=usage))
    graph_store.apply(
        plan(
            user,
            "m2",
            at(30),
            entities=[berlin],
            facts=[in_berlin],
            fact_changes=[supersede(in_paris, in_berlin)],
            usage=usage,
        )
    )
    # Archives both old facts; in_paris is then superseded AND archived and counts in both.
    assert graph_store.decay(user, now=at(30), batch=10) == (2, 2)
    graph_store.replace_clusters(user, [make_cluster(user, "home", facts=[in_berlin]), make_cluster(user, "music")])

    stats = graph_store.stats(user)

    assert stats.user_id == user
    assert (stats.entities, stats.facts, stats.episodes, stats.clusters) == (4, 3, 2, 2)
    # current = valid_until null and not archived; superseded = valid_until set; archived = archived.
    assert (stats.current_facts, stats.superseded_facts, stats.archived_facts) == (1, 1, 2)
    assert stats.version == graph_store.user_version(user) >= 4
    assert stats.usage == Usage(prompt_tokens=14, completion_tokens=6, cost_usd=1.0, llm_calls=2)


def test_vectors_return_every_fact_and_entity_embedding(graph_store: GraphStore, user: str) -> None:
    ana, paris = make_entity(user, "Ana"), make_entity(user, "Paris")
    bare = make_entity(user, "Bare", embedding=False)
    lives = make_fact(user, ana, "LIVES_IN", paris)
    plain = make_fact(user, ana, "KNOWS", bare, embedding=False)
    graph_store.apply(plan(user, "m1", entities=[ana, paris, bare], facts=[lives, plain]))

    items, version = graph_store.vectors(user)

    assert version == graph_store.user_version(user) == 1
    got = {(i.node_id, i.kind): i.embedding for i in items}
    assert set(got) == {(lives.id, "fact"), (ana.id, "entity"), (paris.id, "entity")}
    assert got[(lives.id, "fact")] == pytest.approx(lives.embedding)
    assert got[(ana.id, "entity")] == pytest.approx(ana.embedding)
    assert all(len(e) == DIM for e in got.values())
    graph_store.apply(plan(user, "m2", mentioned=[ana.id]))
    assert graph_store.vectors(user)[1] == 2


# ---------------------------------------------------------------------------------- user isolation


@dataclass
class Twin:
    entity_ids: set[str]
    fact_ids: set[str]
    seed: str
    then: str  # the fact current at at(5)
    now: str  # the fact current now


def build_twin(store: GraphStore, user: str) -> Twin:
    """The same names, message ids and timestamps for every user (only the generated ids differ)."""
    ana = make_entity(user, "Ana", aliases=["Annie"])
    paris, berlin = make_entity(user, "Paris"), make_entity(user, "Berlin")
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0))
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10))
    store.apply(plan(user, "m1", entities=[ana, paris], facts=[in_paris]))
    store.apply(plan(user, "m2", entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)]))
    store.replace_clusters(user, [make_cluster(user, "home", facts=[in_paris, in_berlin], entities=[ana])])
    return Twin({ana.id, paris.id, berlin.id}, {in_paris.id, in_berlin.id}, ana.id, in_paris.id, in_berlin.id)


def test_no_read_ever_shows_another_users_data(graph_store: GraphStore, user: str, other_user: str) -> None:
    mine, theirs = build_twin(graph_store, user), build_twin(graph_store, other_user)
    assert mine.fact_ids.isdisjoint(theirs.fact_ids)

    for me, them, owner in ((mine, theirs, user), (theirs, mine, other_user)):
        everything = sorted(me.fact_ids | them.fact_ids)
        assert ids(graph_store.get_facts(owner, everything)) == me.fact_ids
        assert ids(graph_store.get_entities(owner, sorted(me.entity_ids | them.entity_ids))) == me.entity_ids
        seeds = [me.seed, them.seed]
        assert ids(expand(graph_store, owner, seeds, max_hops=3, as_of=at(5), limit=FAR, per_seed=FAR)) == {me.then}
        assert ids(expand(graph_store, owner, seeds, max_hops=3, as_of=None, limit=FAR, per_seed=FAR)) == {me.now}
        assert expand(graph_store, owner, [them.seed], max_hops=3, as_of=None, limit=FAR, per_seed=FAR) == []
        assert ids(graph_store.history(owner, "Annie", None)) == me.fact_ids
        assert ids(named(graph_store, owner, ["ana", "annie", "paris", "berlin"])) == me.entity_ids
        page = graph_store.page(owner, 1, 100)
        assert (page.total_facts, ids(page.facts), ids(page.entities)) == (2, me.fact_ids, me.entity_ids)
        items, version = graph_store.vectors(owner)
        assert {i.node_id for i in items} == me.fact_ids | me.entity_ids
        assert version == 3
        stats = graph_store.stats(owner)
        assert (stats.entities, stats.facts, stats.episodes, stats.clusters, stats.version) == (3, 2, 2, 1, 3)
        (cluster,) = graph_store.clusters(owner)
        assert set(cluster.member_fact_ids) == me.fact_ids
        assert slot_facts(graph_store, owner, [(them.seed, "LIVES_IN")]) == []


def test_forgetting_one_users_message_leaves_the_others_alone(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    build_twin(graph_store, user)
    theirs = build_twin(graph_store, other_user)
    before = (graph_store.stats(other_user), graph_store.vectors(other_user))

    assert graph_store.forget_message(user, "m2").facts == 1
    assert graph_store.forget_message(user, "m-other-only").episodes == 0

    assert (graph_store.stats(other_user), graph_store.vectors(other_user)) == before
    assert ids(graph_store.get_facts(other_user, sorted(theirs.fact_ids))) == theirs.fact_ids
    assert graph_store.is_applied(other_user, "m2")


# ------------------------------------------------------------------------------------------ forget


def test_forget_message_cascades_and_leaves_nothing_behind(graph_store: GraphStore, user: str) -> None:
    ana, paris, jazz, tokyo = (make_entity(user, n) for n in ("Ana", "Paris", "Jazz", "Tokyo"))
    berlin, cat = make_entity(user, "Berlin"), make_entity(user, "Cat")
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), single_valued=True)
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(0))
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10), single_valued=True)
    has_cat = make_fact(user, ana, "HAS_PET", cat, valid_from=at(10))
    trip = make_fact(user, ana, "VISITED", tokyo, valid_from=at(20))
    # m1: Tokyo is only mentioned; m2: replaces Paris, restates "likes jazz"; m3: the only Tokyo fact.
    graph_store.apply(plan(user, "m1", entities=[ana, paris, jazz, tokyo], facts=[in_paris, likes]))
    graph_store.apply(
        plan(
            user,
            "m2",
            at(10),
            entities=[berlin, cat],
            facts=[in_berlin, has_cat],
            fact_changes=[supersede(in_paris, in_berlin)],
            reinforced=[likes.id],
            mentioned=[ana.id],
        )
    )
    graph_store.apply(plan(user, "m3", at(20), facts=[trip]))
    graph_store.replace_clusters(user, [make_cluster(user, "life", facts=[likes, has_cat], entities=[cat, ana])])
    version = graph_store.user_version(user)

    # --- forget m2: its own facts and entities go, the shared fact stays, Paris is current again.
    result = graph_store.forget_message(user, "m2")
    assert (result.user_id, result.episodes, result.facts, result.entities) == (user, 1, 2, 2)
    assert sorted(result.removed_fact_ids) == sorted([in_berlin.id, has_cat.id])
    assert sorted(result.removed_entity_ids) == sorted([berlin.id, cat.id])
    assert result.vectors == 4  # every removed node had an embedding
    assert graph_store.user_version(user) == version + 1
    assert not graph_store.is_applied(user, "m2")
    assert graph_store.get_facts(user, [in_berlin.id, has_cat.id]) == []
    assert graph_store.get_entities(user, [berlin.id, cat.id]) == []
    assert named(graph_store, user, ["berlin", "cat"]) == []
    restored = one_fact(graph_store, user, in_paris.id)
    assert (restored.valid_until, restored.superseded_by) == (None, None)
    assert one_fact(graph_store, user, likes.id).source_ids == ["m1"]
    stats = graph_store.stats(user)
    assert (stats.episodes, stats.facts, stats.entities, stats.current_facts, stats.superseded_facts) == (2, 3, 4, 3, 0)
    remaining_facts, remaining_entities = {in_paris.id, likes.id, trip.id}, {ana.id, paris.id, jazz.id, tokyo.id}
    assert {i.node_id for i in graph_store.vectors(user)[0]} == remaining_facts | remaining_entities
    page = graph_store.page(user, 1, 100)
    assert (ids(page.facts), ids(page.entities)) == (remaining_facts, remaining_entities)
    assert ids(expand(graph_store, user, [ana.id], max_hops=2, as_of=None, limit=FAR, per_seed=FAR)) == remaining_facts
    # A cluster that held a forgotten fact or entity goes whole (its summary may quote them); the next
    # hierarchy run rebuilds clusters from what is left.
    assert graph_store.clusters(user) == []

    # --- forget m1: "likes jazz" has lost its other source and goes; Ana and Tokyo have no FROM
    # link left but m3's fact still mentions them, so they stay.
    result = graph_store.forget_message(user, "m1")
    assert sorted(result.removed_fact_ids) == sorted([in_paris.id, likes.id])
    assert sorted(result.removed_entity_ids) == sorted([paris.id, jazz.id])
    assert ids(graph_store.get_entities(user, [ana.id, tokyo.id])) == {ana.id, tokyo.id}
    stats = graph_store.stats(user)
    assert (stats.episodes, stats.facts, stats.entities) == (1, 1, 2)

    # --- forget m3: nothing of the user's graph is left, only its version.
    result = graph_store.forget_message(user, "m3")
    assert (result.facts, result.entities) == (1, 2)
    assert sorted(result.removed_entity_ids) == sorted([ana.id, tokyo.id])
    stats = graph_store.stats(user)
    assert (stats.episodes, stats.facts, stats.entities, stats.current_facts) == (0, 0, 0, 0)
    assert stats.version == version + 3
    assert graph_store.vectors(user) == ([], version + 3)
    assert graph_store.page(user, 1, 100).total_facts == 0
    assert graph_store.history(user, "Ana", None) == []
    assert all(c.member_fact_ids == c.member_entity_ids == [] for c in graph_store.clusters(user))


def test_forget_message_keeps_entities_another_message_mentioned(graph_store: GraphStore, user: str) -> None:
    ana, cat = make_entity(user, "Ana"), make_entity(user, "Cat")
    graph_store.apply(plan(user, "m1", entities=[ana, cat], facts=[make_fact(user, ana, "HAS_PET", cat)]))
    graph_store.apply(plan(user, "m2", mentioned=[cat.id]))

    result = graph_store.forget_message(user, "m1")

    assert result.removed_entity_ids == [ana.id]
    assert ids(graph_store.get_entities(user, [ana.id, cat.id])) == {cat.id}


def test_forget_message_reconnects_a_supersession_chain(graph_store: GraphStore, user: str) -> None:
    # DECISION: "no successor" follows the chain. Paris -> Berlin -> Rome; forgetting Berlin's
    # message makes Rome Paris' successor (Paris stays superseded, from the same instant), because
    # making Paris current again would give a single-valued slot two current values. Only when no
    # later fact survives does the older fact become current again.
    ana, paris, berlin, rome = (make_entity(user, n) for n in ("Ana", "Paris", "Berlin", "Rome"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), single_valued=True)
    in_berlin = make_fact(user, ana, "LIVES_IN", berlin, valid_from=at(10), single_valued=True)
    in_rome = make_fact(user, ana, "LIVES_IN", rome, valid_from=at(20), single_valued=True)
    graph_store.apply(plan(user, "m1", entities=[ana, paris], facts=[in_paris]))
    graph_store.apply(
        plan(user, "m2", entities=[berlin], facts=[in_berlin], fact_changes=[supersede(in_paris, in_berlin)])
    )
    graph_store.apply(plan(user, "m3", entities=[rome], facts=[in_rome], fact_changes=[supersede(in_berlin, in_rome)]))

    graph_store.forget_message(user, "m2")
    old = one_fact(graph_store, user, in_paris.id)
    assert (old.valid_until, old.superseded_by) == (at(10), in_rome.id)
    assert one_fact(graph_store, user, in_rome.id).valid_until is None
    assert [f.id for f in graph_store.history(user, "Ana", "LIVES_IN")] == [in_paris.id, in_rome.id]
    assert graph_store.stats(user).current_facts == 1

    graph_store.forget_message(user, "m3")
    old = one_fact(graph_store, user, in_paris.id)
    assert (old.valid_until, old.superseded_by) == (None, None)
    assert hops(expand(graph_store, user, [ana.id], max_hops=0, as_of=None, limit=FAR, per_seed=FAR)) == [
        (in_paris.id, 0)
    ]


def test_forget_unknown_message_changes_nothing(graph_store: GraphStore, user: str) -> None:
    # DECISION: forgetting a message the user never had is a no-op (zero counts, no version bump).
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m1", entities=[me]))
    assert graph_store.forget_message(user, "m-unknown") == ForgetResult(user_id=user)
    assert graph_store.user_version(user) == 1
    assert graph_store.stats(user).entities == 1


def test_forget_fact_deletes_that_fact_repairs_its_chain_and_keeps_episodes(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    ana, paris, rome, jazz = (make_entity(user, n) for n in ("Ana", "Paris", "Rome", "Jazz"))
    in_paris = make_fact(user, ana, "LIVES_IN", paris, valid_from=at(0), single_valued=True)
    in_rome = make_fact(user, ana, "LIVES_IN", rome, valid_from=at(20), single_valued=True)
    likes = make_fact(user, ana, "LIKES", jazz, valid_from=at(20))
    graph_store.apply(plan(user, "m1", entities=[ana, paris], facts=[in_paris]))
    graph_store.apply(
        plan(user, "m2", entities=[rome, jazz], facts=[in_rome, likes], fact_changes=[supersede(in_paris, in_rome)])
    )
    version = graph_store.user_version(user)
    assert graph_store.forget_fact(other_user, in_rome.id) == ForgetResult(user_id=other_user)
    assert graph_store.forget_fact(user, "fact-unknown") == ForgetResult(user_id=user)
    assert graph_store.user_version(user) == version

    result = graph_store.forget_fact(user, in_rome.id)
    assert (result.episodes, result.removed_fact_ids) == (0, [in_rome.id])
    # Rome keeps its provenance link to m2, so it is not an orphan.
    assert result.removed_entity_ids == []
    assert graph_store.user_version(user) == version + 1
    old = one_fact(graph_store, user, in_paris.id)
    assert (old.valid_until, old.superseded_by) == (None, None)
    assert graph_store.stats(user).episodes == 2
    assert ids(graph_store.get_facts(user, [likes.id, in_rome.id])) == {likes.id}


def test_forget_user_removes_everything_of_that_user_only(graph_store: GraphStore, user: str, other_user: str) -> None:
    twins = {u: build_twin(graph_store, u) for u in (user, other_user)}
    for u in (user, other_user):
        fact_id = sorted(twins[u].fact_ids)[0]
        graph_store.add_feedback([make_feedback(u, fact_id, at(1)), make_feedback(u, fact_id, at(2), useful=False)])
        graph_store.save_weights(make_weights(u, alpha=0.5))

    def snapshot(u: str) -> tuple[object, ...]:
        items, version = graph_store.vectors(u)
        return (
            graph_store.stats(u),
            sorted((i.node_id, i.kind) for i in items),
            version,
            graph_store.page(u, 1, 100),
            graph_store.clusters(u),
            graph_store.feedback(u, 10),
            graph_store.load_weights(u),
            graph_store.history(u, "Ana", None),
        )

    other_before = snapshot(other_user)

    result = graph_store.forget_user(user)

    # DECISION: forget_user is asserted on its counts; its id lists are not part of the contract.
    assert (result.user_id, result.episodes, result.facts, result.entities) == (user, 2, 2, 3)
    assert result.vectors == 5
    assert graph_store.stats(user) == UserStats(user_id=user)
    assert graph_store.user_version(user) == 0
    assert not graph_store.is_applied(user, "m1")
    assert graph_store.vectors(user) == ([], 0)
    assert graph_store.page(user, 1, 10).total_facts == 0
    assert graph_store.clusters(user) == []
    assert graph_store.feedback(user, 10) == []
    assert graph_store.load_weights(user) is None
    assert named(graph_store, user, ["ana", "paris", "berlin"]) == []
    assert graph_store.get_facts(user, sorted(twins[user].fact_ids)) == []
    assert user not in graph_store.list_users()
    assert snapshot(other_user) == other_before
    assert other_user in graph_store.list_users()
    # The user can start over.
    assert graph_store.apply(plan(user, "m1")) == ApplyOutcome(applied=True, version=1)


def test_forget_unknown_user_is_a_no_op(graph_store: GraphStore, user: str) -> None:
    assert graph_store.forget_user(user) == ForgetResult(user_id=user)


# ------------------------------------------------------------------------------------- maintenance


def test_replace_clusters_round_trip_and_replacement(graph_store: GraphStore, user: str, other_user: str) -> None:
    ana, jazz, paris = (make_entity(user, n) for n in ("Ana", "Jazz", "Paris"))
    likes, lives = make_fact(user, ana, "LIKES", jazz), make_fact(user, ana, "LIVES_IN", paris)
    graph_store.apply(plan(user, "m1", entities=[ana, jazz, paris], facts=[likes, lives]))
    twin = make_entity(other_user, "Ana")
    graph_store.apply(plan(other_user, "m1", entities=[twin]))
    theirs = make_cluster(other_user, "them", entities=[twin])
    graph_store.replace_clusters(other_user, [theirs])
    music = make_cluster(user, "music", facts=[likes], entities=[ana, jazz], created_at=at(3))
    home = make_cluster(user, "home", facts=[lives, likes], entities=[paris])
    version = graph_store.user_version(user)

    graph_store.replace_clusters(user, [music, home])

    assert graph_store.user_version(user) == version + 1
    got = {c.id: c for c in graph_store.clusters(user)}
    assert set(got) == {music.id, home.id}
    for want in (music, home):
        c = got[want.id]
        assert (c.user_id, c.label, c.summary, c.signature, c.created_at) == (
            user,
            want.label,
            want.summary,
            want.signature,
            want.created_at,
        )
        assert sorted(c.member_fact_ids) == sorted(want.member_fact_ids)
        assert sorted(c.member_entity_ids) == sorted(want.member_entity_ids)
        assert c.centroid == pytest.approx(want.centroid)
    assert graph_store.stats(user).clusters == 2

    replacement = make_cluster(user, "all", facts=[likes, lives])
    graph_store.replace_clusters(user, [replacement])
    assert [c.id for c in graph_store.clusters(user)] == [replacement.id]
    assert graph_store.stats(user).clusters == 1
    graph_store.replace_clusters(user, [])
    assert graph_store.clusters(user) == []
    assert graph_store.user_version(user) == version + 3
    assert [(c.id, c.member_entity_ids) for c in graph_store.clusters(other_user)] == [(theirs.id, [twin.id])]


def test_feedback_is_newest_first_per_user_and_global(graph_store: GraphStore, user: str, other_user: str) -> None:
    # Real-time stamps: the Neo4j database is shared with earlier runs, whose rows are older.
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    u1, u3 = make_feedback(user, "fact-1", base), make_feedback(user, "fact-3", base + timedelta(seconds=2))
    o2 = make_feedback(other_user, "fact-2", base + timedelta(seconds=1), useful=False)
    o4 = make_feedback(other_user, "fact-4", base + timedelta(seconds=3))
    graph_store.add_feedback([u3, o2])
    graph_store.add_feedback([u1, o4])
    graph_store.add_feedback([])

    assert graph_store.feedback(user, 10) == [u3, u1]
    assert graph_store.feedback(user, 1) == [u3]
    assert graph_store.feedback(other_user, 10) == [o4, o2]
    assert graph_store.feedback(None, 4) == [o4, u3, o2, u1]


def test_weights_save_load_and_overwrite(graph_store: GraphStore, user: str, other_user: str) -> None:
    assert graph_store.load_weights(user) is None
    first = make_weights(user, alpha=0.4, fitted_at=at(1))
    graph_store.save_weights(first)
    assert graph_store.load_weights(user) == first
    second = make_weights(user, alpha=0.7, fitted_at=at(2))
    graph_store.save_weights(second)
    assert graph_store.load_weights(user) == second
    assert graph_store.load_weights(other_user) is None


def test_list_users_lists_every_user_with_data(graph_store: GraphStore, user: str, other_user: str) -> None:
    graph_store.apply(plan(user, "m1"))
    graph_store.apply(plan(other_user, "m1"))
    listed = graph_store.list_users()
    assert {user, other_user} <= set(listed)
    assert len(listed) == len(set(listed))
    graph_store.forget_user(user)
    assert user not in graph_store.list_users() and other_user in graph_store.list_users()


# ------------------------------------------------------------------------------------- concurrency


def test_concurrent_applies_from_threads_are_serialized(graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m0", entities=[me]))
    distinct = [plan(user, f"m{i}", facts=[make_fact(user, me, f"P{i}")], mentioned=[me.id]) for i in range(1, 9)]
    duplicate = plan(user, "dup", facts=[make_fact(user, me, "DUP")])
    barrier = threading.Barrier(16)

    def run(p: WritePlan) -> bool:
        barrier.wait()
        return graph_store.apply(p).applied

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, distinct + [duplicate] * 8))

    assert results[:8] == [True] * 8
    assert results[8:].count(True) == 1
    stats = graph_store.stats(user)
    assert (stats.version, stats.episodes, stats.facts) == (10, 10, 9)


@pytest.mark.slow
def test_concurrent_applies_from_processes(store_spec: tuple[str, str], graph_store: GraphStore, user: str) -> None:
    me = make_entity(user, "Ana")
    graph_store.apply(plan(user, "m0", entities=[me]))
    duplicate = plan(user, "dup", facts=[make_fact(user, me, "DUP")])
    batches = [
        [plan(user, f"m{w}-{i}", facts=[make_fact(user, me, f"P{w}{i}")]) for i in range(5)] + [duplicate]
        for w in range(4)
    ]
    ctx = multiprocessing.get_context("spawn")  # no inherited connections or driver threads
    with ctx.Pool(4) as pool:
        results = pool.starmap(apply_in_process, [(*store_spec, b) for b in batches])

    assert all(r[:5] == [True] * 5 for r in results)
    assert [r[5] for r in results].count(True) == 1
    stats = graph_store.stats(user)
    assert (stats.version, stats.episodes, stats.facts) == (22, 22, 21)


def test_the_earlier_turns_are_the_last_episodes_before_an_instant_oldest_first(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    """The extractor's earlier turns: this user's episodes strictly before the instant, newest ``limit``."""
    for day in (3, 1, 2, 5):  # applied out of event-time order
        graph_store.apply(plan(user, f"m{day}", at(day), content=f"day {day}"))
    graph_store.apply(plan(other_user, "m4", at(4), content="someone else"))

    def recent(before: datetime, turns: int) -> list[EpisodeRecord]:
        return graph_store.extraction_context(
            user, entity_ids=[], fact_ids=[], slots=[], before=before, turns=turns
        ).episodes

    last = recent(at(5), 2)
    assert [(e.id, e.content, e.event_time) for e in last] == [("m2", "day 2", at(2)), ("m3", "day 3", at(3))]
    assert last[0].metadata == {"source": "contract-test", "turn": 1}
    assert [e.id for e in recent(at(10), 10)] == ["m1", "m2", "m3", "m5"]
    assert recent(at(1), 5) == []
    assert recent(at(10), 0) == []
