"""What the per-candidate lookups of a recall cost, cold (right after the recall's own FAISS scans) and warm
(the same lookups again at once), and what the same reads cost by integer position instead of by id.

``PYTHONPATH=<tree>:ops/bench python ops/bench/recall_lookups.py --workdir DIR --facts N [--rounds 3]``

The recalls ``recall_dump.py replay`` records (``_recorded``: the bulk user of ``N`` facts under ``DIR``, its
snapshot held, the clock fixed) are taken apart: for each recall and round, the three base searches a recall
runs (fact 30, entity 10, episode 40) evict the caches, then one lookup set is timed twice (cold, then warm),
the scans run again before the next set. Each set's median over recalls and rounds, in us:

- ``hits_rows`` / ``hits_positions``: the base searches' hits' rows by vector id (``base_rows``, what
  ``UserIndex.search`` reads), and the same rows read from a list by the hit's position in its kind;
- ``missing_vector_id``: hashing the ids of the candidates no vector search returned (``vector_id``);
  ``missing_rows`` / ``missing_positions``: their rows by vector id, and by position;
- ``similarities``: ``UserIndex.similarities`` of those candidates (what ``_Run.items`` asks);
  ``similarities_positions``: the same answers (checked equal) from a node -> (kind, position) map and one
  gather from the base's exact vectors (FAISS's own storage, no copy) and the same stacked product;
- ``candidate_rows`` / ``candidate_views``: every candidate's snapshot row by id, and its view (the graph step's);
- ``walk``: ``UserSnapshot._expand`` of the recall's graph step query; ``scoring``: ``Scoring.rows``;
- ``n_*``: the counts (hits, candidates, candidates without a similarity).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent


def _positions(index: Any) -> tuple[dict[int, tuple[str, int]], dict[str, list[Any]], dict[str, Any]]:
    """vector id -> (kind, position) of the base's rows, each kind's rows as a list by position, and each
    kind's exact vectors as a view of the base's storage (flat, or the flat an IVF base is re-ranked on)."""
    import faiss

    at: dict[int, tuple[str, int]] = {}
    listed: dict[str, list[Any]] = {}
    exact: dict[str, Any] = {}
    for kind, base in index.base.items():
        ids = faiss.vector_to_array(base.id_map).tolist()
        at.update((vid, (kind, p)) for p, vid in enumerate(ids))
        listed[kind] = [index.base_rows[vid] for vid in ids]
        inner: Any = faiss.downcast_index(base.index)
        if not isinstance(inner, faiss.IndexFlat):
            inner = faiss.downcast_index(inner.refine_index)
        exact[kind] = faiss.rev_swig_ptr(inner.get_xb(), inner.ntotal * inner.d).reshape(inner.ntotal, inner.d)
    return at, listed, exact


def lookups(workdir: Path, facts: int, n: int, rounds: int) -> None:
    from recall_dump import _recorded

    import engram_api.reader.fusion as fusion
    from engram_api.reader.scoring import Scoring
    from engram_api.storage.faiss.index import vector_id
    from engram_api.storage.snapshot.graph import UserSnapshot
    from engram_api.storage.snapshot.rows import CHUNK_FACTS

    runs: list[Any] = []
    items, step = fusion._Run.items, UserSnapshot.graph_step
    asked: dict[str, Any] = {}

    def recorded_items(run: Any, weights: Any, k: int) -> Any:
        run.lookups = ([i for i in run.cands if i not in run.sims], asked.get("query"), weights)
        runs.append(run)
        return items(run, weights, k)

    def recorded_step(snapshot: Any, query: Any) -> Any:
        asked["query"] = query
        return step(snapshot, query)

    fusion._Run.items, UserSnapshot.graph_step = recorded_items, recorded_step  # type: ignore[method-assign,assignment]
    with _recorded(workdir, workdir / f"data-{facts}", f"dump-{facts}", n) as recorded:
        fusion._Run.items, UserSnapshot.graph_step = items, step  # type: ignore[method-assign]
        runs[:] = runs[-len(recorded) :]
        index, snapshot = runs[0].index, runs[0].user_facts.snapshot
        assert snapshot is not None and not index.rows and not index.masked, "a held snapshot over a bare base"
        at, listed, exact = _positions(index)
        node_at = {index.base_rows[vid][0]: place for vid, place in at.items()}
        fact_rows, chunk_rows = snapshot.facts.rows(), snapshot.chunks.rows()

        def by_position(nodes: list[str], q: np.ndarray) -> dict[str, float]:
            groups: dict[str, tuple[list[str], list[int]]] = {}
            for node in nodes:
                place = node_at.get(node)
                if place is not None:
                    group = groups.setdefault(place[0], ([], []))
                    group[0].append(node)
                    group[1].append(place[1])
            out: dict[str, float] = {}
            for kind, (names, rows) in groups.items():
                out.update(zip(names, np.matmul(exact[kind][rows][:, None, :], q).ravel().tolist(), strict=True))
            return out

        def scan(run: Any) -> list[int]:
            q = np.ascontiguousarray(run.qvec, dtype=np.float32).reshape(1, -1)
            found: list[int] = []
            for kind, k in (("fact", 30), ("entity", 10), ("episode", 40)):
                if kind in index.base:
                    found += index.base[kind].search(q, min(int(index.base[kind].ntotal), k))[1][0].tolist()
            return [v for v in found if v >= 0]

        per: dict[str, list[float]] = {}

        def timed(run: Any, label: str, fn: Callable[[], Any]) -> None:
            scan(run)
            for state in ("cold", "warm"):
                start = time.perf_counter_ns()
                fn()
                per.setdefault(f"{label}:{state}", []).append((time.perf_counter_ns() - start) / 1e3)

        def measured(run: Any) -> None:
            missing, query, weights = run.lookups
            hits, cands = scan(run), list(run.cands)
            places = [at[v] for v in hits]
            mvids = [vector_id(i) for i in missing]
            mplaces = [at[v] for v in mvids if v in at]
            assert by_position(missing, run.qvec) == index.similarities(missing, run.qvec)
            for label, count in (("n_hits", hits), ("n_candidates", cands), ("n_missing", missing)):
                per.setdefault(label, []).append(len(count))
            timed(run, "hits_rows", lambda: [index.base_rows.get(v) for v in hits])
            timed(run, "hits_positions", lambda: [listed[k][p] for k, p in places])
            timed(run, "missing_vector_id", lambda: [vector_id(i) for i in missing])
            timed(run, "missing_rows", lambda: [index.base_rows.get(v) for v in mvids])
            timed(run, "missing_positions", lambda: [listed[k][p] for k, p in mplaces])
            timed(run, "similarities", lambda: index.similarities(missing, run.qvec))
            timed(run, "similarities_positions", lambda: by_position(missing, run.qvec))
            timed(run, "candidate_rows", lambda: [fact_rows.get(i) or chunk_rows.get(i) for i in cands])
            timed(run, "candidate_views", lambda: (snapshot.facts.views(cands), snapshot.chunks.views(cands)))
            if query is not None and query.expanding:
                _, seeds = query.chunk_facts_of(lambda c: chunk_rows[c][CHUNK_FACTS] if c in chunk_rows else None)
                timed(run, "walk", lambda: snapshot._expand(query, [*query.seed_facts, *seeds]))
            unit = 1.0 / (run.recipe.rrf_k + 1) if run.recipe.fusion_mode == "rank" else 1.0
            scoring = Scoring.of(run.settings, run.at)
            args = (run.cands, run.sims, run.hops, weights.values())
            timed(run, "scoring", lambda: scoring.rows(*args, fusion=run.recipe.fusion, unit=unit))

        for _ in range(rounds):
            for run in runs:
                measured(run)
        out = {label: round(statistics.median(v), 1) for label, v in per.items()}
        print(json.dumps({**out, "load": os.getloadavg()[0]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--facts", type=int, default=10_000, help="the bulk user of this size (recall_dump.py load)")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(BENCH_DIR)]
    lookups(args.workdir, args.facts, args.queries, args.rounds)


if __name__ == "__main__":
    main()
