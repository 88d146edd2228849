"""Late interaction in recall's second look (``reader.rerank``), on both stores, with a real Redis and MiniLM.

The conversation is applied by the apply stage's own write, so each chunk's token states are those apply
stores (its own words, read with the turn it answers, as 1-bit signs). A recall's top items are then ordered
by MaxSim between the query's token states (the same pass as its vector) and those stored states; with the
"similarity" signal, or for an item without states, the cosine stands in, as before late interaction.
"""

# ruff: noqa: F811 - ``embedder`` is the suite's fixture, imported below
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from engram_api.reader.recipe import RecallRecipe
from engram_api.reader.rerank import similarity_step
from engram_api.storage import GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.states import maxsim, unpack
from tests.support.extractions import entity, fact, lives_in
from tests.support.factories import at, new_user

from .test_hybrid_recall import Memory, embedder  # noqa: F401 - ``embedder``: the fixture

TURNS = [
    "I adopted a puppy named Biscuit last spring.",
    "My sister Maya works as a nurse in Porto.",
    "We went camping near the lake and caught three trout.",
    "I started learning the violin in January.",
    "The bakery on Elm Street makes the best sourdough.",
    "Our team shipped the new billing service on Friday.",
    "I ran my first half marathon in under two hours.",
    "My grandmother taught me to knit scarves.",
]
QUESTIONS = ["what instrument am I learning?", "where does my sister work?", "what did we catch at the lake?"]
RELATIVES = [  # the multi-hop scene of tests/test_reader.py: their words match the question, the answer's do not
    "User's cousin works for a company in Ohio",
    "User's sister works for a software company",
    "User's uncle is employed by a bank",
]


@pytest.fixture
def memory(graph_store: GraphStore, tmp_path: Path, embedder: Embedder, redis_client: redis.Redis) -> Iterator[Memory]:
    memory = Memory(graph_store, tmp_path / "writer", embedder, redis_client)
    yield memory
    memory.reader.flush()


def test_the_top_is_ordered_by_maxsim_over_the_stored_token_states(memory: Memory, embedder: Embedder) -> None:
    """With the late-interaction weight far above every other share, the top ``rerank_depth`` items come
    in the order of MaxSim computed here from the query's states and the chunks' stored ones; with the
    "similarity" signal they do not need to (the cosine orders them), and every item keeps its states."""
    user = new_user()
    for i, text in enumerate(TURNS):
        memory.say(user, f"m{i}", text, at(i))
    items, _ = memory.graph.stamped_vectors(user)
    stored = {i.node_id: i.states for i in items if i.kind == "episode"}
    assert len(stored) == len(TURNS) and all(stored.values())
    depth = len(TURNS)
    late = RecallRecipe(rerank_depth=depth, rerank_signal="late_interaction", rerank_late=1000.0)
    cosine = late.model_copy(update={"rerank_signal": "similarity", "rerank_similarity": 1000.0})
    differed = False
    for question in QUESTIONS:
        got = memory.reader.recall(user, question, k=depth, recipe=late).items
        _, (qstates,) = embedder.encode_states([question])
        scores = {node: maxsim(qstates, unpack(blob)) for node, blob in stored.items() if blob is not None}
        ranked = [item.id for item in got if item.id in scores]
        assert len(ranked) == depth
        assert ranked == sorted(ranked, key=lambda node: -scores[node])
        plain = [item.id for item in memory.reader.recall(user, question, k=depth, recipe=cosine).items]
        differed |= plain != ranked
    assert differed  # MaxSim is not the cosine under another name


def test_a_facts_statement_keeps_its_states_from_the_same_batch(memory: Memory, embedder: Embedder) -> None:
    """A fact's statement gets its token states at apply (all its words), stored beside its embedding, so
    the second look scores facts by MaxSim like the excerpts, not by their cosine on another scale."""
    user = new_user()
    memory.say(user, "m1", "I live in Tampa.", at(1), lives_in("Tampa"))
    items, _ = memory.graph.stamped_vectors(user)
    facts = [i for i in items if i.kind == "fact"]
    assert len(facts) == 1 and facts[0].states is not None
    _, (want,) = embedder.encode_states(["User lives in Tampa"])
    assert unpack(facts[0].states).shape == want.shape
    np.testing.assert_array_equal(unpack(facts[0].states) > 0, want >= 0)
    assert [i.states is not None for i in items if i.kind == "entity"] == [False] * (len(items) - 2)


def test_the_step_uses_maxsim_and_keeps_todays_step_when_a_row_has_no_states() -> None:
    """A pure function of the rows: ``late`` replaces the cosine at ``rerank_late`` times the top's spread (3.0
    best, 2.8 last: 0.2) when every row re-scored has states; a row ``late`` lacks (a chunk whose vector extract
    handed over) makes it today's cosine step for all, never MaxSim and cosines in one min-max; so does no
    ``late`` at all, or the "similarity" signal."""
    rows = [
        (3.0, "a", None, (0.9, 0.0, 0.0, 0.0, 0.0)),
        (2.9, "b", None, (0.1, 0.0, 0.0, 0.0, 0.0)),
        (2.8, "c", None, (0.5, 0.0, 0.0, 0.0, 0.0)),
        (0.1, "d", None, (1.0, 0.0, 0.0, 0.0, 0.0)),
    ]
    recipe = RecallRecipe(rerank_depth=3, rerank_signal="late_interaction")
    by_late = similarity_step(rows, recipe, {"a": 0.2, "b": 0.8, "c": 0.5})
    assert [r[1] for r in by_late] == ["b", "a", "c", "d"]
    assert [r[0] for r in by_late[:3]] == pytest.approx([2.9 + 0.2, 3.0, 2.8 + 0.2 * 0.5])
    today = [r[1] for r in similarity_step(rows, recipe.model_copy(update={"rerank_late": 0.0}), {})]
    assert [r[1] for r in similarity_step(rows, recipe, {})] == today == ["a", "c", "b", "d"]
    # c without states (its cosine 0.5 would have sat between a's and b's MaxSim): the cosine step for all.
    assert [r[1] for r in similarity_step(rows, recipe, {"a": 0.2, "b": 0.8})] == today
    similarity = recipe.model_copy(update={"rerank_signal": "similarity"})
    assert [r[1] for r in similarity_step(rows, similarity, {"b": 1.0})] == today


def test_the_late_lift_is_in_the_totals_own_units_so_their_scale_does_not_reorder_the_top() -> None:
    """The totals' scale is the recipe's (the keyword channel's weight 5 or none) and the memory's, so the lift
    is ``rerank_late`` times the spread of the rows re-scored: the same rows with every total scaled order
    the same, and the best MaxSim carries the last row at most level with the first (``rerank_late`` 1). A
    fixed weight over small totals would order them by MaxSim alone, whatever the first look found."""
    rows = [
        (1.6, "brother", None, (0.39, 0.0, 0.0, 0.0, 0.0)),
        (1.55, "amazon", None, (0.31, 0.0, 0.0, 0.0, 0.0)),
        (1.0, "cousin", None, (0.49, 0.0, 0.0, 0.0, 0.0)),
        (0.9, "sister", None, (0.42, 0.0, 0.0, 0.0, 0.0)),
        (0.3, "office", None, (0.05, 0.0, 0.0, 0.0, 0.0)),
    ]
    late = {"brother": 0.28, "amazon": 0.28, "cousin": 0.43, "sister": 0.40, "office": 0.04}
    recipe = RecallRecipe(rerank_signal="late_interaction")
    first = similarity_step(rows, recipe, late)
    assert [r[1] for r in first] == ["brother", "amazon", "cousin", "sister", "office"]
    for factor in (0.25, 4.0):
        scaled = [(total * factor, *rest) for total, *rest in rows]
        assert [r[1] for r in similarity_step(scaled, recipe, late)] == [r[1] for r in first]
    level = [(1.0, "a", None, (0.0,) * 5), (0.5, "b", None, (0.0,) * 5), (0.0, "c", None, (0.0,) * 5)]
    lifted = similarity_step(level, recipe, {"a": 0.0, "b": 0.5, "c": 1.0})
    assert [(r[1], r[0]) for r in lifted] == [("a", 1.0), ("b", 1.0), ("c", 1.0)]


def test_the_fact_the_graph_reached_stays_in_the_top_3_with_late_interaction(memory: Memory) -> None:
    """The demo's multi-hop question over the fact and graph channels (``tests/test_reader.py``): the graph
    reaches "Alex was hired by Amazon" from the brother fact, and the relatives' facts, which share the
    question's words, fit it better by MaxSim as by the cosine. Those two channels fuse totals a few times
    smaller than the whole recipe's, so the late lift, in their spread, leaves the graph's answer in the top 3."""
    user = new_user()
    for n in range(30):
        said = RELATIVES[n] if n < 3 else f"User's office has {n} meeting rooms"
        memory.say(user, f"d{n}", f"distractor {n}", at(n * 30), {"facts": [fact("user", "NOTE", None, said)]})
    alex = entity("e1", "Alex", "Person")
    brother = {
        "entities": [alex],
        "facts": [fact("user", "HAS_BROTHER", "e1", "User's brother is Alex", importance=0.7)],
    }
    hired = {
        "entities": [alex, entity("e2", "Amazon", "Organization")],
        "facts": [fact("e1", "WORKS_AT", "e2", "Alex was hired by Amazon", single_valued=True)],
    }
    memory.say(user, "brother", "My brother is Alex.", at(900), brother)
    memory.say(user, "hired", "Alex got hired at Amazon.", at(930), hired)
    question = "what company does my brother work for?"
    late = RecallRecipe(rerank_signal="late_interaction")
    vector_only = memory.reader.recall(user, question, k=3, recipe=late.with_channels("fact_vector")).items
    assert all(i.object != "Amazon" for i in vector_only)  # else no multi-hop: nothing to keep
    fused = memory.reader.recall(user, question, k=3, recipe=late.with_channels("fact_vector", "graph"))
    assert "late" in fused.timings_ms  # the step read the facts' stored states
    items = fused.items
    amazon = [i for i in items if i.object == "Amazon"]
    assert amazon and amazon[0].path in ("graph", "both") and amazon[0].hops == 0, items
