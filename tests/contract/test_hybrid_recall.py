"""Episodes as memories, on both backends: what the extractor did not turn into a fact is still recalled
(by meaning and by keyword), per user, within a time window, and forgotten without a trace.

Messages go through the apply stage's write path (``write_members``, the real consolidation with the real
MiniLM embedder), the real store and the real per-user FAISS files; the Reader runs without Redis (its cache keys on the store's
version instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_api.errors import InvalidInputError
from engram_api.models import ChatMessage, Envelope, EpisodeRecord, Extraction, WritePlan
from engram_api.reader.context import EXCERPTS_HEADER, FACTS_HEADER
from engram_api.reader.facts import ChunkCache, UserChunks
from engram_api.reader.reader import Reader
from engram_api.reader.recipe import DEFAULT_RECIPE
from engram_api.settings import Settings
from engram_api.storage import GraphStep, GraphStepQuery, GraphStore
from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.faiss.keeper import IndexKeeper
from engram_api.storage.graph.episodes import chunk_envelope, keyword_terms
from engram_api.storage.writer.userwrite import UserWrites
from engram_workers.maintenance.reconcile import reconcile
from tests.support.extractions import entity, fact, lives_in
from tests.support.factories import at, new_user
from tests.support.memory import apply_message

# Every channel but the keyword search.
NO_KEYWORD = DEFAULT_RECIPE.with_channels("fact_vector", "episode_vector", "graph")
FILLER = [
    "I had pasta for lunch today.",
    "Work was busy, lots of meetings.",
    "My sister called me this morning.",
    "I need to buy new running shoes.",
    "The train was late again.",
    "I watched a documentary about whales.",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(model=Settings().embedding_model)


class Memory:
    """The apply stage's own write (``apply_message``: plan, one transaction, FAISS delta) and a Reader over it."""

    def __init__(self, graph: GraphStore, root: Path, embedder: Embedder, redis_client: redis.Redis) -> None:
        self.graph = graph
        self.embedder = embedder
        self.redis = redis_client  # forget reaches Redis (and refuses without it)
        self.vectors = VectorStore(root=root, dim=embedder.dim)
        self.keeper = IndexKeeper(graph=graph, vectors=self.vectors)
        self.reader = self.another_reader()
        self.writes = UserWrites(graph=graph, keeper=self.keeper, redis_client=redis_client, lease_ttl_s=30)

    def say(
        self,
        user: str,
        mid: str,
        text: str,
        when: datetime,
        extraction: dict[str, Any] | None = None,
        speaker: str | None = None,
    ) -> None:
        message = ChatMessage(role="user", content=text, name=speaker)
        envelope = Envelope(user_id=user, message_id=mid, messages=[message], timestamp=when)
        answer = Extraction.model_validate(extraction or {})
        apply_message(self.writes, self.graph, self.embedder, (), envelope, answer)

    def say_many(self, user: str, texts: list[str], when: datetime) -> None:
        """Many fact-less messages, embedded in one batch (the index is rebuilt from the store after)."""
        for i, text in enumerate(texts):
            envelope = Envelope(
                user_id=user, message_id=f"bulk-{i}", messages=[ChatMessage(content=text)], timestamp=when
            )
            chunks = chunk_envelope(envelope)
            for chunk, vec in zip(chunks, self.embedder.encode([c.indexed_text for c in chunks]), strict=True):
                chunk.embedding = vec.tolist()
            episode = EpisodeRecord(
                id=envelope.message_id, user_id=user, content=envelope.text, event_time=when, created_at=when
            )
            self.graph.apply(WritePlan(user_id=user, episode=episode, chunks=chunks))
        self.keeper.rebuild(user)

    def another_reader(self, **settings: Any) -> Reader:
        """A second reader over the same stores, with its own caches and these settings."""
        return Reader(
            settings=Settings(**settings),
            graph=self.graph,
            keeper=self.keeper,
            embedder=self.embedder,
            redis_client=self.redis,
        )

    def sources(self, user: str, query: str, **kwargs: Any) -> list[str]:
        return [s for item in self.reader.recall(user, query, **kwargs).items for s in item.source_ids]


@pytest.fixture
def memory(graph_store: GraphStore, tmp_path: Path, embedder: Embedder, redis_client: redis.Redis) -> Iterator[Memory]:
    memory = Memory(graph_store, tmp_path / "indexes", embedder, redis_client)
    yield memory
    memory.reader.flush()  # no snapshot load left running when the store closes


def _chatter(memory: Memory, user: str) -> None:
    for i, text in enumerate(FILLER):
        memory.say(user, f"filler-{i}", text, at(i))


def test_a_message_with_no_fact_is_recalled_by_meaning(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(10))
    result = memory.reader.recall(user, "aurora borealis trip", k=5)
    top = result.items[0]
    assert memory.graph.stats(user).facts == 0
    assert (top.kind, top.source_ids, top.speaker) == ("episode", ["aurora"], "user")
    assert "episode_vector" in top.channels
    assert top.event_time == at(10)


def test_a_message_with_no_fact_is_recalled_by_a_rare_keyword(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "code", "The locker code at the gym is QX-4471, do not lose it.", at(10))
    items = memory.reader.recall(user, "qx 4471", k=5).items
    assert items[0].source_ids == ["code"]
    assert "keyword" in items[0].channels
    hits = memory.graph.keyword_search(user, keyword_terms("where is QX-4471?"), 5)
    assert [h.kind for h in hits] == ["episode"]


def test_keyword_and_vector_search_never_return_another_users_episodes(memory: Memory) -> None:
    """B has 100x more episodes matching the query than A: A's top-k is still A's, all of them."""
    a, b = new_user(), new_user()
    mine = ["We hiked the Dolomites trail at dawn.", "The Dolomites were covered in snow.", "Dolomites again!"]
    for i, text in enumerate(mine):
        memory.say(a, f"a-{i}", text, at(i))
    memory.say_many(b, [f"Dolomites hike number {i} with the club." for i in range(300)], at(1))
    hits = memory.graph.keyword_search(a, keyword_terms("Dolomites hike"), 5)
    assert len(hits) == 3
    assert {c.episode_id for c in memory.graph.get_chunks(a, [h.node_id for h in hits])} == {"a-0", "a-1", "a-2"}
    assert memory.graph.get_chunks(b, [h.node_id for h in hits]) == []
    assert set(memory.sources(a, "Dolomites hike", k=10)) == {"a-0", "a-1", "a-2"}
    assert len(memory.sources(b, "Dolomites hike", k=10)) == 10


def test_as_of_since_and_until_filter_episodes(memory: Memory) -> None:
    user = new_user()
    for day in (1, 5, 9):
        memory.say(user, f"d{day}", f"Went swimming in the lake on day {day}.", at(day))
    assert set(memory.sources(user, "swimming in the lake")) == {"d1", "d5", "d9"}
    assert set(memory.sources(user, "swimming in the lake", as_of=at(5))) == {"d1", "d5"}
    assert set(memory.sources(user, "swimming in the lake", since=at(2))) == {"d5", "d9"}
    assert set(memory.sources(user, "swimming in the lake", since=at(2), until=at(9))) == {"d5"}
    terms = keyword_terms("swimming lake")
    assert len(memory.graph.keyword_search(user, terms, 10, as_of=at(1))) == 1
    assert len(memory.graph.keyword_search(user, terms, 10, since=at(5), until=at(9))) == 1
    with pytest.raises(InvalidInputError, match="until"):
        memory.reader.recall(user, "lake", since=at(5), until=at(5))


def test_forget_leaves_no_episode_vector_or_keyword_entry(memory: Memory) -> None:
    user = new_user()
    memory.say(user, "keep", "I planted tomatoes in the garden.", at(1))
    memory.say(user, "drop", "The zeppelin museum in Friedrichshafen was amazing.", at(2))
    stats = memory.graph.stats(user)
    assert (stats.episode_chunks, stats.keyword_entries) == (2, 2)
    result = memory.reader.forget(user, "drop")
    assert len(result.removed_chunk_ids) == 1
    stats = memory.graph.stats(user)
    assert (stats.episodes, stats.episode_chunks, stats.keyword_entries) == (1, 1, 1)
    assert memory.graph.keyword_search(user, keyword_terms("zeppelin Friedrichshafen"), 5) == []
    on_disk = memory.vectors.load(user)
    assert on_disk is not None and on_disk.count("episode") == 1
    assert result.removed_chunk_ids[0] not in on_disk.node_ids()
    assert [i.kind for i in memory.graph.vectors(user)[0]] == ["episode"]

    memory.reader.forget_user(user)
    stats = memory.graph.stats(user)
    assert (stats.episodes, stats.episode_chunks, stats.keyword_entries) == (0, 0, 0)
    assert memory.graph.vectors(user)[0] == []
    assert not memory.vectors.path_for(user).exists()


def test_get_context_never_states_a_superseded_value_as_current(memory: Memory) -> None:
    user = new_user()
    memory.say(user, "m1", "I live in Tampa.", at(1), lives_in("Tampa"))
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    context = memory.reader.get_context(user, "Where does the user live? Tampa or Austin?", max_tokens=400)
    facts_part, _, excerpts_part = context.partition(EXCERPTS_HEADER)
    assert facts_part.startswith(FACTS_HEADER)
    assert "Austin" in facts_part and "Tampa" not in facts_part
    # The old value may be shown, dated, as something said back then.
    assert f"[{at(1).date().isoformat()}] user: I live in Tampa." in excerpts_part
    assert len(context) <= 400 * 4


def test_episode_hits_bring_their_facts_and_fact_hits_their_episode(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "home", "I live in Lisbon.", at(20), lives_in("Lisbon"))
    items = memory.reader.recall(user, "Lisbon", k=10).items
    by_kind = {i.kind: i for i in items if "home" in i.source_ids}
    assert set(by_kind) == {"fact", "episode"}
    assert by_kind["fact"].current and by_kind["fact"].statement == "User lives in Lisbon"


def test_results_are_best_first_by_score_and_a_fact_and_its_excerpt_both_count(memory: Memory) -> None:
    """The order docs/api.md states: best first by score, nothing reordered after. A fact and the excerpt
    it was extracted from are two items (one says what holds now, the other what was said, dated)."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "home", "I live in Lisbon.", at(20), lives_in("Lisbon"))
    for recipe in (memory.reader.recipe(), memory.reader.recipe().model_copy(update={"fusion_mode": "rank"})):
        items = memory.reader.recall(user, "Lisbon", k=10, recipe=recipe).items
        scores = [i.score for i in items]
        assert scores == sorted(scores, reverse=True), scores
        assert [i.source_ids for i in items[:2]] == [["home"], ["home"]]  # the fact and its excerpt, top two
        assert {i.kind for i in items[:2]} == {"fact", "episode"}


def test_two_facts_of_one_message_are_two_answers(memory: Memory) -> None:
    """A message "my brother Alex works at Amazon" says a brother and an employer, and the question may be about
    either: both facts are in the top 3 (the demo's multi-hop question)."""
    user = new_user()
    _chatter(memory, user)
    brother = {
        "entities": [entity("e1", "Alex", "Person"), entity("e2", "Amazon", "Organization")],
        "facts": [
            fact("user", "HAS_BROTHER", "e1", "User has a brother named Alex"),
            fact("e1", "WORKS_AT", "e2", "Alex works at Amazon"),
        ],
    }
    memory.say(user, "family", "My brother Alex works at Amazon.", at(20), brother)
    items = memory.reader.recall(user, "what company does my brother work for?", k=3).items
    assert {"User has a brother named Alex", "Alex works at Amazon"} <= {i.statement for i in items}, items


def _scores(memory: Memory, user: str, query: str, **update: Any) -> dict[str, float]:
    """Scores by message under the recipe changed by ``update``, always from the store: a held snapshot's
    BM25 counts the user's documents only, so its scores differ a little from the store's. With the cosine
    second look, whose lift is a fixed weight times a share no fusion cue moves: late interaction's lift is in
    the top's spread, which a cue moves, so a cue's exact share is read where the step adds a fixed amount."""
    reader = memory.another_reader(snapshot_max_records=0)
    recipe = reader.recipe().model_copy(update={"rerank_signal": "similarity", **update})
    return {i.source_ids[0]: i.score for i in reader.recall(user, query, k=20, recipe=recipe).items}


def test_a_turn_by_the_speaker_the_query_names_ranks_first(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "mel", "I painted a sunset over the lake last weekend.", at(20), speaker="Melanie")
    memory.say(user, "car", "I painted a sunset over the lake last weekend.", at(21), speaker="Caroline")
    for who, other in (("melanie", "caroline"), ("caroline", "melanie")):
        question = f"What did {who.title()} paint over the lake?"
        top = memory.reader.recall(user, question, k=3).items[0]
        assert top.speaker == who.title(), top
        cued, plain = _scores(memory, user, question), _scores(memory, user, question, speaker_boost=0.0)
        mid = {"melanie": "mel", "caroline": "car"}
        # The named speaker's turn gains exactly the boost; the other speaker's turn nothing.
        assert cued[mid[who]] - plain[mid[who]] == pytest.approx(memory.reader.recipe().speaker_boost, abs=1e-5)
        assert cued[mid[other]] == pytest.approx(plain[mid[other]], abs=1e-5)


def test_a_when_question_prefers_the_turn_that_says_when(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "love", "I love my pottery class, pottery class is the best class.", at(20))
    memory.say(user, "when", "I signed up for a pottery class yesterday.", at(21))
    question = "When did I sign up for the pottery class?"
    assert memory.reader.recall(user, question, k=3).items[0].source_ids == ["when"]
    cued, plain = _scores(memory, user, question), _scores(memory, user, question, when_boost=0.0)
    assert cued["when"] - plain["when"] == pytest.approx(memory.reader.recipe().when_boost, abs=1e-5)
    assert cued["love"] == pytest.approx(plain["love"], abs=1e-5)  # says nothing of when
    statement = "I signed up for the pottery class"  # not a question about when: no lift at all
    assert _scores(memory, user, statement) == pytest.approx(_scores(memory, user, statement, when_boost=0.0))


def test_a_name_the_query_gives_is_matched_by_who_said_a_turn_not_by_its_words(memory: Memory) -> None:
    """ "Hey Melanie" holds the query's word "Melanie" but is not about her: in the keyword ranking (no links, no
    cues) that word adds nothing to it, while her own turn still gains by the words it shares with the query."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "hey", "Hey Melanie, how was your week?", at(20), speaker="Caroline")
    memory.say(user, "bake", "I baked sourdough bread with the kids.", at(21), speaker="Melanie")
    bare = {"channels": ("keyword",), "window": 0, "link_share": 0.0, "speaker_boost": 0.0, "when_boost": 0.0}
    question = "What bread did Melanie bake?"
    ranked = _scores(memory, user, question, **bare)
    unweighted = _scores(memory, user, question, **bare, weights={"keyword": 0.0})
    assert ranked["bake"] > unweighted["bake"]  # "bread", "bake"
    assert ranked["hey"] == pytest.approx(unweighted["hey"], abs=1e-6)  # "Melanie" alone: nothing


def test_a_question_naming_a_period_prefers_the_turn_said_in_it(memory: Memory) -> None:
    """The same words said in June and in August: "... in June?" ranks the June turn first, by exactly the
    recipe's ``period_boost``, and so does a turn said early in July whose "last week" resolves into June."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "aug", "We went camping at the lake with the kids.", datetime(2024, 8, 10, tzinfo=UTC))
    memory.say(user, "june", "We went camping at the lake with the kids.", datetime(2024, 6, 20, tzinfo=UTC))
    question = "When did we go camping at the lake in June?"
    cued, plain = _scores(memory, user, question), _scores(memory, user, question, period_boost=0.0)
    # The same words: without the cue only ties of the keyword ranking (either way) tell them apart.
    assert abs(plain["aug"] - plain["june"]) < memory.reader.recipe().period_boost / 4
    assert cued["june"] - plain["june"] == pytest.approx(memory.reader.recipe().period_boost, abs=1e-5)
    assert cued["aug"] == pytest.approx(plain["aug"], abs=1e-5)
    assert memory.reader.recall(user, question, k=3).items[0].source_ids == ["june"]
    memory.say(user, "july", "Camping at the lake last week was fun.", datetime(2024, 7, 2, tzinfo=UTC))
    cued, plain = _scores(memory, user, question), _scores(memory, user, question, period_boost=0.0)
    assert cued["july"] - plain["july"] == pytest.approx(memory.reader.recipe().period_boost, abs=1e-5)
    assert _scores(memory, user, "camping at the lake") == pytest.approx(
        _scores(memory, user, "camping at the lake", period_boost=0.0)
    )  # no period named: no lift at all


def test_a_turn_is_lifted_by_the_share_of_the_query_its_session_holds(memory: Memory) -> None:
    """ "Austin." holds no word of "Where did Melanie move last year?", but the question it answers, said in the
    same session (day), holds all three of the words a turn is scored on ("Melanie" counts by who spoke): every
    turn of that day gains exactly ``session_boost``, a turn of a day whose hits hold one word of three a third
    of it, and a day no hit was said on nothing; a recipe without the keyword channel lifts nothing."""
    user = new_user()
    _chatter(memory, user)
    minute = 60 / 86400
    memory.say(user, "ask", "Where did you move to last year?", at(10), speaker="Caroline")
    memory.say(user, "answer", "Austin.", at(10 + minute), speaker="Melanie")
    memory.say(user, "home", "I stayed home last weekend.", at(20), speaker="Melanie")
    memory.say(user, "cake", "I baked a lemon cake.", at(20 + minute), speaker="Caroline")
    question = "Where did Melanie move last year?"
    boost = memory.reader.recipe().session_boost
    assert boost > 0
    for channels in (DEFAULT_RECIPE.channels, ("keyword",)):
        lifted = _scores(memory, user, question, channels=channels)
        plain = _scores(memory, user, question, channels=channels, session_boost=0.0)
        for mid, share in (("ask", 1.0), ("answer", 1.0), ("home", 1 / 3), ("cake", 1 / 3)):
            if mid in plain:
                assert lifted[mid] - plain[mid] == pytest.approx(boost * share, abs=1e-5), mid
        assert "answer" in lifted
        for mid in (m for m in plain if m.startswith("filler")):  # days no hit was said on
            assert lifted[mid] == pytest.approx(plain[mid], abs=1e-5)
    no_keyword = {"channels": NO_KEYWORD.channels}
    assert _scores(memory, user, question, **no_keyword) == pytest.approx(
        _scores(memory, user, question, **no_keyword, session_boost=0.0)
    )


def test_the_top_items_are_rescored_by_how_like_the_query_they_are(memory: Memory) -> None:
    """The similarity step (``reader.rerank``): among the top ``rerank_depth`` items the one most like the query
    gains exactly ``rerank_similarity``, the least like it nothing, the rest in proportion to their similarity;
    the list stays best first by score, a recall of 3 is the first 3 of a recall of 20, and a recipe without
    a vector channel is not touched."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "fit", "I ran a marathon in under four hours last spring.", at(20), speaker="Melanie")
    memory.say(user, "word", "My sport shoes are too small, I need new ones.", at(21), speaker="Melanie")
    question = "What sport has Melanie done?"
    weight = memory.reader.recipe().rerank_similarity
    reader = memory.another_reader(snapshot_max_records=0)
    cosine = reader.recipe().model_copy(update={"rerank_signal": "similarity"})  # the step by the cosine
    stepped = reader.recall(user, question, k=20, recipe=cosine).items
    plain = reader.recall(user, question, k=20, recipe=cosine.model_copy(update={"rerank_similarity": 0.0}))
    before = {i.id: i for i in plain.items}
    assert len(stepped) <= reader.recipe().rerank_depth  # a small user: every item is in the step
    sims = {i.id: i.breakdown.similarity for i in stepped}
    lo, hi = min(sims.values()), max(sims.values())
    for item in stepped:
        gained = item.score - before[item.id].score
        assert gained == pytest.approx(weight * (sims[item.id] - lo) / (hi - lo), abs=1e-5), item.statement
    closest = max(sims, key=lambda i: sims[i])
    assert stepped[0].id == closest or stepped[0].score - before[stepped[0].id].score > 0  # the step counted
    rank = {i.id: n for n, i in enumerate(stepped)}
    assert rank[closest] <= [i.id for i in plain.items].index(closest)  # the item most like the query moves up
    scores = [i.score for i in stepped]
    assert scores == sorted(scores, reverse=True)
    assert [i.id for i in reader.recall(user, question, k=3, recipe=cosine).items] == [i.id for i in stepped[:3]]
    keyword = reader.recipe().with_channels("keyword")
    assert _scores(memory, user, question, channels=("keyword",)) == pytest.approx(
        {i.source_ids[0]: i.score for i in reader.recall(user, question, k=20, recipe=keyword).items}
    )
    assert _scores(memory, user, question, channels=("keyword",)) == pytest.approx(
        _scores(memory, user, question, channels=("keyword",), rerank_similarity=0.0)
    )  # no vector channel: no step


def test_a_short_answer_is_found_by_the_question_it_answers(memory: Memory) -> None:
    """The answer "Austin." shares no word with "where did I move to after college?"; the turn before it does, and an
    episode hit brings its neighbouring turns (``window``)."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "q", "Where did you move to after college?", at(20), speaker="Melanie")
    memory.say(user, "a", "Austin.", at(20 + 1 / 86400))
    question = "where did I move to after college?"
    found = memory.reader.recall(user, question, k=2).items
    assert [i.source_ids for i in found] == [["q"], ["a"]], found
    assert "window" in found[1].channels  # brought by the question it answers
    alone = _scores(memory, user, question, window=0)
    assert _scores(memory, user, question)["a"] > alone.get("a", 0.0)


def test_a_held_snapshot_finds_the_neighbouring_turns_the_store_finds(memory: Memory) -> None:
    user = new_user()
    for i in range(6):
        memory.say(user, f"t{i}", f"Turn number {i} of the talk.", at(20 + i / 86400), speaker=("Ann", "Bo")[i % 2])
    stamp = memory.graph.user_stamp(user)
    snapshot = memory.graph.snapshot(user, max_records=1000)
    assert snapshot is not None
    held = UserChunks(memory.graph, ChunkCache(), user, stamp, snapshot)
    ids = sorted(snapshot.chunks, key=lambda c: snapshot.chunks[c].conversation_order)
    for window in (1, 2):
        for anchors in ([ids[0]], [ids[-1]], [ids[2], ids[3]], ids):
            store = {c.id for c in memory.graph.neighbour_chunks(user, anchors, window)}
            assert {c.id for c in held.neighbours(anchors, window)} == store, (anchors, window)
    assert {c.id for c in held.neighbours([ids[0]], 1)} == {ids[1]}  # the first turn has no turn before it


def test_an_excerpt_whose_value_was_replaced_ranks_behind_the_fact_that_replaced_it(memory: Memory) -> None:
    user = new_user()
    memory.say(user, "m1", "I live in Tampa.", at(0), lives_in("Tampa"))
    memory.say(user, "m2", "I just moved to Austin.", at(30), lives_in("Austin"))
    items = memory.reader.recall(user, "where does the user live?", k=5).items
    assert items[0].statement == "User lives in Austin", items
    tampa = next(i for i in items if i.statement == "I live in Tampa.")  # still recalled: it is history
    past = memory.reader.recall(user, "where does the user live?", k=5, as_of=at(10)).items
    then = next(i for i in past if i.statement == "I live in Tampa.")
    assert then.breakdown.rrf > tampa.breakdown.rrf  # before the move it said what held: not demoted


def test_get_context_shows_no_small_talk_and_no_replaced_value_the_query_does_not_name(memory: Memory) -> None:
    user = new_user()
    memory.say(user, "hello", "Good morning!", at(0))
    memory.say(user, "m1", "I live in Tampa.", at(1), lives_in("Tampa"))
    memory.say(user, "food", "I love sushi.", at(2), {"facts": [fact("user", "LIKES", None, "User likes sushi")]})
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    recalled = {i.statement for i in memory.reader.recall(user, "plan a dinner for me", k=40).items}
    assert {"Good morning!", "I live in Tampa."} <= recalled  # recall ranks every message
    dinner = memory.reader.get_context(user, "plan a dinner for me", max_tokens=400)  # room for every line
    assert "User likes sushi" in dinner and "User lives in Austin" in dinner, dinner
    assert "Good morning" not in dinner and "Tampa" not in dinner, dinner
    named = memory.reader.get_context(user, "where did I live in Tampa?", max_tokens=400)
    assert f"[{at(1).date().isoformat()}] user: I live in Tampa." in named  # the query names it: shown


def test_reconcile_restores_a_lost_episode_vector(memory: Memory) -> None:
    user = new_user()
    memory.say(user, "m1", "The ferry to the island leaves at seven.", at(1))
    index = memory.vectors.load(user)
    assert index is not None and index.count("episode") == 1
    index.remove(index.node_ids())
    memory.vectors.save(user, index)
    memory.keeper.forget(user)

    report = reconcile(
        graph=memory.graph, keeper=memory.keeper, guard=lambda u: memory.writes.open(u, wait=0), user_ids=[user]
    )
    assert [(f.problem, f.missing_ids) for f in report.fixed] == [("ids differ", 1)]
    repaired = memory.vectors.load(user)
    assert repaired is not None and repaired.count("episode") == 1
    assert memory.sources(user, "when does the boat depart?", k=1) == ["m1"]


def test_recall_serves_fact_records_from_its_cache_only_at_the_users_current_stamp(memory: Memory) -> None:
    user = new_user()
    question = "Where does the user live? Tampa or Austin?"
    memory.say(user, "m1", "I live in Tampa.", at(1), lives_in("Tampa"))
    tampa = [i for i in memory.reader.recall(user, question).items if i.kind == "fact"]
    assert [i.statement for i in tampa] == ["User lives in Tampa"] and tampa[0].current
    first = memory.graph.user_stamp(user)
    assert tampa[0].id in memory.reader.facts.held(user, first)  # warm: the record is cached at this stamp

    # Another writer supersedes it (this reader hears of no write, only the stamp moves): the cached record,
    # still current, is never served again.
    memory.say(user, "m2", "I moved, I live in Austin now.", at(30), lives_in("Austin"))
    facts = [i for i in memory.reader.recall(user, f"{question} Now?").items if i.kind == "fact"]
    assert [i.statement for i in facts] == ["User lives in Austin"]
    assert memory.reader.facts.held(user, first) == {}

    # A forget through the reader moves it again: the forgotten fact is gone from the next recall.
    memory.reader.forget(user, facts[0].id)
    again = memory.reader.recall(user, f"{question} Still?").items
    assert facts[0].id not in {i.id for i in again}
    assert facts[0].id not in memory.reader.facts.held(user, memory.graph.user_stamp(user))


def test_recall_serves_chunks_from_its_cache_only_at_the_users_current_stamp(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(10))
    reads: list[list[str]] = []
    real, real_step = memory.graph.get_chunks, memory.graph.graph_step

    def counting(user_id: str, chunk_ids: Any = (), **kw: Any) -> Any:
        reads.append(list(chunk_ids))
        return real(user_id, chunk_ids, **kw)

    def stepping(user_id: str, query: GraphStepQuery) -> GraphStep:
        reads.append(query.chunk_ids)
        return real_step(user_id, query)

    # The real store, the chunks each read asks for counted (a recall's come with its graph step).
    memory.graph.get_chunks = counting  # type: ignore[method-assign]
    memory.graph.graph_step = stepping  # type: ignore[method-assign]
    try:
        cold = memory.reader.recall(user, "aurora borealis trip", k=5).items
        assert any(reads), "a cold recall reads its chunks from the store"
        stamp = memory.graph.user_stamp(user)
        aurora = next(i.id for i in cold if i.source_ids == ["aurora"])
        assert aurora in memory.reader.chunks.held(user, stamp)
        reads.clear()
        warm = memory.reader.recall(user, "northern lights over the fjord", k=5).items
        assert aurora in {i.id for i in warm}
        assert all(aurora not in ids for ids in reads)  # served from the cache: not read again

        # A forget moves the stamp: the cached chunk is never served again, though the cache held it.
        memory.reader.forget(user, "aurora")
        assert memory.reader.chunks.held(user, stamp) == {}
        after = memory.reader.recall(user, "northern lights over the fjord", k=5).items
        assert "aurora" not in {s for i in after for s in i.source_ids}
    finally:
        del memory.graph.get_chunks, memory.graph.graph_step


def test_a_facts_source_excerpt_comes_from_the_cache_at_the_same_stamp_and_never_after_a_forget(
    memory: Memory,
) -> None:
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "home", "I live in Lisbon, by the river.", at(20), lives_in("Lisbon"))
    by_episode: list[list[str]] = []
    real = memory.graph.get_chunks

    def counting(user_id: str, chunk_ids: Any = (), *, episode_ids: Any = ()) -> Any:
        by_episode.append(list(episode_ids))
        return real(user_id, chunk_ids, episode_ids=episode_ids)

    memory.graph.get_chunks = counting  # type: ignore[method-assign]  # the real store, its reads counted
    try:
        cold = memory.reader.recall(user, "which city does the user live in", k=20).items
        fact = next(i for i in cold if i.kind == "fact")
        assert fact.source_ids == ["home"]
        excerpt = next(i for i in cold if i.kind == "episode" and i.source_ids == ["home"])
        assert any("home" in ids for ids in by_episode), "the source episode's chunks are read once"
        by_episode.clear()
        warm = memory.reader.recall(user, "where is the user's home city", k=20).items
        assert excerpt.id in {i.id for i in warm}
        assert all("home" not in ids for ids in by_episode)  # the episode's chunk list came from the cache

        memory.reader.forget(user, "home")
        after = memory.reader.recall(user, "where is the user's home city", k=20).items
        assert "home" not in {s for i in after for s in i.source_ids}
    finally:
        del memory.graph.get_chunks


def test_a_small_users_snapshot_answers_recall_as_the_store_does_and_only_at_its_stamp(memory: Memory) -> None:
    """The snapshot is loaded off the recall path once a second recall finds the same stamp; from then on
    recall makes no store call at all (records, graph step, keyword search), returns what a reader without
    snapshots returns (the same items, order and scores, with every channel and without the keyword one),
    and a write (here a forget) takes it out of service.

    The snapshot's BM25 counts the user's own documents and the store's its whole index (on the shared
    Neo4j, every test user's rows), so the keyword channel fuses a hit's rank and its share of the query's
    words, never its BM25 score: the two readers' orders are the same."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "home", "I live in Tampa, by the bay.", at(11), lives_in("Tampa"))
    memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(12))
    plain = memory.another_reader(snapshot_max_records=0)
    stamp = memory.graph.user_stamp(user)
    memory.reader.recall(user, "first question")
    memory.reader.flush()
    assert memory.reader.snapshots.get(user, stamp) is None  # one recall at a stamp loads nothing
    memory.reader.recall(user, "second question")
    memory.reader.flush()
    snapshot = memory.reader.snapshots.get(user, stamp)
    stats = memory.graph.stats(user)
    assert snapshot is not None and snapshot.size == stats.facts + stats.episode_chunks
    assert memory.reader.snapshots.get(new_user(), stamp) is None

    reads: list[str] = []
    plain_reads = 0
    real = {name: getattr(memory.graph, name) for name in ("graph_step", "get_facts", "get_chunks", "keyword_search")}

    def counted(name: str) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return real[name](*args, **kwargs)

        return read

    for name in real:  # the real store, its record reads counted
        setattr(memory.graph, name, counted(name))
    try:
        for question in ("where does the user live?", "aurora borealis trip", "the bay", "what did we watch?"):
            for recipe in (DEFAULT_RECIPE, NO_KEYWORD):
                got = memory.reader.recall(user, question, k=10, recipe=recipe).items
                assert got and reads == []
                want = plain.recall(user, question, k=10, recipe=recipe).items
                plain_reads += len(reads)
                reads.clear()
                assert [(i.id, i.channels, round(i.score, 4)) for i in got] == [
                    (i.id, i.channels, round(i.score, 4)) for i in want
                ]
    finally:
        for name in real:
            delattr(memory.graph, name)
    assert plain_reads  # the counting sees a reader's store reads

    memory.reader.forget(user, "aurora")
    assert memory.reader.snapshots.get(user, memory.graph.user_stamp(user)) is None
    after = memory.reader.recall(user, "northern lights over the fjord", k=10).items
    assert "aurora" not in {s for i in after for s in i.source_ids}


def test_another_processs_write_refreshes_the_held_snapshot_and_recall_still_answers_as_the_store_does(
    memory: Memory,
) -> None:
    """A write by another process (here ``memory.writes``, not the reader's own) moves the stamp: the first
    recall at the new stamp refreshes the held snapshot with only what the write changed, no whole load,
    and is itself answered from it with no store step or keyword search (the hosts bench's reader recalled
    through the store after every write: ~10-20x its floor); it answers as a reader without snapshots does.
    A forget (a removal) is taken in the same way, from the removed ids. A user written between every recall, its
    snapshot answering nothing in between, is refreshed by each recall all the same."""
    user = new_user()
    _chatter(memory, user)
    memory.say(user, "home", "I live in Tampa, by the bay.", at(11), lives_in("Tampa"))
    reader, plain = memory.reader, memory.another_reader(snapshot_max_records=0)
    for question in ("first question", "second question", "third question"):  # the third: from the snapshot
        reader.recall(user, question)
        reader.flush()
    held = reader.snapshots.peek(user)
    assert held is not None and held.stamp == memory.graph.user_stamp(user)
    whole_loads: list[str] = []
    real_snapshot = memory.graph.snapshot

    def counted(user_id: str, *, max_records: int) -> Any:
        whole_loads.append(user_id)
        return real_snapshot(user_id, max_records=max_records)

    memory.graph.snapshot = counted  # type: ignore[method-assign]
    try:
        memory.say(user, "move", "We moved to Denver this spring.", at(12), lives_in("Denver"))
        memory.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(13))
        stamp = memory.graph.user_stamp(user)
        stepped: list[str] = []
        real_steps = {name: getattr(memory.graph, name) for name in ("graph_step", "keyword_search")}
        for name, real in real_steps.items():  # the real store, its step and keyword reads counted

            def counted_step(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
                stepped.append(_name)
                return _real(*args, **kwargs)

            setattr(memory.graph, name, counted_step)
        try:
            first = reader.recall(user, "where does the user live now?")
        finally:
            for name in real_steps:
                delattr(memory.graph, name)
        assert stepped == [] and "catchup" in first.timings_ms  # answered from the refreshed snapshot
        reader.flush()
        refreshed = reader.snapshots.peek(user)
        assert refreshed is not None and refreshed.stamp == stamp and whole_loads == []
        whole = real_snapshot(user, max_records=10_000)
        assert whole is not None and dict(refreshed.facts) == dict(whole.facts)
        assert dict(refreshed.chunks) == dict(whole.chunks) and refreshed.merged().touching == whole.touching
        assert refreshed.recent_size > 0  # the write is held apart from the base (``snapshot.overlay``)
        for question in ("where does the user live?", "northern lights over the fjord", "Denver", "the bay"):
            got = reader.recall(user, question, k=10).items  # every channel: see the test above
            want = plain.recall(user, question, k=10).items
            assert [(i.id, i.channels, round(i.score, 4)) for i in got] == [
                (i.id, i.channels, round(i.score, 4)) for i in want
            ]
        memory.writes.run(user, lambda w: (memory.graph.forget_message(user, "aurora"), w.finish()), wait=0)
        reader.recall(user, "after the forget")
        reader.flush()
        reloaded = reader.snapshots.peek(user)
        assert whole_loads == [] and reloaded is not None and reloaded.stamp == memory.graph.user_stamp(user)
        whole = real_snapshot(user, max_records=10_000)  # the forget's removed ids taken out: no whole load
        assert whole is not None and dict(reloaded.facts) == dict(whole.facts)
        assert dict(reloaded.chunks) == dict(whole.chunks)

        for n, when in enumerate((14, 15)):  # written between every recall: each first recall refreshes
            memory.say(user, f"later-{n}", f"Nothing much happened on day {n}.", at(when))
            reader.recall(user, f"a first recall after write {n}")
            later = reader.snapshots.peek(user)
            assert later is not None and later.stamp == memory.graph.user_stamp(user) and whole_loads == []
        assert later is not reloaded
    finally:
        del memory.graph.snapshot


def test_a_user_above_the_snapshot_bound_keeps_its_graph_step_in_the_store(memory: Memory) -> None:
    user = new_user()
    _chatter(memory, user)
    bounded = memory.another_reader(snapshot_max_records=3)
    for question in ("first question", "second question", "third question"):
        assert bounded.recall(user, question).items
        bounded.flush()
    assert bounded.snapshots.get(user, memory.graph.user_stamp(user)) is None
