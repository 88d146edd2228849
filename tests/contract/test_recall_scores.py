"""A recall's composite scores, on both backends: ``Scoring.rows`` (one loop over every candidate, each
component and the sum inlined) gives, to the bit, what the composite formula gives candidate by candidate
(``scoring``'s docstring: each component computed on its own, the weighted sum in ``SCORE_COMPONENTS``
order, plus the fusion score's share), over the real candidates of real recalls: facts and excerpts, graph
hops, an excerpt whose value was replaced, ``as_of``, a held snapshot and the store. The items returned
are those rows, best first, ties by id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from operator import mul
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api.models import SCORE_COMPONENTS, ScoreBreakdown
from engram_api.reader.items import Candidate, Row
from engram_api.reader.rerank import similarity_step
from engram_api.reader.scoring import Scoring
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from tests.contract.test_hybrid_recall import FILLER, Memory
from tests.support.extractions import entity, fact, lives_in
from tests.support.factories import at, new_user


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    from engram_api.settings import Settings

    return Embedder(model=Settings().embedding_model)


@pytest.fixture
def memory(graph_store: GraphStore, tmp_path: Path, embedder: Embedder, redis_client: redis.Redis) -> Iterator[Memory]:
    memory = Memory(graph_store, tmp_path / "indexes", embedder, redis_client)
    yield memory
    memory.reader.close()


def _one_by_one(
    scoring: Scoring, state: tuple[Mapping[str, Candidate], Mapping[str, float], Mapping[str, int]], **by: Any
) -> list[tuple[float, str, tuple[float, ...]]]:
    """The composite formula, candidate by candidate, each component on its own."""
    cands, sims, hops = state
    weights: Sequence[float] = by["weights"]
    out = []
    for node_id, cand in cands.items():
        if cand.fact is not None:
            strength, importance, when = scoring.strength(cand.fact), cand.fact.importance, cand.fact.valid_from
        else:
            assert cand.chunk is not None
            strength, importance, when = 1.0, 0.5, cand.chunk.event_time
        age_days = max(0.0, (scoring.now - when).total_seconds() / 86400)
        hop = hops.get(node_id)
        comp = (
            max(0.0, sims.get(node_id, 0.0)),
            0.0 if hop is None else scoring.hop_decay**hop,
            strength,
            2.0 ** (-age_days / scoring.half_life_days),
            importance,
        )
        out.append((sum(map(mul, weights, comp)) + by["fusion"] * cand.fusion / by["unit"], node_id, comp))
    return out


def test_every_candidates_score_is_the_composite_formula_to_the_bit(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = new_user()
    for i, text in enumerate(FILLER):
        memory.say(user, f"filler-{i}", text, at(i))
    memory.say(user, "m1", "I live in Tampa.", at(10), lives_in("Tampa"))
    memory.say(
        user,
        "m2",
        "My brother Tom works at Initech, a software company.",
        at(12),
        {
            "entities": [entity("e1", "Tom", "Person"), entity("e2", "Initech", "Organization")],
            "facts": [
                fact("user", "SIBLING_OF", "e1", "User's brother is Tom"),
                fact("e1", "WORKS_AT", "e2", "Tom works at Initech"),
            ],
        },
    )
    memory.say(user, "m3", "I just moved to Austin.", at(30), lives_in("Austin"))
    calls: list[tuple[list[Row], list[tuple[float, str, tuple[float, ...]]]]] = []
    real = Scoring.rows

    def recorded(self: Scoring, cands: Any, sims: Any, hops: Any, weights: Any, *, fusion: float, unit: float) -> Any:
        rows = real(self, cands, sims, hops, weights, fusion=fusion, unit=unit)
        expected = _one_by_one(self, (cands, sims, hops), weights=weights, fusion=fusion, unit=unit)
        calls.append((list(rows), expected))  # a copy: the caller sorts the rows after
        return rows

    monkeypatch.setattr(Scoring, "rows", recorded)
    asked = [
        ("where does the user live?", {}),
        ("where does the user live?", {"as_of": at(20)}),
        ("where does the user's brother work?", {}),
        ("what did I have for lunch?", {}),
        ("documentary about whales", {"since": at(2), "until": at(40)}),
    ]
    for _ in range(2):  # the store answers first, then the snapshot the first recalls loaded
        for query, window in asked:
            memory.reader.recall(user, query, k=8, **window)
            memory.reader.flush()
        memory.reader.cache.drop_user(user)
    graphed = 0
    for rows, expected in calls:
        assert [(total, node_id, comp) for total, node_id, _, comp in rows] == expected
        graphed += sum(1 for _, _, comp in expected if comp[1] > 0)
    assert len(calls) == 2 * len(asked) and graphed > 0  # the graph component took part


def test_the_items_are_the_rows_best_first_ties_by_id(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    user = new_user()
    for i, text in enumerate(FILLER):
        memory.say(user, f"filler-{i}", text, at(i))
    memory.say(user, "m1", "I live in Tampa.", at(10), lives_in("Tampa"))
    seen: list[list[Row]] = []
    real = Scoring.rows

    def recorded(self: Scoring, *args: Any, **kwargs: Any) -> Any:
        rows = real(self, *args, **kwargs)
        seen.append(list(rows))
        return rows

    monkeypatch.setattr(Scoring, "rows", recorded)
    # The cosine second look: late interaction's MaxSim comes from the stored states, not from the rows.
    cosine = memory.reader.recipe().model_copy(update={"rerank_signal": "similarity"})
    items = memory.reader.recall(user, "where does the user live?", k=5, recipe=cosine).items
    # The rows best first, then the top's second look by meaning (``reader.rerank``), as fusion orders them.
    best = similarity_step(sorted(seen[0], key=lambda r: (-r[0], r[1])), cosine)[:5]
    assert [i.id for i in items] == [node_id for _, node_id, _, _ in best]
    assert [i.breakdown.total for i in items] == [total for total, _, _, _ in best]
    assert [i.breakdown.similarity for i in items] == [comp[0] for _, _, _, comp in best]
    # Every item is its row (the k validated in one call, ``items.result_items``): the whole breakdown, the
    # score rounded, the record's fields, each a model of its own.
    for item, (total, _, cand, comp) in zip(items, best, strict=True):
        assert type(item.breakdown) is ScoreBreakdown
        assert item.breakdown.model_dump() == {
            **dict(zip(SCORE_COMPONENTS, comp, strict=True)),
            "rrf": cand.fusion,
            "total": total,
        }
        assert item.score == round(total, 6) and item.kind == cand.kind and item.channels == cand.channels
        record = cand.fact if cand.fact is not None else cand.chunk
        assert record is not None and item.statement == (record.statement if cand.fact is not None else record.text)
    assert len({id(i.breakdown) for i in items}) == len(items)
