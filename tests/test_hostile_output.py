"""Hostile model output: whatever the LLM answers, it can neither inject a query, nor reach another user's
memory, nor grow the graph schema.

Model text is untrusted. It may only ever become a property value (statements, names, aliases, summaries);
labels map onto ``engram_api.naming.LABELS`` (the stated bound), predicates onto ``^[A-Z0-9_]{1,40}$``, and
fields the schema does not know are dropped. Checked twice: (a) the pure functions, with consolidation
planning against a real embedded SQLite store and the real embedder; (b) the real pipeline on real Neo4j
with the LLM stand-in answering hostile JSON, comparing the database schema before and after.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from neo4j import GraphDatabase

from engram_api import MemoryClient
from engram_api.errors import LLMError
from engram_api.models import DeadLetter, GraphPage, UserStats
from engram_api.naming import LABELS, sanitize_label, sanitize_predicate, self_entity_id
from engram_api.producer import build_envelope
from engram_testing.llm_standin import Reply
from engram_workers.consolidation.plan import Planned
from engram_workers.extraction.answer import parse_extraction
from tests.support.extractions import entity, fact, message_text
from tests.support.memory import apply_extraction, remember
from tests.support.stack import SETTLE_S, Stack, engram_stack

T0 = datetime(2024, 2, 1, 9, 0, tzinfo=UTC)
PREDICATE_RE = re.compile(r"^[A-Z0-9_]{1,40}$")

# Query fragments, quoting tricks and look-alikes a model could be talked into emitting (prompt injection).
INJECTIONS = [
    "Person`) DETACH DELETE n //",
    "`Person`",
    "'; MATCH (n) DETACH DELETE n //",
    '"; MATCH (n) DETACH DELETE n //',
    "})-[:X]->(",
    "]->(m) SET m.user_id = 'victim' //",
    "{evil: true}",
    "${user_id}",
    "Pеrson",  # Cyrillic 'е'
    "Plаce",  # Cyrillic 'а'
    "Ｐｅｒｓｏｎ",  # fullwidth
    "ＷＯＲＫＳ＿ＡＴ",
    "LIVES_IN`]->(x) DETACH DELETE x //",
    "\u202eNOSREP",  # right-to-left override
    "a\x00b\x1b[2J",
    "x" * 100,
]
# Any text at all, lone surrogates included: JSON carries them as "\ud800" escapes.
ANY_TEXT = st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=60)
# Any text a store can hold (no lone surrogates, not empty: names, predicates and statements must have a
# character): what the schema accepts, so it reaches the storage checks of the property tests.
STORABLE_TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60)
# Fields no extraction schema has, at every level: models add such fields freely.
UNKNOWN_FIELDS = {"confidence": 0.93, "cypher": "MATCH (n) DETACH DELETE n", "owner_user_id": "victim"}
# A plain answer (nothing in it resembles the other hostile answers, so it is never merged into them).
PLAIN_ANSWER = {
    "entities": [entity("e1", "Quokka Island", "Place")],
    "facts": [fact("user", "VISITED", "e1", "User visited Quokka Island")],
}


@dataclass(frozen=True)
class Target:
    """Another user's ids for a hostile answer to aim at."""

    user: str
    entity_id: str
    fact_id: str


def hostile_answer(target: Target) -> dict[str, Any]:
    """Everything at once, with values only: injections in every text field, and another user's self node,
    entity and fact ids as entity refs, subjects, objects and ``updates``."""
    entities = [
        entity(f"e{i}", f"Name {i} {text}", text, aliases=[f"{text} #{i}"], summary=text)
        for i, text in enumerate(INJECTIONS)
    ]
    entities.append(entity(self_entity_id(target.user), "Hijacked self", "Person"))
    facts = [
        fact("user", text, f"e{i}", f"User said {text} #{i}", updates=target.fact_id)
        for i, text in enumerate(INJECTIONS)
    ]
    facts += [
        fact(self_entity_id(target.user), "OWNS", "e0", "The other user's self node owns e0"),
        fact("e1", "WORKS_AT", target.entity_id, "e1 works at the other user's entity"),
        fact(target.entity_id, "LIKES", "e2", "The other user's entity likes e2"),
    ]
    return {"entities": entities, "facts": facts}


def many_labels_answer(batch: int, size: int = 100) -> dict[str, Any]:
    """``size`` entities with distinct hostile labels (distinct across batches too), one fact about each."""
    labels = [f"{INJECTIONS[i % len(INJECTIONS)][:60]} kind{batch}x{i}" for i in range(size)]
    return {
        "entities": [entity(f"e{i}", f"thing {batch}-{i}", label) for i, label in enumerate(labels)],
        "facts": [fact(f"e{i}", f"REL`{batch}x{i}`", None, f"Thing {batch}-{i} exists") for i in range(size)],
    }


def with_unknown_fields(answer: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **UNKNOWN_FIELDS,
        "entities": [{**e, **UNKNOWN_FIELDS} for e in answer["entities"]],
        "facts": [{**f, **UNKNOWN_FIELDS} for f in answer["facts"]],
    }


def new_user(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Picture:
    """Everything the reader shows of one user; compared before and after hostile input."""

    stats: UserStats
    page: GraphPage

    @classmethod
    def of(cls, client: MemoryClient, user: str) -> Picture:
        return cls(stats=client.stats(user), page=client.get_graph(user, page_size=1000))

    @property
    def ids(self) -> set[str]:
        return {f.id for f in self.page.facts} | {e.id for e in self.page.entities}

    def target(self) -> Target:
        return Target(user=self.stats.user_id, entity_id=self.page.entities[0].id, fact_id=self.page.facts[0].id)


def check_bounded(page: GraphPage) -> None:
    assert {e.label for e in page.entities} <= LABELS
    bad = [f.predicate for f in page.facts if not PREDICATE_RE.fullmatch(f.predicate)]
    assert not bad, bad


def check_contained(picture: Picture) -> None:
    """Every record and every edge of the user stays inside the user's own graph."""
    entity_ids = {e.id for e in picture.page.entities}
    assert all(r.user_id == picture.stats.user_id for r in [*picture.page.facts, *picture.page.entities])
    assert all(f.subject_id in entity_ids and f.object_id in {None, *entity_ids} for f in picture.page.facts)


# --------------------------------------------------------------------------------------- (a) pure functions


@pytest.mark.parametrize("text", INJECTIONS)
def test_hostile_labels_and_predicates_are_sanitized(text):
    assert sanitize_label(text) in LABELS
    assert PREDICATE_RE.fullmatch(sanitize_predicate(text))


def test_ten_thousand_distinct_labels_stay_within_the_bound():
    labels = {f"{text} {i}" for i in range(10_000 // len(INJECTIONS) + 1) for text in INJECTIONS}
    assert len(labels) >= 10_000
    assert {sanitize_label(label) for label in labels} <= LABELS


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_any_label_or_predicate_is_sanitized(text):
    assert sanitize_label(text) in LABELS
    assert PREDICATE_RE.fullmatch(sanitize_predicate(text))


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_a_sanitized_predicate_is_a_fixed_point(text):
    """history() sanitizes the predicate its caller passes, so a stored predicate must map to itself
    (see test_a_stored_predicate_finds_its_facts_again for what breaks otherwise)."""
    predicate = sanitize_predicate(text)
    assert sanitize_predicate(predicate) == predicate


def test_parse_extraction_keeps_hostile_text_verbatim():
    answer = hostile_answer(Target(user="victim", entity_id="ent_victim", fact_id="fact_victim"))
    parsed = parse_extraction(json.dumps(answer))
    assert [e.label for e in parsed.entities][: len(INJECTIONS)] == INJECTIONS
    assert [f.predicate for f in parsed.facts][: len(INJECTIONS)] == INJECTIONS
    assert [f.statement for f in parsed.facts] == [f["statement"] for f in answer["facts"]]


def test_parse_extraction_ignores_unknown_fields():
    parsed = parse_extraction(json.dumps(with_unknown_fields(PLAIN_ANSWER)))
    assert parsed == parse_extraction(json.dumps(PLAIN_ANSWER))


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="deeply-nested"),
        pytest.param(
            '{"facts": [{"subject": "user", "predicate": "AGE", "statement": "x", "importance": ' + "9" * 5000 + "}]}",
            id="5000-digit-number",
        ),
        pytest.param('{"entities": [{"ref": "e1", "name": "' + "n" * 10_000 + '"}]}', id="over-long-name"),
        pytest.param('{"facts": "MATCH (n) DETACH DELETE n"}', id="wrong-type"),
        pytest.param('["entities", "facts"]', id="not-an-object"),
    ],
)
def test_unusable_answers_are_a_typed_llm_error(raw):
    """The extract stage dead-letters an LLMError with the raw answer kept; anything else is a worker crash
    (retried as a bug, dead-lettered without the answer). An answer whose only item is unusable is one too;
    one bad item beside good ones (or a NaN importance) is skipped or repaired: tests/test_llm_extraction.py."""
    with pytest.raises(LLMError) as info:
        parse_extraction(raw)
    assert info.value.raw == raw and not info.value.transient


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        pytest.param(
            {"facts": [fact("user", "LIKES", None, "User likes \ud800 tea")]}, "facts.0.statement", id="lone-surrogate"
        ),
        pytest.param({"entities": [entity("e1", "Tea\udfff", "Food")]}, "entities.0.name", id="lone-surrogate-name"),
        pytest.param(
            {"facts": [fact("user", "MOVED", None, "moved", valid_from="2024-01-05T10:00:00")]},
            None,
            id="naive-valid-from",
        ),
    ],
)
def test_parsed_answers_are_safe_to_store(answer, field):
    """What parse_extraction accepts must be storable: every string UTF-8 encodable (SQLite, the tokenizer
    and Bolt all refuse lone surrogates) and every datetime timezone-aware (a naive one cannot be ordered
    against the stored aware ones). Text it cannot store may instead be rejected, naming the ``field``."""
    try:
        parsed = parse_extraction(json.dumps(answer))
    except LLMError as exc:
        assert field is not None and field in str(exc), exc
        return
    for text in _strings(parsed.model_dump()):
        text.encode("utf-8")
    assert all(f.valid_from is None or f.valid_from.utcoffset() is not None for f in parsed.facts)
    assert parsed.facts or parsed.entities


# ------------------------------------------------ (a) consolidation on the embedded SQLite store, real embedder


@pytest.fixture(scope="module")
def local(redis_url, tmp_path_factory) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("hostile-local"),
        neo4j_uri=None,
        llm_url=None,
        workers=False,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def local_victim(local) -> str:
    user = new_user("victim")
    remember(local.client, user, ["I live in Austin.", "My brother Alex works at Amazon.", "I moved to Denver."], T0)
    return user


def _ingest_answer(client: MemoryClient, user: str, answer: Mapping[str, Any], n: int) -> Planned:
    envelope = build_envelope(client.settings, user, f"hostile message {n}", message_id=f"h-{n}", timestamp=T0)
    return apply_extraction(client, envelope, parse_extraction(json.dumps(answer)))


def test_consolidation_keeps_hostile_output_inside_its_user(local, local_victim):
    client, user = local.client, new_user("hostile")
    victim_before = Picture.of(client, local_victim)
    answer = hostile_answer(victim_before.target())
    planned = _ingest_answer(client, user, answer, 0)

    plan = planned.plan
    records = [plan.episode, *plan.new_entities, *plan.new_facts]
    assert {r.user_id for r in records} == {user}
    assert not {*plan.mentioned_entity_ids, *plan.reinforced_fact_ids} & victim_before.ids
    assert not {c.id for c in [*plan.fact_changes, *plan.entity_changes]} & victim_before.ids

    assert Picture.of(client, local_victim) == victim_before
    mine = Picture.of(client, user)
    assert not mine.ids & victim_before.ids
    check_contained(mine)
    check_bounded(mine.page)
    # Hostile text survives verbatim, as values: statements, names, aliases, summaries. A fact hanging on
    # another user's entity id (listed nowhere in this answer) is skipped: an id never becomes a new entity.
    foreign = {victim_before.target().entity_id}
    kept = {f["statement"] for f in answer["facts"] if not {f["subject"], f["object"]} & foreign}
    assert kept <= {f.statement for f in mine.page.facts}
    assert not {e.name for e in mine.page.entities} & foreign
    names = {e.name: e for e in mine.page.entities}
    for i, text in enumerate(INJECTIONS):
        stored = names[f"Name {i} {text}"]
        assert stored.aliases == [f"{text} #{i}"] and stored.summary == text


def test_a_stored_predicate_finds_its_facts_again(local):
    """The model's predicate is sanitized on write; history() sanitizes the caller's predicate again, so
    the stored form must be a fixed point or its facts cannot be asked for by predicate."""
    client, user = local.client, new_user("pred")
    answer = {"entities": [], "facts": [fact("user", "owns_3d_printer", None, "User owns a 3D printer")]}
    _ingest_answer(client, user, answer, 0)
    stored = client.get_graph(user).facts[0].predicate
    assert [f.statement for f in client.history(user, "user", stored)] == ["User owns a 3D printer"]


def test_hundreds_of_distinct_labels_across_messages_store_only_known_labels(local):
    client, user = local.client, new_user("labels")
    answers = [many_labels_answer(batch) for batch in range(3)]
    assert len({e["label"] for answer in answers for e in answer["entities"]}) == 300
    planned = [_ingest_answer(client, user, answer, n) for n, answer in enumerate(answers)]
    assert {e.label for p in planned for e in p.plan.new_entities} <= LABELS
    check_bounded(client.get_graph(user, page_size=1000))


def _answers(text: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    refs = st.sampled_from(["user", "e0", "e1"]) | text
    entities = st.fixed_dictionaries(
        {"ref": st.sampled_from(["e0", "e1"]) | text, "name": text, "label": text},
        optional={"aliases": st.lists(text, max_size=3), "summary": text},
    )
    facts = st.fixed_dictionaries(
        {"subject": refs, "predicate": text, "statement": text},
        optional={
            "object": st.none() | refs,
            "importance": st.floats(0, 1),
            "single_valued": st.booleans(),
            "memory_type": st.sampled_from(["semantic", "episodic", "procedural"]),
        },
    )
    return st.fixed_dictionaries({"entities": st.lists(entities, max_size=4), "facts": st.lists(facts, max_size=4)})


def _store_or_reject(client: MemoryClient, answer: dict[str, Any]) -> str:
    """``answer`` through parse, plan and write for a fresh user, checked against the bounds; the outcome."""
    try:
        extraction = parse_extraction(json.dumps(answer))
    except LLMError:
        return "rejected"
    user = new_user("prop")
    envelope = build_envelope(client.settings, user, "anything", message_id="m-0", timestamp=T0)
    apply_extraction(client, envelope, extraction)
    mine = Picture.of(client, user)
    check_bounded(mine.page)
    check_contained(mine)
    return "stored"


STORABLE_EXAMPLES = 60


def test_any_storable_answer_is_stored_within_bounds(local):
    """Property: an arbitrary answer without lone surrogates plans, applies and stays in bounds. Most such
    answers must really reach the store (a strategy the parser rejects would test nothing)."""
    outcomes: list[str] = []

    @settings(max_examples=STORABLE_EXAMPLES, deadline=None)
    @given(answer=_answers(STORABLE_TEXT))
    def check(answer: dict[str, Any]) -> None:
        outcome = _store_or_reject(local.client, answer)
        event(outcome)
        outcomes.append(outcome)

    check()
    assert outcomes.count("stored") >= STORABLE_EXAMPLES * 3 // 4, Counter(outcomes)


@settings(max_examples=40, deadline=None)
@given(answer=_answers(ANY_TEXT))
def test_any_answer_is_rejected_or_stored_within_bounds(local, answer):
    """Property: any answer, lone surrogates included, is an LLMError or is stored within bounds."""
    event(_store_or_reject(local.client, answer))


# ----------------------------------------------------------------------- (b) the real pipeline on real Neo4j

# The hostile user's messages; the stand-in answers each by its text (see ``_script``).
HOSTILE_VALUES, UNKNOWN_FIELDS_MSG, TOO_LONG, NESTED, SURROGATE = (
    "hostile values",
    "hostile unknown fields",
    "hostile too long",
    "hostile nested",
    "hostile surrogate",
)
MANY_LABELS = [f"hostile labels {batch}" for batch in range(3)]
# The victim's warm-up exercises every write path first (supersession, aliases, entity changes), so any
# property key the hostile messages could add would be new.
VICTIM_SCRIPT = {
    "I live in Tampa.": {
        "entities": [entity("e1", "Tampa", "City", aliases=["Tampa FL"], summary="a city in Florida")],
        "facts": [fact("user", "LIVES_IN", "e1", "User lives in Tampa", single_valued=True)],
    },
    "I moved to Austin.": {
        "entities": [entity("e1", "Austin", "City")],
        "facts": [fact("user", "LIVES_IN", "e1", "User lives in Austin", single_valued=True)],
    },
    "My brother Alex works at Amazon.": {
        "entities": [entity("e1", "Alex", "Person", aliases=["my brother"]), entity("e2", "Amazon", "Company")],
        "facts": [
            fact("user", "HAS_BROTHER", "e1", "User has a brother named Alex", importance=0.7),
            fact("e1", "WORKS_AT", "e2", "Alex works at Amazon", single_valued=True),
        ],
    },
    "Alex, also called Al, likes chess.": {
        "entities": [entity("e1", "Alex", "Person", aliases=["Al"]), entity("e2", "chess", "Activity")],
        "facts": [fact("e1", "LIKES", "e2", "Alex likes chess", memory_type="episodic")],
    },
}


@dataclass
class HostileRun:
    victim: str
    hostile: str
    victim_before: Picture
    victim_after: Picture
    hostile_after: Picture
    schema_before: dict[str, list[str]]
    schema_after: dict[str, list[str]]
    stored_labels: set[str]  # every label of the hostile user's entities, with a fact or not
    stored_predicates: set[str]
    others_before: int
    others_after: int
    applied: list[str]
    dead: dict[str, DeadLetter]
    answers: dict[str, str]


def _schema(driver: Any) -> dict[str, list[str]]:
    out = {}
    for name, proc in [("labels", "db.labels"), ("types", "db.relationshipTypes"), ("keys", "db.propertyKeys")]:
        records, _, _ = driver.execute_query(f"CALL {proc}()")
        out[name] = sorted(r[0] for r in records)
    return out


def _stored(driver: Any, query: str, user: str) -> set[str]:
    records, _, _ = driver.execute_query(query, u=user)
    return {r[0] for r in records}


def _count_not_of(driver: Any, user: str) -> int:
    """Nodes and relationships that do not belong to ``user``: every other test's and user's data too."""
    records, _, _ = driver.execute_query(
        "MATCH (n) WHERE n.user_id IS NULL OR n.user_id <> $u "
        "OPTIONAL MATCH (n)-[r]-() RETURN count(DISTINCT n) + count(DISTINCT r) AS c",
        u=user,
    )
    return int(records[0]["c"])


@pytest.fixture(scope="module")
def hostile_run(redis_url, neo4j_uri, llm_server, tmp_path_factory) -> Iterator[HostileRun]:
    victim, hostile = new_user("victim"), new_user("hostile")
    answers: dict[str, str] = {}

    def script(request: dict[str, Any]) -> Reply:
        text = message_text(request)
        if text in VICTIM_SCRIPT:
            return Reply.json(VICTIM_SCRIPT[text])
        return Reply(content=answers[text])

    llm_server.script(script)
    with (
        engram_stack(
            redis_url=redis_url,
            data_dir=tmp_path_factory.mktemp("hostile-fleet"),
            neo4j_uri=neo4j_uri,
            llm_url=llm_server.url,
        ) as stack,
        GraphDatabase.driver(neo4j_uri, auth=None) as driver,
    ):
        client = stack.client
        warm_up = [
            client.enqueue(victim, text, message_id=f"v{i}", timestamp=T0 + timedelta(days=10 * i))
            for i, text in enumerate(VICTIM_SCRIPT)
        ]
        assert len(client.wait(warm_up, timeout=SETTLE_S).applied) == len(VICTIM_SCRIPT)
        victim_before = Picture.of(client, victim)
        values = hostile_answer(victim_before.target())
        answers.update(
            {
                HOSTILE_VALUES: json.dumps(values),
                UNKNOWN_FIELDS_MSG: json.dumps(with_unknown_fields(PLAIN_ANSWER)),
                TOO_LONG: json.dumps({"entities": [entity("e1", "n" * 10_000, "Person" * 1000)]}),
                # Deeper than Python's recursion limit, shorter than the 20,000 characters a dead letter keeps.
                NESTED: '{"entities": ' + "[" * 5_000 + "]" * 5_000 + "}",
                SURROGATE: json.dumps({"facts": [fact("user", "LIKES", None, "User likes \ud800 tea")]}),
                **{text: json.dumps(many_labels_answer(batch)) for batch, text in enumerate(MANY_LABELS)},
            }
        )
        schema_before, others_before = _schema(driver), _count_not_of(driver, hostile)

        receipts = [client.enqueue(hostile, text, message_id=f"h{i}") for i, text in enumerate(answers)]
        result = client.wait(receipts, timeout=SETTLE_S)
        by_id = {r.message_id: text for r, text in zip(receipts, answers, strict=True)}
        yield HostileRun(
            victim=victim,
            hostile=hostile,
            victim_before=victim_before,
            victim_after=Picture.of(client, victim),
            hostile_after=Picture.of(client, hostile),
            schema_before=schema_before,
            schema_after=_schema(driver),
            stored_labels=_stored(driver, "MATCH (e:Entity {user_id: $u}) RETURN DISTINCT e.label", hostile),
            stored_predicates=_stored(driver, "MATCH (f:Fact {user_id: $u}) RETURN DISTINCT f.predicate", hostile),
            others_before=others_before,
            others_after=_count_not_of(driver, hostile),
            applied=[by_id[m] for m in result.applied],
            dead={by_id[d.message_id]: d for d in client.dead_letters(hostile)},
            answers=answers,
        )
        client.forget_user(hostile)
        client.forget_user(victim)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module fixture runs two pipeline rounds on a cold fleet
def test_pipeline_leaves_every_other_users_data_intact(hostile_run):
    assert hostile_run.victim_after == hostile_run.victim_before
    assert hostile_run.others_after == hostile_run.others_before
    assert not hostile_run.hostile_after.ids & hostile_run.victim_before.ids


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module fixture runs two pipeline rounds on a cold fleet
def test_pipeline_schema_does_not_grow(hostile_run):
    """Labels, relationship types and property keys are the code's own: model text never becomes one."""
    assert hostile_run.schema_after == hostile_run.schema_before


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module fixture runs two pipeline rounds on a cold fleet
def test_pipeline_stores_hostile_text_only_as_bounded_values(hostile_run):
    assert {HOSTILE_VALUES, *MANY_LABELS} <= set(hostile_run.applied)
    assert hostile_run.stored_labels <= LABELS
    assert all(PREDICATE_RE.fullmatch(p) for p in hostile_run.stored_predicates), hostile_run.stored_predicates
    page = hostile_run.hostile_after.page
    check_bounded(page)
    check_contained(hostile_run.hostile_after)
    statements = {f.statement for f in page.facts}
    foreign = hostile_run.victim_before.target().entity_id  # an id never becomes an entity: its facts are skipped
    facts = json.loads(hostile_run.answers[HOSTILE_VALUES])["facts"]
    assert {f["statement"] for f in facts if foreign not in (f["subject"], f["object"])} <= statements
    assert {e.name for e in page.entities} >= {f"Name {i} {text}" for i, text in enumerate(INJECTIONS)}


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module fixture runs two pipeline rounds on a cold fleet
def test_pipeline_ignores_unknown_fields(hostile_run):
    assert UNKNOWN_FIELDS_MSG in hostile_run.applied, hostile_run.dead.get(UNKNOWN_FIELDS_MSG)
    assert "User visited Quokka Island" in {f.statement for f in hostile_run.hostile_after.page.facts}


@pytest.mark.slow
@pytest.mark.timeout(900)  # the module fixture runs two pipeline rounds on a cold fleet
@pytest.mark.parametrize(("text", "storable"), [(TOO_LONG, False), (NESTED, False), (SURROGATE, True)])
def test_pipeline_rejects_unusable_answers_at_extraction_with_the_answer_kept(hostile_run, text, storable):
    """An answer the pipeline cannot store is the model's failure: dead-lettered by the extract stage with
    the raw answer for the operator, never a crash of the apply stage. A lone surrogate may instead be
    repaired and the message applied."""
    if storable and text in hostile_run.applied:
        statements = {f.statement for f in hostile_run.hostile_after.page.facts}
        assert any(s.startswith("User likes") and s.endswith("tea") for s in statements), statements
        return
    letter = hostile_run.dead.get(text)
    assert letter is not None, f"{text!r} was applied"
    assert (letter.stage, letter.raw_llm) == ("extract", hostile_run.answers[text]), letter.reason
