"""Index kind by size (issue 14): flat up to ``index_flat_max`` vectors of a kind, IVF-SQ8 with exact
re-rank above, chosen at rebuild and compaction; its recall@10 against flat on the same vectors, and the
delta log working over both kinds. Recall is asserted, never time."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np

from engram_api.storage.faiss.files import UserIndex, VectorStore
from engram_api.versions import Stamp
from tests.support.builders import DIM

SEED = 15
N = 6_000


def clustered(n: int, seed: int = SEED) -> np.ndarray:
    """Unit vectors around 150 topics, as sentence embeddings of one user's conversations cluster."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((150, DIM)).astype(np.float32)
    x = topics[rng.integers(0, len(topics), n)] + 0.4 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _filled(store: VectorStore, vectors: np.ndarray, prefix: str = "f") -> UserIndex:
    index = store.new()
    index.upsert((f"{prefix}{i}", "fact", v) for i, v in enumerate(vectors))
    index.stamp = Stamp(1, 1)
    return index


def recall_at_10(index: UserIndex, exact: UserIndex, queries: np.ndarray) -> float:
    found = 0
    for q in queries:
        truth = {h.node_id for h in exact.search(q, 10)}
        found += len(truth & {h.node_id for h in index.search(q, 10)})
    return found / (10 * len(queries))


def test_ivf_above_the_threshold_keeps_recall_at_10_of_flat(tmp_path: Path) -> None:
    vectors = clustered(N)
    rng = np.random.default_rng(SEED + 1)
    queries = vectors[rng.integers(0, N, 200)] + 0.3 * rng.standard_normal((200, DIM)).astype(np.float32)
    flat_store = VectorStore(root=tmp_path / "flat", dim=DIM, flat_max=N)
    ivf_store = VectorStore(root=tmp_path / "ivf", dim=DIM, flat_max=N // 2)
    flat = flat_store.save("u", _filled(flat_store, vectors))
    ivf = ivf_store.save("u", _filled(ivf_store, vectors))
    assert (flat.kinds(), ivf.kinds()) == ({"fact": "flat"}, {"fact": "ivf-sq8"})
    assert recall_at_10(ivf, flat, queries) >= 0.98
    loaded = ivf_store.load("u")  # the kind and its search parameters survive the file
    assert loaded is not None and loaded.kinds() == {"fact": "ivf-sq8"}
    assert recall_at_10(loaded, flat, queries) >= 0.98
    # Exact vectors are kept under the quantised codes: compaction never compounds quantisation error.
    assert np.array_equal(loaded.vectors_for(["f17"])["f17"], vectors[17])


def test_deltas_work_over_an_ivf_base_and_compaction_rechooses_the_kind(tmp_path: Path) -> None:
    vectors = clustered(2_000)
    store = VectorStore(root=tmp_path, dim=DIM, flat_max=1_500, compact_min_bytes=1 << 40)
    index = store.save("u", _filled(store, vectors))
    assert index.kinds() == {"fact": "ivf-sq8"}
    fresh = clustered(3, seed=99)
    index = store.append(
        "u",
        index,
        to_stamp=Stamp(1, 2),
        upserts=[("new0", "fact", fresh[0]), ("f5", "fact", fresh[1])],
        removals=[f"f{i}" for i in range(10, 700)],
    )
    loaded = store.load("u")
    assert loaded is not None and loaded.stamp == Stamp(1, 2) and len(loaded) == 2_000 + 1 - 690
    for q, wanted in ((fresh[0], "new0"), (fresh[1], "f5")):
        assert loaded.search(q, 1)[0].node_id == wanted  # added and replaced rows are found
    removed = {f"f{i}" for i in range(10, 700)}
    for probe in (vectors[10], vectors[300]):  # removed rows still sit in the IVF base, masked
        hits = loaded.search(probe, 50)
        assert len(hits) == 50 and removed.isdisjoint({h.node_id for h in hits})
    assert np.array_equal(loaded.vectors_for(["f5"])["f5"], fresh[1])

    compacted = store.save("u", loaded)  # 1,311 rows now: under the threshold, so flat again
    assert compacted.kinds() == {"fact": "flat"} and compacted.node_ids() == loaded.node_ids()


def test_similarities_are_each_vectors_own_dot_product_to_the_bit(tmp_path: Path) -> None:
    """Recall scores candidates the vector search did not return by ``UserIndex.similarities``: one gather
    and one stacked product per layer and kind, which must equal ``float(np.dot(vector, query))`` for every
    node exactly (a matrix-vector product sums in another order and differs in the last bits), over an IVF
    base, its masked rows (absent) and the overlay's rows."""
    vectors = clustered(2_000)
    store = VectorStore(root=tmp_path, dim=DIM, flat_max=1_500)
    index = store.save("u", _filled(store, vectors))
    fresh = clustered(2, seed=7)
    index = store.append(
        "u", index, to_stamp=Stamp(1, 2), upserts=[("new0", "fact", fresh[0]), ("f5", "fact", fresh[1])],
        removals=["f9"],
    )  # fmt: skip
    asked = [f"f{i}" for i in range(0, 2_000, 37)] + ["new0", "f5", "f9", "unknown"]
    rng = np.random.default_rng(SEED + 2)
    for q in rng.standard_normal((20, DIM)).astype(np.float32):
        q /= np.linalg.norm(q)
        got = index.similarities(asked, q)
        want = {node: float(np.dot(v, q)) for node, v in index.vectors_for(asked).items()}
        assert got == want and "f9" not in got and "unknown" not in got


def test_search_is_every_visible_row_ranked_best_first_per_kind_and_over_all(tmp_path: Path) -> None:
    """``UserIndex.search`` answers what ranking every visible row by its inner product answers: a kind
    held in one layer (FAISS's list, best first, not sorted again), in a base with masked rows and an
    overlay (the layers' lists merged), and every kind at once; an empty layer and a kind with no rows
    add nothing."""
    vectors = clustered(1_200)
    store = VectorStore(root=tmp_path, dim=DIM, flat_max=5_000)
    index = _filled(store, vectors)
    index.upsert((f"e{i}", "entity", v) for i, v in enumerate(clustered(40, seed=3)))
    index = store.save("u", index)  # one base of two kinds, flat, no overlay
    moved = clustered(30, seed=9)
    layered = store.append(
        "u", index, to_stamp=Stamp(1, 2),
        upserts=[*((f"n{i}", "fact", v) for i, v in enumerate(moved[:20])), ("f3", "fact", moved[20])],
        removals=["f7", "f8", "e2"],
    )  # fmt: skip
    assert layered.masked and "fact" in layered.indexes and "entity" not in layered.indexes
    rng = np.random.default_rng(SEED + 3)
    for idx in (index, layered):
        visible = idx.vectors_for(idx.node_ids())
        kinds = {node: kind for node, kind in [*idx.base_rows.values(), *idx.rows.values()]}
        for q in rng.standard_normal((10, DIM)).astype(np.float32):
            q /= np.linalg.norm(q)
            for kind in ("fact", "entity", "episode", None):
                for k in (1, 10, 45):
                    want = sorted(
                        (float(np.dot(v, q)), node) for node, v in visible.items() if kind in (None, kinds[node])
                    )[::-1][:k]
                    got = idx.search(q, k, kind=kind)
                    assert [h.node_id for h in got] == [node for _, node in want]
                    assert all(a.score >= b.score for a, b in pairwise(got))
                    assert np.allclose([h.score for h in got], [s for s, _ in want], atol=1e-5)
                    assert all(h.kind == kinds[h.node_id] for h in got)
