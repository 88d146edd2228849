"""Tenant isolation on the real pipeline: real worker processes write a seeded random workload of eight
users into real Neo4j; the users overlap on purpose (everyone may have a brother "Alex", cities, employers
and dog names repeat), so anything resolved or matched across users would show up.

Then every read API, for every user, must return nothing that belongs to anyone else: ownership is checked
by id against the user's own ``get_graph`` and by source message id against what the user sent. A missing
or empty user id fails closed everywhere, and ``forget_user`` of one user leaves everyone else untouched.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from neo4j import GraphDatabase

from engram_api import MemoryClient, keys
from engram_api.errors import InvalidInputError
from engram_api.models import GLOBAL_SCOPE, GraphPage, LearnedWeights
from engram_api.storage.faiss.files import VectorStore
from engram_testing.llm_standin import Reply
from engram_workers.maintenance import rebuild_hierarchy
from tests.support.api_calls import API_CALLS
from tests.support.extractions import entity, fact, lives_in, message_text
from tests.support.stack import SETTLE_S, Stack, engram_stack

SEED = 20241129
T0 = datetime(2024, 4, 1, 8, 0, tzinfo=UTC)
AS_OF = T0 + timedelta(days=3)  # inside every user's timeline: some facts were true then, some not yet
CITIES, COMPANIES, PETS, FOODS = ["Austin", "Denver", "Tampa"], ["Amazon", "Dell"], ["Rex", "Bella"], ["sushi", "tacos"]
SECRETS = ["amber", "basil", "cedar", "dune", "ember", "fjord", "glade", "haven", "islet"]
POOL = [
    *(f"I live in {c}." for c in CITIES),
    *(f"I work at {c}." for c in COMPANIES),
    *(f"My brother Alex works at {c}." for c in COMPANIES),
    *(f"I have a dog named {p}." for p in PETS),
    *(f"Alex loves {f}." for f in FOODS),
]
QUERIES = ["where does the user live?", "Alex", "what does Alex love?", "the dog", "work", "secret word"]
_LINE = re.compile(r"- (.*) \(since \d{4}-\d{2}-\d{2}\)")
_EXCERPT = re.compile(r"- \[\d{4}-\d{2}-\d{2}\] [^:]+: (.*)")


def _answer(text: str) -> dict[str, Any]:
    if m := re.fullmatch(r"I live in (\w+)\.", text):
        return lives_in(m[1])
    if m := re.fullmatch(r"I work at (\w+)\.", text):
        return {
            "entities": [entity("e1", m[1], "Company")],
            "facts": [fact("user", "WORKS_AT", "e1", f"User works at {m[1]}", single_valued=True)],
        }
    if m := re.fullmatch(r"My brother Alex works at (\w+)\.", text):
        return {
            "entities": [entity("e1", "Alex", "Person", aliases=["my brother"]), entity("e2", m[1], "Company")],
            "facts": [
                fact("user", "HAS_BROTHER", "e1", "User has a brother named Alex"),
                fact("e1", "WORKS_AT", "e2", f"Alex works at {m[1]}", single_valued=True),
            ],
        }
    if m := re.fullmatch(r"I have a dog named (\w+)\.", text):
        return {
            "entities": [entity("e1", m[1], "Pet")],
            "facts": [fact("user", "HAS_PET", "e1", f"User has a dog named {m[1]}")],
        }
    if m := re.fullmatch(r"Alex loves (\w+)\.", text):
        return {
            "entities": [entity("e1", "Alex", "Person"), entity("e2", m[1], "Food")],
            "facts": [fact("e1", "LIKES", "e2", f"Alex loves {m[1]}")],
        }
    if m := re.fullmatch(r"My secret word is (\w+)\.", text):
        return {"entities": [], "facts": [fact("user", "SECRET_WORD", None, f"User's secret word is {m[1]}")]}
    return {"entities": [], "facts": []}


def scripted(request: dict[str, Any]) -> Reply:
    return Reply.json(_answer(message_text(request)))


@dataclass
class World:
    stack: Stack
    users: list[str]  # the users every read is checked for
    leaver: str  # a ninth user, forgotten by the forget_user test
    sent: dict[str, set[str]]  # user -> message ids the user sent
    secrets: dict[str, str]
    pages: dict[str, GraphPage]  # user -> get_graph right after ingestion

    @property
    def client(self) -> MemoryClient:
        return self.stack.client

    def facts(self, user: str) -> set[str]:
        return {f.id for f in self.pages[user].facts}

    def chunks(self, user: str) -> dict[str, str]:
        """The user's episode chunks: id -> text."""
        return {c.id: c.text for c in self.client.graph.get_chunks(user, episode_ids=sorted(self.sent[user]))}

    def entities(self, user: str) -> set[str]:
        return {e.id for e in self.pages[user].entities}

    def others(self, user: str) -> set[str]:
        return {i for u in [*self.users, self.leaver] if u != user for i in self.facts(u) | self.entities(u)}


def _workload(users: list[str], leaver: str) -> list[dict[str, Any]]:
    """Per user: the secret word plus five random messages, one day apart. The first user also sends a
    message whose id starts with the leaver's id and a colon: message ids may contain colons, and nothing
    of that message may be touched when the leaver is forgotten."""
    rng = random.Random(SEED)
    items = []
    for n, user in enumerate([*users, leaver]):
        texts = [f"My secret word is {SECRETS[n]}.", *rng.sample(POOL, 5)]
        items += [
            {"user_id": user, "messages": text, "message_id": f"m{day}", "timestamp": T0 + timedelta(days=day)}
            for day, text in enumerate(texts)
        ]
    note = {"user_id": users[0], "messages": "I have a dog named Rex.", "message_id": f"{leaver}:note"}
    items.append({**note, "timestamp": T0 + timedelta(days=9)})
    rng.shuffle(items)
    return items


def _cluster(client: MemoryClient, users: list[str]) -> None:
    """The hierarchy job (topic clusters for broad search), run in this process exactly as the task does."""
    settings = client.settings
    report = rebuild_hierarchy(
        graph=client.graph,
        keeper=client.reader.keeper,
        embedder=client.reader.embedder,
        settings=settings,
        guard=lambda user: client.reader.writes.open(user, wait=30.0),
        user_ids=users,
    )
    assert not report.failed, report.failed


@pytest.fixture(scope="module")
def world(redis_url, neo4j_uri, llm_server, tmp_path_factory) -> Iterator[World]:
    run = uuid.uuid4().hex[:6]
    users, leaver = [f"iso-{run}-{n}" for n in range(8)], f"iso-{run}-leaver"
    llm_server.script(scripted)
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("isolation"), neo4j_uri=neo4j_uri, llm_url=llm_server.url
    ) as stack:
        client = stack.client
        items = _workload(users, leaver)
        result = client.wait(client.enqueue_many(items), timeout=300)
        assert len(result.applied) == len(items), result
        _cluster(client, [*users, leaver])
        sent: dict[str, set[str]] = {}
        for item in items:
            sent.setdefault(item["user_id"], set()).add(item["message_id"])
        yield World(
            stack=stack,
            users=users,
            leaver=leaver,
            sent=sent,
            secrets={u: SECRETS[n] for n, u in enumerate([*users, leaver])},
            pages={u: client.get_graph(u, page_size=1000) for u in [*users, leaver]},
        )
        for user in [*users, leaver]:
            client.forget_user(user)


class Violations(list[str]):
    """Collects every leak instead of stopping at the first, so one run shows the whole picture."""

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.append(what)


def _read_everything(world: World, user: str, found: Violations) -> int:
    """Every read API for ``user``; returns how many results came back (to prove the checks were not vacuous)."""
    client, facts, sent, chunks = world.client, world.facts(user), world.sent[user], world.chunks(user)
    foreign = world.others(user)
    foreign_secrets = [s for u, s in world.secrets.items() if u != user]
    statements = {f.statement for f in world.pages[user].facts}
    seen = 0
    for query in [*QUERIES, *(f"secret word {s}" for s in foreign_secrets)]:
        for as_of in (None, AS_OF):
            items = client.recall(user, query, k=10, as_of=as_of).items
            seen += len(items)
            for item in items:
                own = facts if item.kind == "fact" else chunks
                found.check(
                    item.id in own, f"recall({user}, {query!r}, as_of={as_of}) -> foreign {item.kind} {item.id}"
                )
                found.check(set(item.source_ids) <= sent, f"recall({user}) -> foreign sources {item.source_ids}")
        for cluster in client.search(user, query, detail_level="broad").clusters:
            seen += 1
            found.check(set(cluster.member_fact_ids) <= facts, f"search broad({user}) -> foreign cluster members")
        for item in client.search(user, query, detail_level="detailed").facts:
            own = facts if item.kind == "fact" else chunks
            found.check(item.id in own, f"search detailed({user}, {query!r}) -> foreign {item.kind} {item.id}")
        context = client.get_context(user, query)
        for line in (line for line in context.splitlines() if line.startswith("- ")):
            fact, said = _LINE.fullmatch(line), _EXCERPT.fullmatch(line)
            ok = bool(fact and fact[1] in statements) or bool(said and said[1] in chunks.values())
            found.check(ok, f"get_context({user}) -> foreign line {line!r}")
        found.check(not any(s in context for s in foreign_secrets), f"get_context({user}) -> a foreign secret")
    for subject in ("user", "Alex", *CITIES):
        for record in client.history(user, subject):
            seen += 1
            found.check(record.id in facts, f"history({user}, {subject!r}) -> foreign fact {record.id}")
            found.check(set(record.source_ids) <= sent, f"history({user}) -> foreign sources {record.source_ids}")

    page = client.get_graph(user, page_size=1000)
    entities = {e.id for e in page.entities}
    found.check({r.user_id for r in [*page.facts, *page.entities]} == {user}, f"get_graph({user}) -> foreign owner")
    found.check(not (facts | entities) & foreign, f"get_graph({user}) shares ids with other users")
    for f in page.facts:
        found.check({f.subject_id, f.object_id} - {None} <= entities, f"get_graph({user}) -> fact {f.id} edge out")
        found.check(set(f.source_ids) <= sent, f"get_graph({user}) -> fact {f.id} foreign sources")
    stats = client.stats(user)
    found.check(
        (stats.facts, stats.entities, stats.episodes) == (page.total_facts, len(entities), len(sent)),
        f"stats({user}) = {stats} does not count exactly the user's own graph",
    )
    index = VectorStore(root=world.stack.settings.index_dir, dim=client.reader.embedder.dim).load(user)
    found.check(index is not None and len(index) > 0, f"no FAISS index for {user}")
    if index is not None:
        found.check(index.node_ids() <= facts | entities | set(chunks), f"FAISS index of {user} holds foreign node ids")
    return seen


def test_every_read_api_returns_only_the_users_own_memory(world):
    found = Violations()
    seen = {user: _read_everything(world, user, found) for user in world.users}
    assert not found, "\n".join(found[:50])
    assert all(seen.values()), seen
    assert any(world.client.search(u, "work", detail_level="broad").clusters for u in world.users), "no clusters"


def test_no_node_links_to_another_users_node(world, neo4j_uri):
    users = [*world.users, world.leaver]
    with GraphDatabase.driver(neo4j_uri, auth=None) as driver:
        records, _, _ = driver.execute_query(
            "MATCH (a)-[r]-(b) WHERE a.user_id IN $users AND b.user_id <> a.user_id RETURN count(r) AS n",
            users=users,
        )
    assert records[0]["n"] == 0


@pytest.mark.parametrize("user_id", [None, "", " "], ids=repr)
@pytest.mark.parametrize("api", API_CALLS)
def test_a_missing_or_empty_user_id_fails_closed_on_every_api(world, api, user_id):
    call, field = API_CALLS[api]
    before = {u: world.client.stats(u) for u in world.users}
    with pytest.raises(InvalidInputError) as info:
        call(world.client, user_id)
    assert info.value.field == field
    assert {u: world.client.stats(u) for u in world.users} == before


def _everything_of(world: World, user: str) -> tuple[Any, ...]:
    client = world.client
    return (
        client.stats(user),
        client.get_graph(user, page_size=1000),
        [i.id for i in client.recall(user, "where does the user live?").items],
        client.reader.keeper.vectors.path_for(user).read_bytes(),
    )


def _redis_keys_of(client: MemoryClient, user: str) -> set[str]:
    found = {k for pattern in keys.user_keys_pattern(user) for k in client.redis.scan_iter(match=pattern)}
    return found | ({keys.user_version(user)} if client.redis.exists(keys.user_version(user)) else set())


def test_forget_user_leaves_every_other_user_untouched(world):
    client, leaver = world.client, world.leaver
    before = {u: _everything_of(world, u) for u in world.users}
    redis_before = {u: _redis_keys_of(client, u) for u in world.users}
    assert all(redis_before.values())

    removed = client.forget_user(leaver)
    assert removed.facts == len(world.pages[leaver].facts) and removed.episodes == len(world.sent[leaver])
    assert {u: _everything_of(world, u) for u in world.users} == before
    for user, owned in redis_before.items():
        assert owned <= set(client.redis.scan_iter(count=1000)), f"forget_user({leaver}) deleted keys of {user}"

    assert not client.reader.keeper.vectors.path_for(leaver).exists()
    assert client.stats(leaver).facts == 0 and client.get_graph(leaver).facts == []
    assert client.recall(leaver, "where does the user live?").items == []


@pytest.fixture
def global_weights(world, neo4j_uri) -> Iterator[Callable[[], LearnedWeights | None]]:
    """Fleet-wide learned weights for the duration of the test; whatever was there before comes back."""
    graph = world.client.graph
    previous = graph.load_weights(GLOBAL_SCOPE)
    weights = {"alpha": 0.5, "beta": 0.3, "gamma": 0.2, "recency_weight": 0.1, "importance_weight": 0.1}
    graph.save_weights(LearnedWeights(scope=GLOBAL_SCOPE, **weights, samples=500, quality=0.8))
    yield lambda: graph.load_weights(GLOBAL_SCOPE)
    if previous is not None:
        graph.save_weights(previous)
        return
    with GraphDatabase.driver(neo4j_uri, auth=None) as driver:
        driver.execute_query("MATCH (w:Weights {scope: $scope}) DELETE w", scope=GLOBAL_SCOPE)


def test_no_user_can_forget_the_fleets_learned_weights(world, global_weights):
    """Weights are stored by scope and a user's scope is its id, so a user named like the fleet-wide scope
    would share its row: such a user must be refused, or at least forgetting it must leave the row."""
    client = world.client
    with suppress(InvalidInputError):
        client.wait(client.enqueue(GLOBAL_SCOPE, "I live in Austin.", timestamp=T0), timeout=SETTLE_S)
    with suppress(InvalidInputError):
        client.forget_user(GLOBAL_SCOPE)
    assert global_weights() is not None, f"forget_user({GLOBAL_SCOPE!r}) deleted the fleet-wide learned weights"
