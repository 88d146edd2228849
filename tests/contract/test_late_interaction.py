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
from tests.support.extractions import lives_in
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


def test_the_step_uses_maxsim_falls_back_to_the_cosine_and_keeps_todays_step_without_states() -> None:
    """A pure function of the rows: ``late`` replaces the cosine at ``rerank_late``; a row ``late`` lacks gives
    its cosine; no ``late`` at all, or the "similarity" signal, is today's cosine step at ``rerank_similarity``."""
    rows = [
        (3.0, "a", None, (0.9, 0.0, 0.0, 0.0, 0.0)),
        (2.9, "b", None, (0.1, 0.0, 0.0, 0.0, 0.0)),
        (2.8, "c", None, (0.5, 0.0, 0.0, 0.0, 0.0)),
        (0.1, "d", None, (1.0, 0.0, 0.0, 0.0, 0.0)),
    ]
    recipe = RecallRecipe(rerank_depth=3, rerank_signal="late_interaction")
    by_late = similarity_step(rows, recipe, {"a": 0.2, "b": 0.8})  # c: its cosine 0.5, between them
    assert [r[1] for r in by_late] == ["b", "c", "a", "d"]
    assert [r[0] for r in by_late[:3]] == pytest.approx([2.9 + 4.5, 2.8 + 4.5 * 0.5, 3.0])
    today = [r[1] for r in similarity_step(rows, recipe.model_copy(update={"rerank_late": 0.0}), {})]
    assert [r[1] for r in similarity_step(rows, recipe, {})] == today == ["a", "c", "b", "d"]
    similarity = recipe.model_copy(update={"rerank_signal": "similarity"})
    assert [r[1] for r in similarity_step(rows, similarity, {"b": 1.0})] == today
