"""Read-time decay on both stores: the effective strength is what the old daily job stored, archival happens
on the run the old job archived, and the job reads and writes only the facts due (``storage.graph.fading``).

The old job is written out here as the reference (``OldJob``): every run multiplied ``per_day ** days``
into the stored strength of each unarchived fact, moved its reference instant to the run, and archived it
below the threshold.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from engram_api.reader.scoring import fact_strength
from engram_api.settings import Settings
from engram_api.storage import GraphStore
from engram_api.storage.graph.fading import Fading
from engram_workers.maintenance import decay_users
from tests.support.factories import at, make_entity, make_fact, plan

PER_DAY, THRESHOLD = 0.9, 0.01
SETTINGS = Settings(decay_per_day=PER_DAY, archive_threshold=THRESHOLD)
DAY = timedelta(days=1)


@dataclass
class Stored:
    strength: float
    since: datetime
    archived: bool = False


class OldJob:
    """The decay job before read-time decay, on its own copy of the facts' stored state."""

    def __init__(self, facts: dict[str, Stored]) -> None:
        self.facts = facts

    def run(self, now: datetime) -> set[str]:
        archived = set()
        for fid, f in self.facts.items():
            if f.archived or f.since >= now:
                continue
            f.strength *= PER_DAY ** ((now - f.since) / DAY)
            f.since, f.archived = now, f.strength < THRESHOLD
            if f.archived:
                archived.add(fid)
        return archived


@pytest.fixture
def faded(graph_store: GraphStore) -> GraphStore:
    graph_store.fading = Fading(PER_DAY, THRESHOLD)
    return graph_store


def _say(store: GraphStore, user: str, specs: list[tuple[float, float]]) -> dict[str, Stored]:
    """One fact per (strength, created day); returns the old job's view of them."""
    ana = make_entity(user, "Ana")
    facts = [make_fact(user, ana, f"P{i}", strength=s, created_at=at(d)) for i, (s, d) in enumerate(specs)]
    store.apply(plan(user, "m1", entities=[ana], facts=facts))
    return {f.id: Stored(f.strength, f.created_at) for f in facts}


def test_the_strength_read_at_any_instant_is_what_the_old_job_would_have_stored_then(
    faded: GraphStore, user: str
) -> None:
    old = _say(faded, user, [(1.0, 0), (0.6, 2.5), (0.3, 7), (1.0, 11.75)])
    stored = {f.id: f for f in faded.get_facts(user, list(old))}
    for t in (at(0.5), at(3), at(10.25), at(12), at(30)):
        job = OldJob({fid: Stored(s.strength, s.since) for fid, s in old.items()})
        for day in range(1, math.floor((t - at(0)) / DAY) + 1):  # the old job's daily runs, then one at t
            job.run(at(day))
        job.run(t)
        for fid, fact in stored.items():
            if fact.created_at <= t and not job.facts[fid].archived:
                assert fact_strength(fact, t, SETTINGS) == pytest.approx(job.facts[fid].strength, rel=1e-12, abs=0)
    # Stored strengths are untouched by reading: nothing was written.
    assert {f.id: (f.strength, f.last_decay_at) for f in faded.get_facts(user, list(old))} == {
        fid: (s.strength, None) for fid, s in old.items()
    }


def test_archival_happens_on_the_run_the_old_job_archived_and_only_due_users_are_visited(
    faded: GraphStore, user: str
) -> None:
    rng = random.Random(45)
    specs = [(round(rng.uniform(0.05, 1.0), 6), rng.randrange(0, 20 * 86400) / 86400) for _ in range(40)]
    old = OldJob(_say(faded, user, specs))
    for day in range(1, 70):
        run = at(day) + timedelta(hours=3)
        expected = old.run(run)
        version = faded.user_version(user)
        assert (user in faded.users_due(run)) == bool(expected), day
        assert faded.decay(user, now=run, batch=7) == (len(expected), len(expected)), day
        facts = {f.id: f for f in faded.get_facts(user, list(old.facts))}
        assert {fid for fid in expected if facts[fid].archived} == expected
        assert sum(f.archived for f in facts.values()) == sum(s.archived for s in old.facts.values())
        for fid in expected:  # archived with the strength the old job stored, measured at the run
            assert facts[fid].strength == pytest.approx(old.facts[fid].strength, rel=1e-9)
            assert facts[fid].last_decay_at == run
        assert faded.user_version(user) == version + (1 if expected else 0)
    assert all(s.archived for s in old.facts.values())  # the run covered every fact's archival


def test_a_run_reads_and_writes_only_the_facts_due(faded: GraphStore, user: str, other_user: str) -> None:
    quiet = _say(faded, other_user, [(1.0, 10), (0.8, 12)])  # 0.9 ** d < 0.01 only after ~44 days
    busy = _say(faded, user, [(0.05, 0), (1.0, 0)])  # the weak one is due at ~day 15.3
    quiet_before = (faded.get_facts(other_user, list(quiet)), faded.user_version(other_user))
    busy_before = {f.id: f for f in faded.get_facts(user, list(busy))}
    version = faded.user_version(user)

    due = faded.users_due(at(20))
    assert user in due and other_user not in due
    assert faded.decay(other_user, now=at(20), batch=10) == (0, 0)
    assert faded.decay(user, now=at(20), batch=10) == (1, 1)

    assert (faded.get_facts(other_user, list(quiet)), faded.user_version(other_user)) == quiet_before
    after = {f.id: f for f in faded.get_facts(user, list(busy))}
    weak, strong = list(busy)
    assert after[weak].archived and after[strong] == busy_before[strong]  # the other fact: not even updated_at
    assert faded.user_version(user) == version + 1
    assert faded.decay(user, now=at(20), batch=10) == (0, 0)  # done: a second run reads nothing
    assert user not in faded.users_due(at(20))


def test_every_strength_write_sets_its_due(faded: GraphStore, user: str) -> None:
    fade = faded.fading
    ana = make_entity(user, "Ana")
    restated = make_fact(user, ana, "A", strength=0.5, created_at=at(0))
    fed = make_fact(user, ana, "B", strength=0.5, created_at=at(0))
    faded.apply(plan(user, "m1", entities=[ana], facts=[restated, fed]))
    assert faded.decay(user, now=at(15), batch=10) == (0, 0)  # 0.5 * 0.9 ** d < 0.01 after ~37 days

    # Feedback at day 3: the effective strength plus the amount, measured then, due again from there.
    assert faded.reinforce(user, [fed.id], amount=0.2, now=at(3)) == 1
    got = {f.id: f for f in faded.get_facts(user, [restated.id, fed.id])}[fed.id]
    assert got.strength == pytest.approx(0.5 * PER_DAY**3 + 0.2, rel=1e-12)
    assert got.last_decay_at == at(3)
    crossing = at(3) + DAY * math.log(THRESHOLD / got.strength) / math.log(PER_DAY)
    assert faded.decay(user, now=crossing - timedelta(seconds=1), batch=10) == (1, 1)  # the other fact only
    assert faded.decay(user, now=crossing + timedelta(seconds=1), batch=10) == (1, 1)  # now this one
    assert fade.due(got.strength, at(3)) <= crossing

    # A message restating the archived fact: full strength as of the write, due ~44 days after it.
    faded.apply(plan(user, "m2", at(50), reinforced=[restated.id]))
    back = faded.get_facts(user, [restated.id])[0]
    assert (back.strength, back.archived) == (1.0, False) and back.last_decay_at is not None
    assert faded.decay(user, now=back.last_decay_at + 43 * DAY, batch=10) == (0, 0)
    assert faded.decay(user, now=back.last_decay_at + 44 * DAY, batch=10) == (1, 1)

    # Feedback on an archived fact: its stored strength (archival stopped its fading) plus the amount.
    archived = faded.get_facts(user, [restated.id])[0]
    assert faded.reinforce(user, [restated.id], amount=0.3, now=archived.last_decay_at + DAY) == 1
    assert faded.get_facts(user, [restated.id])[0].strength == pytest.approx(archived.strength + 0.3, rel=1e-12)


def test_facts_stored_before_read_time_decay_are_given_their_due_by_the_migration(faded: GraphStore, user: str) -> None:
    old = _say(faded, user, [(0.05, 0), (1.0, 0)])
    _forget_dues(faded, user)
    assert user not in faded.users_due(at(20))

    _migrate(faded)

    assert user in faded.users_due(at(20))
    assert faded.decay(user, now=at(20), batch=10) == (1, 1)
    weak, strong = list(old)
    assert {f.id: f.archived for f in faded.get_facts(user, list(old))} == {weak: True, strong: False}


# A faster fade than the stored dues were computed with: a fact at 1.0 crosses in ~17.5 days, not ~43.7.
FASTER = Fading(0.8, 0.02)


def test_a_faster_fade_set_after_the_facts_were_written_archives_them_when_the_new_policy_says(
    faded: GraphStore, user: str
) -> None:
    faded.refresh_dues(batch=100)  # the dues' policy recorded: (PER_DAY, THRESHOLD)
    old = _say(faded, user, [(1.0, 0), (0.6, 1.5), (0.3, 3), (0.9, 5.25), (0.05, 2)])
    first_day = {
        fade: {fid: next(d for d in range(1, 80) if fade.faded(s.strength, s.since, _run(d))) for fid, s in old.items()}
        for fade in (faded.fading, FASTER)
    }
    assert all(first_day[FASTER][fid] < first_day[faded.fading][fid] for fid in old)  # their old due: too late

    faded.fading = FASTER  # the settings changed: ENGRAM_DECAY_PER_DAY=0.8, ENGRAM_ARCHIVE_THRESHOLD=0.02
    settings = Settings(decay_per_day=FASTER.per_day, archive_threshold=FASTER.threshold)
    archived_on: dict[str, int] = {}
    for day in range(1, 45):
        due = decay_users(faded, settings, _run(day))  # the job's driver: recomputes on its first run
        if day == 1:
            assert _dues(faded, user) == _fresh_dues(faded, user, FASTER)
        expected = {fid for fid, d in first_day[FASTER].items() if d == day}
        assert (user in due) == bool(expected), day
        assert faded.decay(user, now=_run(day), batch=3) == (len(expected), len(expected)), day
        for fact in faded.get_facts(user, list(expected)):  # with the strength the closed form gives
            s = old[fact.id]
            assert fact.archived and fact.strength == pytest.approx(FASTER.strength_at(s.strength, s.since, _run(day)))
        archived_on.update(dict.fromkeys(expected, day))
    assert archived_on == first_day[FASTER]
    assert faded.refresh_dues(batch=100) == 0  # recorded: later runs read one row


def test_a_recompute_that_died_midway_is_finished_by_the_next_run(faded: GraphStore, user: str) -> None:
    faded.refresh_dues(batch=100)
    old = _say(faded, user, [(1.0, 0), (0.6, 1), (0.3, 2), (0.8, 3)])
    before = faded.fading
    faded.fading = FASTER

    assert len(faded._redue_batch("", 1)) == 1  # a run's first batch of one fact, then the run dies
    assert faded._recorded_fading() == before  # not recorded: the next run starts again
    stale = _fresh_dues(faded, user, FASTER).items() - _dues(faded, user).items()
    assert len(stale) >= len(old) - 1  # a mix of old and new dues is left

    assert faded.refresh_dues(batch=2) >= len(old)  # the next run: every fact again, in batches of 2
    assert faded._recorded_fading() == FASTER
    assert _dues(faded, user) == _fresh_dues(faded, user, FASTER)
    assert faded.refresh_dues(batch=2) == 0


def _run(day: int) -> datetime:
    return at(day) + timedelta(hours=3)


def _fresh_dues(store: GraphStore, user: str, fade: Fading) -> dict[str, datetime | None]:
    """What a fresh computation gives each of the user's unarchived facts."""
    facts = store.get_facts(user, list(_dues(store, user)))
    return {f.id: fade.due(f.strength, f.last_decay_at or f.created_at) for f in facts}


def _dues(store: GraphStore, user: str) -> dict[str, datetime | None]:
    """The stored archive_due_at of the user's unarchived facts."""
    from engram_api.storage.graph.neo4j.connection import Neo4jConnection
    from engram_api.storage.graph.sqlite import rows as db
    from engram_api.storage.graph.sqlite.connection import SqliteConnection

    if isinstance(store, SqliteConnection):
        rows = store._conn().execute("SELECT id, archive_due_at FROM facts WHERE user_id = ? AND archived = 0", (user,))
        return {r["id"]: db.from_us_opt(r["archive_due_at"]) for r in rows}
    assert isinstance(store, Neo4jConnection)
    with store._get_driver().session(database=store._database) as session:
        result = session.run(
            "MATCH (f:Fact {user_id: $user_id}) WHERE f.archived = false RETURN f.id AS id, f.archive_due_at AS due",
            user_id=user,
        )
        return {r["id"]: None if r["due"] is None else r["due"].to_native().astimezone(UTC) for r in result}


def _forget_dues(store: GraphStore, user: str) -> None:
    """What a store written by the code before read-time decay holds: no archive_due_at."""
    from engram_api.storage.graph.neo4j.connection import Neo4jConnection
    from engram_api.storage.graph.sqlite.connection import SqliteConnection

    if isinstance(store, SqliteConnection):
        with store._write() as conn:
            conn.execute("UPDATE facts SET archive_due_at = NULL WHERE user_id = ?", (user,))
        return
    assert isinstance(store, Neo4jConnection)
    with store._get_driver().session(database=store._database) as session:
        session.run("MATCH (f:Fact {user_id: $user_id}) SET f.archive_due_at = null", user_id=user).consume()


def _migrate(store: GraphStore) -> None:
    from engram_api.storage.graph.neo4j.connection import Neo4jConnection

    if isinstance(store, Neo4jConnection):
        # `engram migrate` on a database of the version before (the session's shared one: put straight back)
        with store._get_driver().session(database=store._database) as session:
            session.run("MATCH (s:EngramSchema {name: 'engram'}) SET s.version = 1").consume()
        assert store.migrate() == (1, 2)
    else:
        store.ensure_schema()  # the embedded store migrates itself when opened
