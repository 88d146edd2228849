"""One "valid at" and "current" (``engram_api.storage.graph.validity``): the Python predicate, the SQL
fragment and the Cypher fragment select the same facts, and so do the paths built on them.

The same facts go into each backend (a real SQLite file, a real Neo4j): starts and ends on the instants
asked, a start after them, an end after now, an archived fact, a superseded one and a negated (``NOT_``)
one. At every instant and recall window the backend's fragment (SQL on SQLite, Cypher on Neo4j) run over
the user's facts must select exactly what ``validity.valid_at`` and ``validity.overlaps`` select, and the
store's keyword search, its graph step, a snapshot of the user and ``FactRecord.current_at`` must agree with
them; asking for the current state is asking at now.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest

from engram_api.models import EntityRecord, FactRecord, utcnow
from engram_api.storage import GraphStepQuery, GraphStore
from engram_api.storage.graph import validity
from engram_api.storage.graph.episodes import keyword_terms
from engram_api.storage.graph.neo4j import rows as neo4j_rows
from engram_api.storage.graph.neo4j.store import Neo4jGraphStore
from engram_api.storage.graph.sqlite import rows as sqlite_rows
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from tests.support.factories import at, make_entity, make_fact, plan

FAR = 10_000
LATER = timedelta(days=30)
# (since, until) recall windows; None leaves a side open.
WINDOWS = [(None, None), (at(5), None), (None, at(5)), (at(3), at(9))]


def build(store: GraphStore, user: str, now: datetime) -> dict[str, FactRecord]:
    """The edge cases by name, stored as given (one plan: apply writes validity and archival as the
    records say)."""
    me, paris, berlin, jazz = (make_entity(user, n) for n in ("Me", "Paris", "Berlin", "Jazz"))

    def fact(name: str, obj: EntityRecord, start: datetime, **fields: Any) -> FactRecord:
        predicate = name.split("#")[0]
        made = make_fact(user, me, predicate, obj, valid_from=start, statement=f"marker {name}")
        return made.model_copy(update=fields)

    moved = fact("LIVES_IN#berlin", berlin, at(5))
    facts = [
        fact("LIKES", jazz, at(1)),  # open from at(1) on
        fact("LIVES_IN#paris", paris, at(1), valid_until=at(5), superseded_by=moved.id),  # ends as `moved` starts
        moved,
        fact("VISITED", paris, at(1), archived=True),  # archived: never valid
        fact("PLANS_LIVES_IN", paris, at(10)),  # stated at 2 about 10: starts after it was said
        fact("NOT_LIKES", jazz, at(3), valid_until=at(8)),  # a negation: an ordinary interval
        fact("WORKS_AT", berlin, now + LATER),  # starts after now: not current yet
        fact("STUDIES", jazz, at(0), valid_until=now + LATER),  # closed after now: still current
    ]
    store.apply(plan(user, "m1", at(2), entities=[me, paris, berlin, jazz], facts=facts))
    return {f.statement.removeprefix("marker "): f for f in facts}


def by_fragment(
    store: GraphStore, user: str, when: datetime, since: datetime | None, until: datetime | None
) -> set[str]:
    """The user's facts the backend's own fragments select (SQL on SQLite, Cypher on Neo4j)."""
    if isinstance(store, SqliteGraphStore):
        us = sqlite_rows.to_us_opt
        query = f"SELECT f.id FROM facts f WHERE f.user_id = :user_id AND {validity.VALID_AT_SQL} AND {validity.OVERLAPS_SQL}"  # fmt: skip
        params = {"user_id": user, "at": sqlite_rows.to_us(when), "since": us(since), "until": us(until)}
        return {r["id"] for r in store._conn().execute(query, params)}
    assert isinstance(store, Neo4jGraphStore)
    cypher = (
        f"MATCH (f:Fact {{user_id: $user_id}}) WHERE {validity.valid_at_cypher('f')} AND {validity.overlaps_cypher('f')}"
        " RETURN f.id AS id"
    )
    opt = neo4j_rows.opt_utc
    params = {"user_id": user, "at": neo4j_rows.utc(when), "since": opt(since), "until": opt(until)}
    return {r["id"] for r in store._read_one(cypher, params)}


def by_predicate(facts: list[FactRecord], when: datetime, since: datetime | None, until: datetime | None) -> set[str]:
    return {
        f.id
        for f in facts
        if validity.valid_at(f.valid_from, f.valid_until, f.archived, when)
        and validity.overlaps(f.valid_from, f.valid_until, since, until)
    }


def test_the_python_sql_and_cypher_forms_select_the_same_facts(graph_store: GraphStore, user: str) -> None:
    now = utcnow()
    facts = build(graph_store, user, now)
    stored = graph_store.page(user, 1, FAR).facts
    assert {f.id: (f.valid_from, f.valid_until, f.archived) for f in stored} == {
        f.id: (f.valid_from, f.valid_until, f.archived) for f in facts.values()
    }  # the cases went in as built
    instants = [at(0), at(1), at(4), at(5), at(8), at(10), now]
    seen: set[frozenset[str]] = set()
    for when in instants:
        for since, until in WINDOWS:
            want = by_predicate(stored, when, since, until)
            assert by_fragment(graph_store, user, when, since, until) == want, (when, since, until)
            seen.add(frozenset(want))
    assert len(seen) >= 8  # the instants and windows tell the cases apart
    ids = {name: f.id for name, f in facts.items()}
    # Edge cases, decided once: the start is in, the end is out; archived never; a start after the instant
    # is not yet valid; the current state is the state at now.
    assert by_predicate(stored, at(5), None, None) & {ids["LIVES_IN#paris"], ids["LIVES_IN#berlin"]} == {
        ids["LIVES_IN#berlin"]
    }
    assert by_predicate(stored, at(4), None, None) == {
        ids[name] for name in ("LIKES", "LIVES_IN#paris", "NOT_LIKES", "STUDIES")
    }
    assert ids["PLANS_LIVES_IN"] in by_predicate(stored, at(10), None, None)
    current = by_predicate(stored, now, None, None)
    assert ids["STUDIES"] in current and ids["WORKS_AT"] not in current and ids["VISITED"] not in current


@pytest.mark.parametrize("as_of", [None, at(1), at(4), at(5), at(8), at(10)])
def test_recall_paths_keep_the_facts_valid_at_the_instant(graph_store: GraphStore, user: str, as_of: datetime | None) -> None:  # fmt: skip
    """Keyword search, the graph step (store and snapshot) and ``current_at`` use the one definition."""
    facts = build(graph_store, user, utcnow())
    snapshot = graph_store.snapshot(user, max_records=FAR)
    assert snapshot is not None
    stored = graph_store.page(user, 1, FAR).facts
    query = GraphStepQuery(seeds=[facts["LIKES"].subject_id], as_of=as_of, max_hops=0, limit=FAR, per_seed=FAR)
    want = by_predicate(stored, query.at, None, None)
    assert {f.id for f in stored if f.current_at(as_of)} == want
    words = keyword_terms("marker")
    for search in (partial(graph_store.keyword_search, user), snapshot.keyword_search):
        assert {h.node_id for h in search(words, FAR, as_of=as_of) if h.kind == "fact"} == want
    assert {fid for fid, _ in graph_store.graph_step(user, query).hops} == want
    assert {fid for fid, _ in snapshot.graph_step(query).hops} == want
    if as_of is None:
        assert graph_store.stats(user).current_facts == len(want)
