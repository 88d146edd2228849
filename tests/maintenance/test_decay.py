"""Archival by the decay job: the old job's closed form and test, on the facts due only; idempotent
re-runs; the index re-stamped only when something was archived (``storage.graph.fading``)."""

from __future__ import annotations

from contextlib import AbstractContextManager

import pytest

from engram_api.errors import ConfigError
from engram_api.reader.scoring import fact_strength
from engram_api.settings import Settings
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.fading import Fading
from engram_api.storage.writer.userwrite import UserWrite
from engram_workers.maintenance import DecayReport, run_decay
from tests.support.builders import T0, GuardSpy, UserGraph, at, new_user

PER_DAY = 0.9
THRESHOLD = 0.3
SETTINGS = Settings(decay_per_day=PER_DAY, archive_threshold=THRESHOLD, maintenance_batch=2)
FACTS = [
    ("Alex", "WORKS_AT", "Dell", "Alex works at Dell"),
    ("Alex", "LIVES_IN", "Austin", "Alex lives in Austin"),
    ("Alex", "PLAYS", "guitar", "Alex plays guitar"),
]
WEAK = [("Alex", "LIKES", None, "Alex likes jazz")]


@pytest.fixture(autouse=True)
def _fading(store: GraphStore) -> None:
    """The store computes every fact's archive_due_at with the job's settings, as ``open_graph_store`` does."""
    store.fading = Fading(PER_DAY, THRESHOLD)


def _strengths(store: GraphStore, user: str, fact_ids: list[str]) -> dict[str, tuple[float, bool]]:
    return {f.id: (f.strength, f.archived) for f in store.get_facts(user, fact_ids)}


def test_archival_follows_the_closed_form_whatever_the_schedule(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy
) -> None:
    daily, once = new_user(), new_user()
    strong = {u: UserGraph(store, u).say(FACTS, when=T0) for u in (daily, once)}
    weak = {u: UserGraph(store, u).say(WEAK, strength=0.5) for u in (daily, once)}
    days = 5
    for day in range(1, days + 1):
        run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(day), user_ids=[daily])
    report = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(days), user_ids=[once])

    expected = PER_DAY**days  # 0.59: the strong facts stay, 0.5 * 0.59 = 0.295 < 0.3 is archived
    for u in (daily, once):
        facts = {f.id: f for f in store.get_facts(u, [f.id for f in strong[u] + weak[u]])}
        for fact in strong[u]:  # never written: recall reads them faded
            assert (facts[fact.id].strength, facts[fact.id].archived) == (1.0, False)
            assert fact_strength(facts[fact.id], at(days), SETTINGS) == pytest.approx(expected, rel=1e-9)
        archived = facts[weak[u][0].id]
        assert (archived.strength, archived.archived) == (pytest.approx(0.5 * expected, rel=1e-9), True)
        assert store.stats(u).archived_facts == 1
    assert (report.users, report.due, report.archived) == (1, 1, 1)
    assert report.per_user[0].user_id == once and not report.failed
    assert set(guard.entered) == {daily, once}


def test_a_second_run_at_the_same_instant_changes_nothing(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    facts = UserGraph(store, user).say(FACTS, when=T0) + UserGraph(store, user).say(WEAK, strength=0.5)
    first = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(6), user_ids=[user])
    before = (_strengths(store, user, [f.id for f in facts]), store.user_version(user))

    second = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(6), user_ids=[user])
    earlier = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(1), user_ids=[user])

    assert (first.due, first.archived) == (1, 1)
    assert (second.due, second.archived, earlier.due) == (0, 0, 0)
    assert (_strengths(store, user, [f.id for f in facts]), store.user_version(user)) == before


def test_a_store_of_another_policy_is_refused(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say(FACTS, when=T0)
    version = store.user_version(user)
    other = SETTINGS.model_copy(update={"decay_per_day": 0.5})
    with pytest.raises(ConfigError, match="ENGRAM_DECAY_PER_DAY"):
        run_decay(graph=graph, settings=other, guard=guard, now=at(30), user_ids=[user])
    assert store.user_version(user) == version and store.stats(user).archived_facts == 0


def test_a_run_on_named_users_after_a_policy_change_archives_by_the_new_dues(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    store.refresh_dues(batch=10)  # the dues' policy recorded: (PER_DAY, THRESHOLD)
    weak = UserGraph(store, user).say(WEAK, when=T0, strength=0.5)  # 0.5 * 0.9 ** d < 0.3 after ~4.85 days
    faster = SETTINGS.model_copy(update={"decay_per_day": 0.5})  # 0.5 * 0.5 ** d < 0.3 after ~0.74 days
    store.fading = Fading(faster.decay_per_day, faster.archive_threshold)  # the process restarted with it

    report = run_decay(graph=graph, settings=faster, guard=guard, now=at(1), user_ids=[user])

    assert report.recomputed >= 1  # every unarchived fact in the store (a Neo4j one is the session's)
    assert (report.due, report.archived) == (1, 1)
    assert _strengths(store, user, [weak[0].id]) == {weak[0].id: (pytest.approx(0.5 * 0.5), True)}


def test_the_index_is_restamped_not_rebuilt_and_only_when_something_was_archived(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say(FACTS, when=T0)
    UserGraph(store, user).say(WEAK, when=T0, strength=0.5)
    keeper.rebuild(user)  # what the apply stage leaves behind
    keeper.rebuilds = 0
    version = store.user_version(user)

    quiet = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(2), user_ids=[user])
    assert (quiet.due, quiet.per_user[0].version) == (0, version)  # nothing due: nothing read or written
    assert store.user_version(user) == version

    report = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(6), user_ids=[user])

    assert store.user_version(user) > version, "an archival changes what recall returns: the version moves"
    assert keeper.vectors.file_stamp(user) == store.user_stamp(user)
    assert store.user_version(user) == report.per_user[0].version
    assert keeper.rebuilds == 0
    assert len(keeper.vectors.load(user) or []) == len(store.vectors(user)[0])


# Runs on SQLite only: on the shared Neo4j database every test's users and feedback are visible.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_without_user_ids_only_the_users_due_are_visited_and_the_report_serializes(
    backend: str, store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    other, later = new_user(), new_user()
    UserGraph(store, user).say(WEAK, strength=0.5)  # due at ~day 4.8
    UserGraph(store, other).say(FACTS[1:])  # due at ~day 11.4
    UserGraph(store, later).say(FACTS[:1], when=at(3))

    report = run_decay(graph=graph, settings=SETTINGS, guard=guard, now=at(12))

    assert sorted(u.user_id for u in report.per_user) == sorted([user, other])  # not ``later``
    assert set(guard.entered) == {user, other}
    assert (report.users, report.due, report.archived) == (2, 3, 3)
    assert DecayReport.model_validate_json(report.model_dump_json()) == report


def test_a_failing_user_is_reported_and_the_others_still_decay(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say(FACTS)
    busy = new_user()

    def locking(user_id: str) -> AbstractContextManager[UserWrite]:
        if user_id == busy:
            raise TimeoutError("lock busy")
        return guard(user_id)

    report = run_decay(graph=graph, settings=SETTINGS, guard=locking, now=at(12), user_ids=[busy, user])

    assert [f.user_id for f in report.failed] == [busy]
    assert "lock busy" in report.failed[0].error
    assert report.users == 1 and report.archived == 3
