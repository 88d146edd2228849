"""Reads that must not grow with a user's size (issue 14): the graph step's early cut and the keyword
search's common terms, on the real stores.

The contract suite (tests/contract/test_graph_step.py) pins what the graph step answers; these tests pin
how much it reads: an entity with many facts is read only as far as its ``per_seed`` nearest, and a term
in most of a user's facts does not make SQLite score every fact, with the same answer either way.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from engram_api.models import utcnow
from engram_api.naming import normalize_name
from engram_api.settings import Settings
from engram_api.storage import GraphStepQuery, open_graph_store
from engram_api.storage.graph.episodes import user_key
from engram_api.storage.graph.sqlite import episodes as episodes_sql
from engram_api.storage.graph.sqlite.rows import to_us
from tests.support.builders import UserGraph, new_user

PER_SEED = 5


def _operators(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("children", ()):
        yield from _operators(child)


def test_on_neo4j_a_seed_with_many_facts_is_read_only_as_far_as_its_nearest(neo4j_uri, tmp_path) -> None:
    graph = open_graph_store(Settings(neo4j_uri=neo4j_uri, data_dir=tmp_path))
    user = new_user()
    try:
        graph.ensure_schema()
        people = UserGraph(graph, user)
        people.say([("Ann", "MET", f"P{i}", f"Ann met P{i}") for i in range(40)])
        people.say([(f"Q{i}", "KNOWS", "Ann", f"Q{i} knows Ann") for i in range(40)])
        ann = people.entities[normalize_name("Ann")].id
        query = GraphStepQuery(seeds=[ann], max_hops=2, limit=50, per_seed=PER_SEED)
        step = graph.graph_step(user, query)
        assert [hops for _, hops in step.hops] == [0] * PER_SEED  # enough at hop 0: never walked further

        cypher, params = graph.graph_step_statement(user, query)  # type: ignore[attr-defined]
        with graph._get_driver().session() as session:  # type: ignore[attr-defined]
            profile = session.run("PROFILE " + cypher, params).consume().profile
        seeks = [
            op
            for op in _operators(profile)
            if op["operatorType"].startswith("NodeIndexSeek") and "importance, id" in op["args"]["Details"]
        ]
        # Both of Ann's sides (subject of 40 facts, object of 40) are read in index order and cut at the cap.
        assert len(seeks) == 2, [op["args"]["Details"] for op in seeks]
        assert all(op["rows"] <= PER_SEED for op in seeks), [op["rows"] for op in seeks]
    finally:
        graph.forget_user(user)
        graph.close()


def test_on_sqlite_a_term_in_most_facts_is_left_out_of_the_first_keyword_query(tmp_path) -> None:
    graph = open_graph_store(Settings(data_dir=tmp_path))
    user = new_user()
    try:
        graph.ensure_schema()
        people = UserGraph(graph, user)
        people.say([("User", "LIKES", f"Thing{i}", f"User likes thing number {i}") for i in range(60)])
        people.say([("User", "VISITED", "Paris", f"User visited Paris in year {2000 + i}") for i in range(8)])
    finally:
        graph.close()

    conn = sqlite3.connect(tmp_path / "graph.sqlite3")
    conn.row_factory = sqlite3.Row
    episodes_sql.register_functions(conn)
    assert episodes_sql._informative(conn, "facts", ["user", "paris"]) == ["paris"]  # in 68 of 68 facts
    assert episodes_sql._informative(conn, "facts", ["user"]) == ["user"]  # never no term at all

    now = to_us(utcnow())  # facts current now (``validity``)

    def full_query(k: int) -> list[tuple[str, float]]:
        match = f'ukey : {user_key(user)} AND (body : "user" OR body : "paris")'
        params = {"user_id": user, "match": match, "k": k, "as_of": None, "since": None, "until": None, "at": now}
        rows = conn.execute(episodes_sql._KEYWORD["facts"], params).fetchall()
        return [(r["node_id"], r["score"]) for r in rows]

    for k in (5, 20):  # 8 facts say "paris": 5 come from the cut query, 20 need the full one
        got = episodes_sql.keyword_search(conn, user, ["user", "paris"], k, as_of=None, since=None, until=None, at=now)
        want = sorted(full_query(k), key=lambda row: (-row[1], row[0]))
        assert [h.node_id for h in got] == [node_id for node_id, _ in want]
        assert all(abs(h.score - score) < 1e-5 for h, (_, score) in zip(got, want, strict=True))
    conn.close()
