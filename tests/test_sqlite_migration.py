"""An SQLite file written before a column existed gains it on open, and what it stores keeps working:
the users' epoch (a lifetime) and the change marks a reader's snapshot refresh reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from tests.support.factories import at, make_entity, make_fact, new_user, plan


def _as_an_older_release_left_it(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(
        """DROP INDEX ix_facts_user_changed; DROP INDEX ix_chunks_user_changed;
           ALTER TABLE facts DROP COLUMN changed; ALTER TABLE chunks DROP COLUMN changed;
           ALTER TABLE users DROP COLUMN removed; ALTER TABLE users DROP COLUMN epoch;"""
    )
    conn.close()


def test_a_file_from_before_the_change_marks_gains_them_and_its_snapshots_refresh(tmp_path: Path) -> None:
    path = tmp_path / "graph.sqlite3"
    user = new_user()
    me, paris = make_entity(user, "Me"), make_entity(user, "Paris")
    old = SqliteGraphStore(path=path)
    old.ensure_schema()
    old.apply(plan(user, "m1", at(1), entities=[me, paris], facts=[make_fact(user, me, "VISITED", paris)]))
    old.close()
    _as_an_older_release_left_it(path)

    graph = SqliteGraphStore(path=path)
    try:
        graph.ensure_schema()
        columns = {
            table: {r[1] for r in graph._conn().execute(f"PRAGMA table_info({table})")}
            for table in ("users", "facts", "chunks")
        }
        assert {"epoch", "removed"} <= columns["users"] and "changed" in columns["facts"] & columns["chunks"]
        held = graph.snapshot(user, max_records=100)
        assert held is not None and held.stamp.epoch == 0 and held.size == 1  # a user from before epochs
        graph.apply(plan(user, "m2", at(2), facts=[make_fact(user, paris, "IS_IN", None)]))
        refreshed = graph.refresh_snapshot(held, max_records=100)
        whole = graph.snapshot(user, max_records=100)
        assert refreshed is not None and whole is not None and refreshed.stamp == whole.stamp
        assert dict(refreshed.facts) == dict(whole.facts) and len(refreshed.facts) == 2
    finally:
        graph.close()
