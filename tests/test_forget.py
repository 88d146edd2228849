"""forget(user, id) takes a message id, a fact id or an excerpt (chunk) id and refuses unknown ids; replay of
an unknown dead letter is NotFoundError too. Real SQLite, FAISS and Redis; memory built through the apply stage's planner."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from engram_api.errors import NotFoundError
from engram_workers import cli
from tests.support.memory import apply_in_process
from tests.support.stack import engram_stack

T0 = datetime(2024, 4, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory):
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("forget"), neo4j_uri=None, llm_url=None, workers=False
    ) as s:
        yield s


@pytest.fixture
def user(stack) -> str:
    user = f"f_{uuid.uuid4().hex[:10]}"
    for i, text in enumerate(["I live in Tampa.", "I like hiking.", "I moved to Austin."]):
        apply_in_process(stack.client, user, f"{user}-m{i}", text, T0 + timedelta(days=30 * i))
    return user


def lives_in(client, user) -> list[tuple[str | None, bool]]:
    return [(f.object_name, f.valid_until is None) for f in client.history(user, "user", "LIVES_IN")]


def first_fact(client, user, query):
    return next(i for i in client.recall(user, query, k=10).items if i.kind == "fact")


def excerpt_of(client, user, query, message_id):
    items = client.recall(user, query, k=10).items
    return next(i for i in items if i.kind == "episode" and i.source_ids == [message_id])


def test_a_recall_items_id_forgets_that_fact_and_only_it(stack, user):
    client = stack.client
    top = first_fact(client, user, "where does the user live?")
    assert top.statement == "User lives in Austin"

    result = client.forget(user, top.id)
    assert (result.episodes, result.facts, result.removed_fact_ids) == (0, 1, [top.id])
    # The fact it superseded is current again (the forgotten value never was); messages stay.
    assert lives_in(client, user) == [("Tampa", True)]
    assert client.stats(user).episodes == 3
    assert top.id not in {i.id for i in client.recall(user, "where does the user live?", k=5).items}


def test_a_message_id_forgets_the_message_and_what_only_it_stated(stack, user):
    client = stack.client
    chunks = [c.id for c in client.graph.get_chunks(user, episode_ids=[f"{user}-m1"])]
    assert chunks, "premise: the message is stored as excerpts"
    result = client.forget(user, f"{user}-m1")
    assert (result.episodes, result.facts, result.removed_chunk_ids) == (1, 1, chunks)
    assert client.history(user, "user", "LIKES") == []
    stats = client.stats(user)
    assert (stats.episodes, stats.episode_chunks) == (2, 2)
    # Gone from every channel: the excerpt's vector and its keyword entry went with it.
    assert client.graph.keyword_search(user, ["hiking"], k=5) == []
    assert "hiking" not in " ".join(i.statement for i in client.recall(user, "hiking", k=10).items).lower()


def test_an_excerpts_id_forgets_the_message_it_comes_from(stack, user):
    client = stack.client
    excerpt = excerpt_of(client, user, "hiking", f"{user}-m1")
    result = client.forget(user, excerpt.id)
    assert (result.episodes, result.facts, result.removed_chunk_ids) == (1, 1, [excerpt.id])
    assert not client.graph.is_applied(user, f"{user}-m1")
    assert client.history(user, "user", "LIKES") == []
    with pytest.raises(NotFoundError, match="has no message, fact or excerpt"):
        client.forget(user, excerpt.id)  # forgotten ids are unknown


def test_unknown_ids_raise_not_found_and_change_nothing(stack, user):
    client = stack.client
    version = client.graph.user_version(user)
    for unknown in ("no-such-message", f"{user}-m9"):
        with pytest.raises(NotFoundError, match="has no message, fact or excerpt"):
            client.forget(user, unknown)
    stranger = f"f_{uuid.uuid4().hex[:10]}"
    fact_id = first_fact(client, user, "hiking").id
    with pytest.raises(NotFoundError):
        client.forget(stranger, fact_id)  # another user's fact is unknown to this one
    assert client.graph.user_version(user) == version
    with pytest.raises(NotFoundError, match="no dead letter"):
        client.replay(user, "no-such-message")


def test_the_cli_forgets_a_fact_and_exits_2_for_an_unknown_id(stack, user):
    env = {k: v for k, v in stack.env.items() if v}
    runner = CliRunner()
    fact_id = first_fact(stack.client, user, "hiking").id
    done = runner.invoke(cli.main, ["forget", user, fact_id], env=env)
    assert done.exit_code == 0 and done.stdout.startswith(f"forgot fact {fact_id}: 1 fact,")
    excerpt = excerpt_of(stack.client, user, "Tampa", f"{user}-m0")
    done = runner.invoke(cli.main, ["forget", user, excerpt.id], env=env)
    assert done.exit_code == 0 and done.stdout.startswith(f"forgot the message of excerpt {excerpt.id}:")
    missing = runner.invoke(cli.main, ["forget", user, "nope", "--json"], env=env)
    assert missing.exit_code == 2 and "has no message, fact or excerpt 'nope'" in missing.stderr
    replay = runner.invoke(cli.main, ["dlq", "replay", user, "nope"], env=env)
    assert replay.exit_code == 2 and "no dead letter 'nope'" in replay.stderr
    # The hiking fact, and the Tampa fact with the message it came from, are gone.
    assert json.loads(runner.invoke(cli.main, ["stats", user, "--json"], env=env).stdout)["facts"] == 1


def test_forget_and_forget_user_leave_none_of_the_users_texts_in_this_processs_encoder_cache(stack, user):
    """Issue 42, in the process that erases: the encoder cache keeps what the apply stage encoded for the
    user (names, statements) and the user's queries; ``forget`` drops all of the user's entries (the
    forgotten texts are not known to it), ``forget_user`` too. Another user's own entries stay."""
    client, other = stack.client, f"o_{uuid.uuid4().hex[:10]}"
    apply_in_process(client, other, f"{other}-m0", "I live in Denver.", T0)
    recent = client.reader.embedder._recent
    users = {"User lives in Tampa", "User lives in Austin", "where does the user live?"}
    others = {"User lives in Denver", "what does the user like?"}

    client.recall(user, "where does the user live?", k=5)
    client.recall(other, "what does the user like?", k=5)
    assert users | others <= set(recent)  # premise: the apply stage's texts and the queries are cached

    client.forget(user, f"{user}-m2")
    assert users.isdisjoint(recent)
    client.recall(user, "where does the user live?", k=5)
    assert "where does the user live?" in recent
    client.forget_user(user)
    assert users.isdisjoint(recent) and others <= set(recent)
