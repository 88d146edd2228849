"""A snapshot's keyword search (``UserSnapshot.keyword_search``, an in-memory BM25 index) against the
store's full-text index (``GraphStore.keyword_search``), on every backend.

The oracle is the store: for every query and recall window, the snapshot finds exactly the documents the
store finds (the user's chunks in the window and facts valid at ``as_of`` holding any form of a query
word), none of another user's, and a snapshot refreshed after writes answers exactly as a whole load. The
scores differ by design (the snapshot's statistics are the user's own; the stores' span every user's
rows: ``engram_api.storage.snapshot.keywords``), so where the two orders are compared it is on documents whose
order no statistic can change.
"""

from __future__ import annotations

from datetime import datetime

from engram_api.models import ChatMessage, Envelope
from engram_api.storage import GraphStore
from engram_api.storage.graph.episodes import chunk_envelope, keyword_terms
from engram_api.storage.graph.fading import Fading
from engram_api.storage.snapshot.graph import UserSnapshot
from tests.support.factories import at, make_entity, make_fact, plan, supersede, vec
from tests.support.graph_world import FAR, WINDOWS

TURNS = [
    ("Caroline", "I went to the LGBTQ support group yesterday, it was so powerful."),
    ("Melanie", "I have been painting sunsets by the lake all summer."),
    ("Caroline", "Researching adoption agencies is my next step."),
    ("Melanie", "My kids love running along the beach; the running club meets on Sundays."),
    ("Caroline", "The library had a talk on counseling careers."),
    ("Melanie", "She painted a horse and sold the paintings at the fair."),
]
QUERIES = [
    "support groups",
    "paint",
    "adoption agency",
    "runs on the beach",
    "libraries and counselors",
    "Caroline",
    "Melanie horse paintings",
    "Tampa",
    "Austin bakery",
    "nothing matches zeppelin",
]


def _say(store: GraphStore, user: str, mid: str, speaker: str, text: str, when: datetime, **planned: object) -> None:
    envelope = Envelope(
        user_id=user, message_id=mid, messages=[ChatMessage(content=text, name=speaker)], timestamp=when
    )
    chunks = [c.model_copy(update={"embedding": vec(c.id)}) for c in chunk_envelope(envelope)]
    store.apply(plan(user, mid, when, **planned).model_copy(update={"chunks": chunks}))  # type: ignore[arg-type]


def _conversation(store: GraphStore, user: str) -> None:
    """Six named turns on days 20-30, facts with a slot superseded twice (Tampa, then Austin, then Denver)
    and an archived one."""
    store.fading = Fading(0.5, 0.01)
    me, bakery = make_entity(user, "Caroline"), make_entity(user, "Sunrise bakery")
    cities = [make_entity(user, name) for name in ("Tampa", "Austin", "Denver")]
    lives = [
        make_fact(user, me, "LIVES_IN", city, statement=f"Caroline lives in {city.name}", valid_from=at(20 + 4 * i),
                  single_valued=True)
        for i, city in enumerate(cities)
    ]  # fmt: skip
    works = make_fact(user, me, "WORKS_AT", bakery, statement="Caroline works at the Sunrise bakery in Austin",
                      valid_from=at(24))  # fmt: skip
    paints = make_fact(user, me, "LIKES", statement="Caroline likes painting horses", valid_from=at(21))
    old = make_fact(user, me, "USED_TO", statement="Caroline used to run marathons", valid_from=at(0))
    store.apply(plan(user, "old", at(0), entities=[me], facts=[old]))
    assert store.decay(user, now=at(19), batch=100)[1] == 1
    for i, (speaker, text) in enumerate(TURNS):
        when = at(20 + 2 * i)
        planned: dict[str, object] = {}
        if i == 0:
            planned = {"entities": [bakery, *cities], "facts": [lives[0], paints]}
        elif i == 2:
            planned = {"facts": [lives[1], works], "fact_changes": [supersede(lives[0], lives[1])]}
        elif i == 4:
            planned = {"facts": [lives[2]], "fact_changes": [supersede(lives[1], lives[2])]}
        _say(store, user, f"t{i}", speaker, text, when, **planned)


def _found(hits: list) -> set[tuple[str, str]]:
    return {(h.node_id, h.kind) for h in hits}


def test_a_snapshot_finds_what_the_store_finds_for_every_query_and_window(
    graph_store: GraphStore, user: str, other_user: str
) -> None:
    _conversation(graph_store, user)
    _conversation(graph_store, other_user)  # the same words: another user's rows are never found
    _say(graph_store, other_user, "x", "Melanie", "Paint paint paint the support groups of Tampa.", at(22))
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None
    theirs = set(graph_store.snapshot(other_user, max_records=FAR).facts) | {"x"}  # type: ignore[union-attr]
    some = 0
    for query in QUERIES:
        terms = keyword_terms(query)
        for window in WINDOWS:
            want = graph_store.keyword_search(user, terms, FAR, **window)
            got = snapshot.keyword_search(terms, FAR, **window)
            assert _found(got) == _found(want), (query, window)
            assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
            assert not {h.node_id for h in got} & theirs
            some += bool(got)
    assert some > len(QUERIES)  # most queries find something in most windows

    # Facts: only those valid at as_of (current when None), never the archived one.
    current = {h.node_id for h in snapshot.keyword_search(keyword_terms("Caroline"), FAR) if h.kind == "fact"}
    assert {snapshot.facts[i].statement for i in current} == {
        "Caroline lives in Denver", "Caroline works at the Sunrise bakery in Austin", "Caroline likes painting horses",
    }  # fmt: skip
    then = snapshot.keyword_search(keyword_terms("lives"), FAR, as_of=at(25))
    assert [snapshot.facts[h.node_id].statement for h in then] == ["Caroline lives in Austin"]


def test_the_best_hit_is_the_stores_where_no_statistic_can_change_it(graph_store: GraphStore, user: str) -> None:
    _conversation(graph_store, user)
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None
    for query, top in [("adoption agencies", "t2"), ("sunsets by the lake", "t1"), ("counseling library talk", "t4")]:
        terms = keyword_terms(query)
        want = graph_store.keyword_search(user, terms, 3)
        got = snapshot.keyword_search(terms, 3)
        assert want[0].node_id == got[0].node_id
        assert snapshot.chunks[got[0].node_id].episode_id == top


def _same_answers(refreshed: UserSnapshot, whole: UserSnapshot) -> None:
    for query in QUERIES:
        for window in WINDOWS:
            terms = keyword_terms(query)
            assert refreshed.keyword_search(terms, 4, **window) == whole.keyword_search(terms, 4, **window)


def test_a_refreshed_snapshot_searches_as_a_whole_load_does(graph_store: GraphStore, user: str) -> None:
    _conversation(graph_store, user)
    held = graph_store.snapshot(user, max_records=FAR)
    assert held is not None
    denver = next(f for f in held.facts.values() if f.statement == "Caroline lives in Denver")
    (me,) = graph_store.get_entities(user, [denver.subject_id])
    boston = make_entity(user, "Boston")
    moved = make_fact(user, me, "LIVES_IN", boston, statement="Caroline lives in Boston", valid_from=at(40),
                      single_valued=True)  # fmt: skip
    _say(graph_store, user, "t9", "Caroline", "We moved to Boston; I miss painting in Denver.", at(40),
         entities=[boston], facts=[moved], fact_changes=[supersede(denver, moved)])  # fmt: skip
    refreshed = graph_store.refresh_snapshot(held, max_records=FAR)
    whole = graph_store.snapshot(user, max_records=FAR)
    assert refreshed is not None and whole is not None and refreshed.stamp == whole.stamp > held.stamp
    _same_answers(refreshed, whole)
    lives = refreshed.keyword_search(keyword_terms("lives Denver"), FAR)
    assert "Caroline lives in Boston" in {refreshed.facts[h.node_id].statement for h in lives if h.kind == "fact"}
    assert "Caroline lives in Denver" not in {refreshed.facts[h.node_id].statement for h in lives if h.kind == "fact"}
    assert held.keyword_search(keyword_terms("Boston"), FAR) == []  # the held one is left as it was
