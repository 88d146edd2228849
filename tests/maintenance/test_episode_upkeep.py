"""Episodes in maintenance: reconcile backfills chunks of messages applied before hybrid memory existed,
and decay takes old episode chunks out of recall only when ``decay_episodes`` is on."""

from __future__ import annotations

from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import get_embedder
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.episodes import chunk_episode
from engram_workers.maintenance import run_decay
from engram_workers.maintenance.reconcile import BackfillUser, reconcile
from tests.support.builders import GuardSpy, UserGraph, at

EMBEDDER = get_embedder("all-MiniLM-L6-v2")  # the packaged model: vectors and token states from one pass
GUITAR = [("Alex", "PLAYS", "guitar", "Alex plays the theremin and guitar")]
DELL = [("Alex", "WORKS_AT", "Dell", "Alex works at Dell")]
AUSTIN = [("Alex", "LIVES_IN", "Austin", "Alex lives in Austin")]


def _index_matches_graph(store: GraphStore, keeper: IndexKeeper, user: str) -> set[str]:
    items, version = store.vectors(user)
    index = keeper.vectors.load(user)
    assert index is not None and index.version == version
    assert index.node_ids() == {item.node_id for item in items}
    return index.node_ids()


def test_reconcile_backfills_chunks_of_episodes_that_have_none(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    memory = UserGraph(store, user)
    memory.say(GUITAR, when=at(1))  # applied before hybrid memory: no chunks
    memory.say(DELL, when=at(2))
    memory.say(AUSTIN, when=at(3), chunked=True)  # already has its chunk
    keeper.rebuild(user)
    assert store.stats(user).episode_chunks == 1
    assert not [h for h in store.keyword_search(user, ["theremin"], 5) if h.kind == "episode"]

    report = reconcile(graph=graph, keeper=keeper, guard=guard, user_ids=[user], embedder=EMBEDDER)

    assert not report.failed and report.ok == 1
    assert report.backfilled == [BackfillUser(user_id=user, episodes=2, chunks=2)]
    episodes = {e.id: e for e in store.episodes(user)}
    chunks = store.get_chunks(user, episode_ids=list(episodes))
    assert len(chunks) == 3 and store.stats(user).episode_chunks == 3
    # The same derived ids and text the stored message gives, by meaning (index) and by a rare keyword.
    expected = {c.id for e in episodes.values() for c in chunk_episode(e)}
    assert {c.id for c in chunks} == expected
    hits = [h.node_id for h in store.keyword_search(user, ["theremin"], 5) if h.kind == "episode"]
    guitar_chunk = next(c for c in chunks if "theremin" in c.text)
    assert hits == [guitar_chunk.id] and guitar_chunk.event_time == at(1)
    assert expected <= _index_matches_graph(store, keeper, user)
    # With their token states, as apply stores them (late interaction, the recall's default, reads them).
    backfilled = expected - {c.id for c in chunks if "Austin" in c.text}
    index = keeper.vectors.load(user)
    assert index is not None and set(index.states_for(backfilled)) == backfilled
    assert guard.entered == [user]

    again = reconcile(graph=graph, keeper=keeper, guard=guard, user_ids=[user], embedder=EMBEDDER)
    assert (again.ok, again.rebuilt, again.backfilled) == (1, 0, [])
    # Without an embedder reconcile only checks indexes (as before).
    plain = UserGraph(store, user)
    plain.say(GUITAR, when=at(4))
    keeper.rebuild(user)
    assert reconcile(graph=graph, keeper=keeper, guard=guard, user_ids=[user]).backfilled == []


def test_episodes_never_decay_by_default(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    UserGraph(store, user).say(GUITAR, when=at(0), chunked=True)
    keeper.rebuild(user)
    assert Settings().decay_episodes is False

    report = run_decay(graph=graph, settings=Settings(), guard=guard, now=at(1000), user_ids=[user])

    assert not report.failed and report.episode_chunks_removed == 0
    assert store.stats(user).episode_chunks == 1
    assert [h.kind for h in store.keyword_search(user, ["theremin"], 5)].count("episode") == 1
    _index_matches_graph(store, keeper, user)


def test_decay_episodes_removes_old_chunks_from_recall_and_backfill_leaves_them_out(
    store: GraphStore, graph: GraphStore, keeper: IndexKeeper, guard: GuardSpy, user: str
) -> None:
    settings = Settings(decay_episodes=True, episode_max_age_days=30)
    memory = UserGraph(store, user)
    memory.say(GUITAR, when=at(0), chunked=True)  # 400 days old at the run: leaves recall
    memory.say(DELL, when=at(380), chunked=True)  # 20 days old: stays
    keeper.rebuild(user)
    before = {c.id: c for c in store.get_chunks(user, episode_ids=[e.id for e in store.episodes(user)])}
    old = [cid for cid, c in before.items() if c.event_time == at(0)]

    report = run_decay(graph=graph, settings=settings, guard=guard, now=at(400), user_ids=[user])

    assert not report.failed and report.episode_chunks_removed == 1
    assert report.per_user[0].episode_chunks_removed == 1
    assert len(store.episodes(user)) == 2  # the episode stays as provenance
    assert store.stats(user).episode_chunks == 1
    assert not [h for h in store.keyword_search(user, ["theremin"], 5) if h.kind == "episode"]
    assert [h.kind for h in store.keyword_search(user, ["dell"], 5)].count("episode") == 1
    node_ids = _index_matches_graph(store, keeper, user)
    assert not set(old) & node_ids and set(before) - set(old) <= node_ids

    again = run_decay(graph=graph, settings=settings, guard=guard, now=at(400), user_ids=[user])
    assert again.episode_chunks_removed == 0
    # Reconcile's backfill respects the same rule (the run's "now" is today, so both are old then: nothing).
    kept = reconcile(graph=graph, keeper=keeper, guard=guard, user_ids=[user], embedder=EMBEDDER, settings=settings)
    assert kept.backfilled == [] and store.stats(user).episode_chunks == 1
