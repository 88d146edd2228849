"""The FAISS delta log (issue 15): writes append instead of rewriting, crashes leave a readable index the
graph agrees with, compaction equals a full rewrite, and erased vectors never come back.

Real files, a real SQLite graph and real writer processes killed with SIGKILL; the states a kill can
leave (a torn record, a new base beside the old log) are also built byte for byte to test each one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engram_api.storage.faiss.files import UserIndex, VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.faiss.log import Delta, encode_record
from engram_api.storage.graph.sqlite.store import SqliteGraphStore
from engram_api.versions import Stamp
from tests.support.builders import DIM, new_user, random_encode
from tests.support.index_writer import vector_store

REPO = Path(__file__).resolve().parents[1]
EPOCH = 7


def _vec(name: str) -> list[float]:
    return random_encode([name])[0].tolist()


def _store(root: Path, **kwargs: float) -> VectorStore:
    return VectorStore(root=root, dim=DIM, **kwargs)  # type: ignore[arg-type]


def _write_history(store: VectorStore, user: str, steps: int, *, start: UserIndex | None = None) -> UserIndex:
    """``steps`` writes of two upserts each; every other one also removes an earlier node."""
    index = start or store.save(user, _at(store.new(), 1))
    for i in range(index.version + 1, index.version + 1 + steps):
        ups = [(f"n{i}a", "fact", _vec(f"n{i}a")), (f"n{i}b", "entity", _vec(f"n{i}b"))]
        index = store.append(user, index, to_stamp=Stamp(EPOCH, i), upserts=ups, removals=[f"n{i - 3}a"] * (i % 2))
    return index


def _at(index: UserIndex, version: int) -> UserIndex:
    index.stamp = Stamp(EPOCH, version)
    return index


def _same(a: UserIndex, b: UserIndex) -> None:
    assert a.stamp == b.stamp and a.node_ids() == b.node_ids()
    ids = sorted(a.node_ids())
    va, vb = a.vectors_for(ids), b.vectors_for(ids)
    assert all(np.array_equal(va[n], vb[n]) for n in ids)
    for q in random_encode(["q1", "q2", "q3"]):
        assert [(h.node_id, round(h.score, 5)) for h in a.search(q, 10)] == [
            (h.node_id, round(h.score, 5)) for h in b.search(q, 10)
        ]


def test_a_write_appends_one_record_and_leaves_the_index_file_alone(tmp_path: Path) -> None:
    store, user = _store(tmp_path), new_user()
    index = _write_history(store, user, 1)
    base = store.path_for(user)
    before = (base.stat().st_ino, base.read_bytes(), store.log_path_for(user).stat().st_size)
    index = _write_history(store, user, 5, start=index)
    assert (base.stat().st_ino, base.read_bytes()) == before[:2]
    assert store.log_path_for(user).stat().st_size > before[2]
    loaded = store.load(user)
    assert loaded is not None
    _same(loaded, index)


def test_a_torn_trailing_record_is_ignored_and_the_next_write_replaces_it(tmp_path: Path) -> None:
    store, user = _store(tmp_path), new_user()
    index = _write_history(store, user, 4)
    record = encode_record(
        Delta(Stamp(EPOCH, 5), Stamp(EPOCH, 6), (), (("torn", "fact"),), np.array([_vec("torn")], dtype=np.float32))
    )
    log = store.log_path_for(user)
    whole = log.read_bytes()
    for cut in (1, 11, 40, len(record) - 1):  # what a writer killed mid-append leaves
        log.write_bytes(whole + record[:cut])
        torn = store.load(user)
        assert torn is not None and torn.stamp == Stamp(EPOCH, 5) and "torn" not in torn.node_ids()
        _same(torn, index)
    damaged = bytearray(whole + record)
    damaged[-3] ^= 0xFF  # a whole-length record whose checksum fails reads as torn too
    log.write_bytes(bytes(damaged))
    assert store.file_stamp(user) == Stamp(EPOCH, 5)

    index = _write_history(store, user, 1, start=index)
    reread = store.load(user)
    assert reread is not None and reread.stamp == Stamp(EPOCH, 6) and "torn" not in reread.node_ids()
    _same(reread, index)


def test_a_crash_between_the_new_base_and_the_new_log_reads_the_new_base_whole(tmp_path: Path) -> None:
    store, user = _store(tmp_path), new_user()
    index = _write_history(store, user, 6)
    old_log = store.log_path_for(user).read_bytes()
    store.save(user, index)
    store.log_path_for(user).write_bytes(old_log)  # the old log is still there: its token no longer matches
    loaded = store.load(user)
    assert loaded is not None and loaded.log_end == 0
    _same(loaded, index)
    index = _write_history(store, user, 2, start=loaded)  # the next write writes the pair anew
    reread = store.load(user)
    assert reread is not None and reread.log_end > 0
    _same(reread, index)


def test_compaction_equals_the_full_rewrite(tmp_path: Path) -> None:
    user = new_user()
    appended = _write_history(_store(tmp_path / "a", compact_min_bytes=1 << 40), user, 30)
    compacting = _store(tmp_path / "b", compact_min_bytes=0, compact_ratio=0.3)
    compacted = _write_history(compacting, user, 30)
    full = _store(tmp_path / "c")  # today's way: change the whole index in memory, rewrite the file each time
    rewritten = _at(full.new(), 1)
    for i in range(2, 32):
        rewritten.remove([f"n{i - 3}a"] * (i % 2))
        rewritten.upsert([(f"n{i}a", "fact", _vec(f"n{i}a")), (f"n{i}b", "entity", _vec(f"n{i}b"))])
        rewritten = full.save(user, _at(rewritten, i))
    assert compacted.log_end < appended.log_end  # it did compact
    loaded = [s.load(user) for s in (_store(tmp_path / "a"), compacting, full)]
    assert all(x is not None for x in loaded)
    for other in [appended, compacted, *loaded]:
        _same(other, rewritten)  # type: ignore[arg-type]


def test_an_erased_vector_never_comes_back(tmp_path: Path) -> None:
    store, user = _store(tmp_path, compact_min_bytes=1 << 40), new_user()
    index = _write_history(store, user, 4)
    secret = _vec("secret")
    index = store.append(user, index, to_stamp=Stamp(EPOCH, 6), upserts=[("secret", "fact", secret)])
    index = store.save(user, index)  # the secret is in the base now
    index = store.append(user, index, to_stamp=Stamp(EPOCH, 7), removals=["secret"])
    whole = store.log_path_for(user).read_bytes()

    def gone() -> None:
        loaded = store.load(user)
        assert loaded is not None and "secret" not in loaded.node_ids()
        assert all(h.node_id != "secret" for h in loaded.search(np.array(secret, dtype=np.float32), 5))

    gone()
    store.log_path_for(user).write_bytes(whole + b"EGR1\x00\x01")  # a later writer killed mid-append
    gone()
    store.log_path_for(user).write_bytes(whole)
    compacted = store.save(user, store.load(user))  # type: ignore[arg-type]
    assert np.array(secret, dtype=np.float32).tobytes() not in store.path_for(user).read_bytes()
    gone()
    store.log_path_for(user).write_bytes(whole)  # killed between the two renames: the old log beside the new base
    gone()
    _write_history(store, user, 3, start=compacted)
    gone()


def test_a_reader_reads_only_the_records_another_writer_appended(tmp_path: Path) -> None:
    graph = SqliteGraphStore(path=tmp_path / "g.db")  # empty: a rebuild would answer no vectors at all
    graph.ensure_schema()
    writer, user = _store(tmp_path / "idx", compact_min_bytes=1 << 40), new_user()
    index = _write_history(writer, user, 4)
    reader = IndexKeeper(graph=graph, vectors=_store(tmp_path / "idx"))
    seen = reader.current(user, Stamp(EPOCH, 5))
    index = _write_history(writer, user, 2, start=index)
    caught_up = reader.current(user, Stamp(EPOCH, 7))
    _same(caught_up, index)
    assert caught_up.base is seen.base and seen.stamp == Stamp(EPOCH, 5)  # a copy moved on; the base is shared
    index = _write_history(writer, user, 1, start=writer.save(user, index))  # compacted, then one more record
    _same(reader.current(user, Stamp(EPOCH, 8)), index)
    assert reader.rebuilds == 0
    graph.close()


def _graph_ids(graph: SqliteGraphStore, user: str) -> tuple[set[str], Stamp]:
    items, stamp = graph.stamped_vectors(user)
    return {i.node_id for i in items}, stamp


@pytest.mark.parametrize("writes_before_kill", [1, 3, 6, 10, 15])
def test_a_writer_killed_at_any_point_leaves_an_index_the_graph_agrees_with(
    tmp_path: Path, writes_before_kill: int
) -> None:
    db, root, user = tmp_path / "g.db", tmp_path / "indexes", new_user()
    graph = SqliteGraphStore(path=db)
    graph.ensure_schema()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for run in range(3):  # each run also recovers from the previous run's kill
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.support.index_writer", str(db), str(root), user],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        for _ in range(writes_before_kill + run):
            assert writer.stdout.readline(), "the writer died on its own"
        writer.send_signal(signal.SIGKILL)  # somewhere in a graph write, a log append or a compaction
        writer.wait()

        stored = vector_store(root).load(user)
        ids, stamp = _graph_ids(graph, user)
        assert stored is not None, "the index must stay readable"
        assert stored.epoch == stamp.epoch and stored.version <= stamp.version
        if stored.version == stamp.version:
            assert stored.node_ids() == ids
        keeper = IndexKeeper(graph=graph, vectors=vector_store(root))
        assert keeper.current(user, stamp).node_ids() == ids
        # A file behind the graph (the kill came between a graph commit and its log record) is caught up by
        # version, never read whole again.
        assert (keeper.rebuilds, keeper.catchups) == (0, 0 if stored.version == stamp.version else 1)
    graph.close()
