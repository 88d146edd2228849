"""The maintenance fan-out on a real Redis: the changed set the writers keep, the drivers' to-do sets, and
which users the jobs' tasks visit (seen in the store: a visit rebuilds clusters or archives facts).

SQLite only: a first run takes in every stored user, and the Neo4j database is shared by every test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
import redis

from engram_api.keys import MAINTENANCE_CHANGED as CHANGED
from engram_api.keys import MAINTENANCE_SEQUENCE as SEQUENCE
from engram_api.keys import maintenance_seen as seen
from engram_api.keys import maintenance_todo as todo
from engram_api.models import FactRecord
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder, get_embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.fading import Fading
from engram_api.storage.writer.changes import FANNED_OUT
from engram_api.storage.writer.userwrite import UserWrite, UserWrites
from engram_workers.maintenance import decay_users, fanout, rebuild_hierarchy, reconcile, run_decay
from engram_workers.maintenance.fanout import Chunk, drive, release
from tests.support.builders import T0, GuardSpy, UserGraph, at, new_user

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

SETTINGS = Settings(decay_per_day=0.9, archive_threshold=0.3, maintenance_batch=2)
TOPICS = [
    ("Alex", "WORKS_AT", "Dell", "Alex works at Dell"),
    ("Alex", "PLAYS", "guitar", "Alex plays guitar"),
    ("Alex", "HAS_SISTER", "Maya", "Alex has a sister named Maya"),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return get_embedder("all-MiniLM-L6-v2")


@pytest.fixture
def writes(store: GraphStore, keeper: IndexKeeper, redis_client: redis.Redis) -> Iterator[UserWrites]:
    """Writers with Redis, as in the fleet; the fan-out's keys start empty (the Redis is the session's)."""
    redis_client.delete(CHANGED, SEQUENCE, *(k for job in FANNED_OUT for k in (todo(job), seen(job))))
    yield UserWrites(graph=store, keeper=keeper, redis_client=redis_client, lease_ttl_s=30)


@pytest.fixture
def small_tasks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(fanout, "USERS_PER_TASK", 3)
    return 3


@pytest.fixture
def guard(writes: UserWrites) -> GuardSpy:
    """The jobs' guard with Redis: their writes publish and mark as in the fleet."""
    return GuardSpy(writes)


Run = Callable[[Chunk], None]


@pytest.fixture
def run(store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, redis_client: redis.Redis, embedder: Embedder) -> Run:
    """One hierarchy task, as the worker runs it: the job on the task's users, then their release."""

    def task(chunk: Chunk) -> None:
        report = rebuild_hierarchy(
            graph=store, keeper=keeper, embedder=embedder, settings=SETTINGS, guard=guard, user_ids=chunk.user_ids
        )
        release(redis_client, chunk, report.failed)

    return task


def say(
    writes: UserWrites,
    store: GraphStore,
    user: str,
    facts: list[tuple[str, str, str | None, str]],
    when: datetime = T0,
) -> list[FactRecord]:
    """One message for ``user`` written as the apply stage writes it: a ``UserWrite`` that finishes."""

    def body(write: UserWrite) -> list[FactRecord]:
        memory = UserGraph(store, user)
        records = memory.say(facts, when=when)
        vectors = [(e.id, "entity", e.embedding or []) for e in memory.entities.values()]
        write.finish(upserts=[*vectors, *((f.id, "fact", f.embedding or []) for f in records)])
        return records

    return writes.run(user, body, wait=5)


def collect(into: list[Chunk]) -> fanout.Send:
    return into.append


def test_writes_mark_users_changed_in_order_and_erasure_forgets_them(
    store: GraphStore, writes: UserWrites, redis_client: redis.Redis
) -> None:
    first, second = new_user(), new_user()
    say(writes, store, first, TOPICS[:1])
    say(writes, store, second, TOPICS[:1])
    assert redis_client.zscore(CHANGED, first) < redis_client.zscore(CHANGED, second)
    say(writes, store, first, TOPICS[1:2])  # the last write counts: first moves behind second
    assert redis_client.zscore(CHANGED, first) > redis_client.zscore(CHANGED, second)

    # A write that commits nothing, and a maintenance write that asks not to be revisited, mark nothing.
    before = redis_client.zscore(CHANGED, second)
    writes.run(second, lambda w: w.finish(), wait=5)
    assert redis_client.zscore(CHANGED, second) == before

    redis_client.zadd(todo("hierarchy"), {first: 0})

    def erase(write: UserWrite) -> None:
        store.forget_user(first)
        write.finish()

    writes.run(first, erase, wait=5)
    assert redis_client.zscore(CHANGED, first) is None
    assert all(redis_client.zscore(todo(job), first) is None for job in FANNED_OUT)


def test_hierarchy_visits_only_the_users_written_since_its_last_run(
    store: GraphStore, writes: UserWrites, redis_client: redis.Redis, run: Run, small_tasks: int
) -> None:
    users = [new_user() for _ in range(8)]
    for user in users:
        say(writes, store, user, TOPICS)

    # First run: every stored user, in tasks of at most three users that never share a user.
    sent: list[Chunk] = []
    first = drive(job="hierarchy", client=redis_client, graph=store, send=collect(sent), claim_s=600)
    assert first.queued == len(users) and first.tasks == 3
    assert sorted(u for c in sent for u in c.user_ids) == sorted(users)
    assert all(len(c.user_ids) <= small_tasks for c in sent)
    for chunk in sent:
        run(chunk)
    assert all(store.clusters(u) for u in users) and redis_client.zcard(todo("hierarchy")) == 0

    # Behind the job's back (no UserWrite, so no mark) one idle user loses its clusters: a visit would
    # rebuild them. Two users get a new fact through the writers.
    idle, written = users[0], users[1:3]
    store.replace_clusters(idle, [])
    for user in written:
        say(writes, store, user, [("Alex", "LIVES_IN", "Austin", "Alex lives in Austin")])

    sent.clear()
    second = drive(job="hierarchy", client=redis_client, graph=store, send=collect(sent), claim_s=600)
    assert (second.taken_in, second.queued) == (2, 2)
    assert sorted(u for c in sent for u in c.user_ids) == sorted(written)
    for chunk in sent:
        run(chunk)
    assert store.clusters(idle) == []  # not visited
    for user in written:  # visited: the clusters cover the new fact, and only this user's facts
        members = {fid for c in store.clusters(user) for fid in c.member_fact_ids}
        facts = {f.id for f in store.get_facts(user, list(members))}
        assert len(members) == 4 and facts == members
    assert redis_client.zcard(todo("hierarchy")) == 0

    # Every job has taken the writes in: the changed set keeps none of them.
    drive(job="reconcile", client=redis_client, graph=store, send=collect([]), claim_s=600)
    drive(job="hierarchy", client=redis_client, graph=store, send=collect([]), claim_s=600)
    assert redis_client.zcard(CHANGED) == 0


def test_reconcile_visits_only_the_users_written_since_its_last_run(
    store: GraphStore, keeper: IndexKeeper, guard: GuardSpy, writes: UserWrites, redis_client: redis.Redis
) -> None:
    """Counted visits: after the first run (every stored user once), a run's tasks visit the users written
    since, and no other."""
    users = [new_user() for _ in range(12)]
    for user in users:
        say(writes, store, user, TOPICS)

    def visit() -> list[str]:
        sent: list[Chunk] = []
        drive(job="reconcile", client=redis_client, graph=store, send=collect(sent), claim_s=600)
        visited = []
        for chunk in sent:
            report = reconcile(graph=store, keeper=keeper, guard=guard, user_ids=chunk.user_ids, orphans=False)
            release(redis_client, chunk, report.failed)
            assert report.users == len(chunk.user_ids) and not report.failed
            visited += chunk.user_ids
        return sorted(visited)

    assert visit() == sorted(users)  # the first run: every stored user once
    written = users[3:5]
    for user in written:
        say(writes, store, user, [("Alex", "LIVES_IN", "Austin", "Alex lives in Austin")])
    assert visit() == sorted(written)
    assert visit() == []
    assert redis_client.zcard(todo("reconcile")) == 0


def test_a_task_that_dies_leaves_its_users_to_the_next_run(
    store: GraphStore, writes: UserWrites, redis_client: redis.Redis, run: Run, small_tasks: int
) -> None:
    users = [new_user() for _ in range(7)]
    for user in users:
        say(writes, store, user, TOPICS)

    sent: list[Chunk] = []
    drive(job="hierarchy", client=redis_client, graph=store, send=collect(sent), claim_s=600)
    done, *died = sent
    run(done)  # the other tasks die before they run
    undone = sorted(u for c in died for u in c.user_ids)
    assert all(not store.clusters(u) for u in undone)

    # While their claim stands, a run sends them to nobody else ...
    assert drive(job="hierarchy", client=redis_client, graph=store, send=collect([]), claim_s=600).queued == 0
    # ... and once it lapses, the next run sends exactly them.
    redis_client.zadd(todo("hierarchy"), dict.fromkeys(undone, 1))
    sent.clear()
    again = drive(job="hierarchy", client=redis_client, graph=store, send=collect(sent), claim_s=600)
    assert sorted(u for c in sent for u in c.user_ids) == undone and again.taken_in == 0
    for chunk in sent:
        run(chunk)
    assert all(store.clusters(u) for u in users) and redis_client.zcard(todo("hierarchy")) == 0

    # A user written while its task runs stays for the next run (the task's claim no longer stands).
    user = users[0]
    chunk = Chunk(job="hierarchy", user_ids=[user], claim=0)
    redis_client.zadd(todo("hierarchy"), {user: 5})  # claimed (deadline 5) by a task ...
    say(writes, store, user, [("Alex", "LIVES_IN", "Austin", "Alex lives in Austin")])
    drive(job="hierarchy", client=redis_client, graph=store, send=collect(sent := []), claim_s=600)
    assert [c.user_ids for c in sent] == [[user]]  # ... the write un-claimed it and the run re-sent it
    assert release(redis_client, chunk.model_copy(update={"claim": 5}), []) == 0


def test_decay_visits_only_the_users_with_a_fact_due(
    store: GraphStore, guard: GuardSpy, writes: UserWrites, redis_client: redis.Redis, small_tasks: int
) -> None:
    """Recall reads a fact's strength faded, so decay's driver takes in only the users with a fact due for
    archival (the due index): the visits are counted by the guard; the others are neither read nor
    written (their versions stay), and only an archival marks a user changed for the other jobs."""
    store.fading = Fading(SETTINGS.decay_per_day, SETTINGS.archive_threshold)
    due = [new_user() for _ in range(4)]
    quiet = [new_user() for _ in range(20)]
    for user in due:
        say(writes, store, user, TOPICS)  # 0.9 ** d < 0.3 after ~11.4 days: due at day 12
    for user in quiet:
        say(writes, store, user, TOPICS, when=at(10))  # due at ~day 21.4
    marks = {u: redis_client.zscore(CHANGED, u) for u in [*due, *quiet]}
    versions = {u: store.user_version(u) for u in quiet}

    sent: list[Chunk] = []
    todo_users = decay_users(store, SETTINGS, at(12))
    report = drive(job="decay", client=redis_client, graph=store, send=collect(sent), claim_s=600, due=todo_users)
    assert sorted(todo_users) == sorted(due) and (report.queued, report.tasks) == (4, 2)
    for chunk in sent:
        decayed = run_decay(graph=store, settings=SETTINGS, guard=guard, now=at(12), user_ids=chunk.user_ids)
        release(redis_client, chunk, decayed.failed)
        assert decayed.archived == len(TOPICS) * len(chunk.user_ids)

    assert sorted(guard.entered) == sorted(due)  # one visit per user due, none for the 20 others
    assert all(store.stats(u).archived_facts == len(TOPICS) for u in due)
    assert {u: store.user_version(u) for u in quiet} == versions
    assert all(redis_client.zscore(CHANGED, u) > marks[u] for u in due)
    assert {u: redis_client.zscore(CHANGED, u) for u in quiet} == {u: marks[u] for u in quiet}
    assert redis_client.zcard(todo("decay")) == 0
    again = drive(
        job="decay", client=redis_client, graph=store, send=collect(sent), claim_s=600,
        due=decay_users(store, SETTINGS, at(12)),
    )  # fmt: skip
    assert again.queued == 0  # all archived: nothing due any more
