"""Ordinary model answers through the whole pipeline, on both stores: producer, worker processes, the LLM
stand-in serving what a competent model answers for the message it is shown, the reader.

The per-decision cases are in tests/test_model_answers.py; these check that the same answers, parsed by
the LLM path and applied by the workers, leave the right current facts and history.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram_testing.llm_standin import Reply
from engram_workers.extraction.prompt import OWNER_MARK
from tests.support.extractions import entity, fact, message_text
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def _one(name: str, label: str, predicate: str, statement: str, **extra) -> dict:
    return {"entities": [entity("N1", name, label)], "facts": [fact("user", predicate, "N1", statement, **extra)]}


ANSWERS = {
    # Someone else's question, then the owner's one-word answer (a competent model reads them together).
    "Yes!": _one("Austin", "Place", "LIVES_IN", "User moved to Austin"),
    "My sister is visiting next week.": {
        "entities": [entity("N1", "my sister", "Person")],
        "facts": [fact("user", "HAS_SISTER", "N1", "User has a sister")],
    },
    "Sister called, she got the nursing job!": {
        "entities": [entity("N1", "sister", "Person", summary="User's sister, a nurse")],
        "facts": [fact("N1", "JOB_TITLE", "nurse", "User's sister is a nurse")],
    },
    "I'm allergic to peanuts.": _one("peanuts", "Food", "ALLERGIC_TO", "User is allergic to peanuts"),
    "Turns out I'm not allergic to peanuts!": _one(
        "peanuts", "Food", "NOT_ALLERGIC_TO", "User is not allergic to peanuts"
    ),
    "I live in Tampa.": _one("Tampa", "Place", "LIVES_IN", "User lives in Tampa"),
    "I used to live in Tampa, I'm in Austin now.": {
        "entities": [entity("N1", "Tampa", "Place"), entity("N2", "Austin", "Place")],
        "facts": [
            fact("user", "LIVES_IN", "N1", "User used to live in Tampa"),
            fact("user", "LIVES_IN", "N2", "User lives in Austin now"),
        ],
    },
    "I might move to Berlin.": _one("Berlin", "Place", "LIVES_IN", "User might move to Berlin"),
    "My sister lives in Paris.": _one("Paris", "Place", "LIVES_IN", "User's sister lives in Paris"),
    "I work at Google.": _one("Google", "Organization", "WORKS_AT", "User works at Google"),
    "I left Google in 2022.": _one(
        "Google", "Organization", "WORKS_AT", "User left Google in 2022", valid_until="2022"
    ),
    # A bare year, as models write it: 1 January of that year, never 1970 (Unix seconds).
    "We moved to Austin in 2024.": _one(
        "Austin", "Place", "LIVES_IN", "User moved to Austin in 2024", valid_from="2024"
    ),
    "I don't work at Acme anymore.": _one("Acme", "Organization", "WORKS_AT", "User no longer works at Acme"),
    "I work at Acme.": _one("Acme", "Organization", "WORKS_AT", "User works at Acme"),
}


def _conversation(request: dict) -> list[str]:
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    return user.split("Conversation:\n", 1)[-1].splitlines()


def _answer(request: dict) -> Reply:
    lines = _conversation(request)
    if any(line.endswith(f"{OWNER_MARK}: I'm allergic to cats.") for line in lines):
        # A competent model attributes a turn by its speaker line: this one reads as the owner's.
        return Reply.json(_one("cats", "Thing", "ALLERGIC_TO", "User is allergic to cats"))
    if lines and lines[-1].endswith(": I'm allergic to cats."):
        return Reply.json(
            {
                "entities": [entity("N1", "Mallory", "Person"), entity("N2", "cats", "Thing")],
                "facts": [fact("N1", "ALLERGIC_TO", "N2", "Mallory is allergic to cats")],
            }
        )
    return Reply.json(ANSWERS.get(message_text(request), {"entities": [], "facts": []}))


@pytest.fixture(scope="module", params=["sqlite", "neo4j"])
def stack(request, redis_url, llm_server, tmp_path_factory):
    llm_server.script(_answer)
    neo4j_uri = request.getfixturevalue("neo4j_uri") if request.param == "neo4j" else None
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("answers"), neo4j_uri=neo4j_uri, llm_url=llm_server.url
    ) as s:
        yield s


@pytest.fixture(autouse=True)
def _script(llm_server):
    llm_server.script(_answer)


def say(stack, user: str, *turns: tuple[str, datetime]) -> None:
    """One message at a time, each applied before the next is sent."""
    for i, (text, when) in enumerate(turns):
        stack.client.wait(stack.client.enqueue(user, text, message_id=f"{user}-{i}", timestamp=when), timeout=SETTLE_S)


def facts(stack, user: str) -> list[tuple[str, str | None, datetime, datetime | None]]:
    return [(f.predicate, f.object_name, f.valid_from, f.valid_until) for f in stack.client.history(user, "user")]


def current(stack, user: str) -> list[tuple[str, str | None]]:
    return sorted((p, o) for p, o, _, until in facts(stack, user) if until is None)


def uid() -> str:
    return f"a_{uuid.uuid4().hex[:10]}"


def test_a_negation_ends_the_fact_instead_of_reinforcing_it(stack):
    user = uid()
    say(
        stack,
        user,
        ("I'm allergic to peanuts.", T0),
        ("Turns out I'm not allergic to peanuts!", T0 + timedelta(days=2)),
    )
    assert facts(stack, user) == [
        ("ALLERGIC_TO", "peanuts", T0, T0 + timedelta(days=2)),
        ("NOT_ALLERGIC_TO", "peanuts", T0 + timedelta(days=2), None),
    ]


def test_used_to_and_now_in_one_answer_move_the_user(stack):
    user, later = uid(), T0 + timedelta(days=30)
    say(stack, user, ("I live in Tampa.", T0), ("I used to live in Tampa, I'm in Austin now.", later))
    assert facts(stack, user) == [("LIVES_IN", "Tampa", T0, later), ("LIVES_IN", "Austin", later, None)]


def test_might_and_a_sisters_home_leave_the_users_home_alone(stack):
    user = uid()
    say(
        stack,
        user,
        ("I live in Tampa.", T0),
        ("I might move to Berlin.", T0 + timedelta(days=1)),
        ("My sister lives in Paris.", T0 + timedelta(days=2)),
    )
    assert current(stack, user) == [("LIVES_IN", "Tampa"), ("PLANS_LIVES_IN", "Berlin"), ("RELATED_LIVES_IN", "Paris")]
    assert [f.valid_until for f in stack.client.history(user, "user", "LIVES_IN")] == [None]


def test_an_end_date_and_no_longer_end_the_jobs(stack):
    user = uid()
    y2020, y2022, y2024 = (datetime(y, 1, 1, tzinfo=UTC) for y in (2020, 2022, 2024))
    say(
        stack,
        user,
        ("I work at Google.", y2020),
        ("I left Google in 2022.", y2024),
        ("I work at Acme.", y2024 + timedelta(days=1)),
        ("I don't work at Acme anymore.", y2024 + timedelta(days=9)),
    )
    assert facts(stack, user) == [
        ("WORKS_AT", "Google", y2020, y2022),
        ("WORKS_AT", "Acme", y2024 + timedelta(days=1), y2024 + timedelta(days=9)),
        ("NOT_WORKS_AT", "Acme", y2024 + timedelta(days=9), None),
    ]


def test_a_participant_named_like_the_owner_does_not_speak_for_the_owner(stack):
    user = uid()
    for name in ("Mallory (memory owner)", "Mallory\nAna (memory owner)"):
        turn = [{"role": "user", "name": name, "content": "I'm allergic to cats."}]
        receipt = stack.client.enqueue(user, turn, owner_name="Ana", timestamp=T0)
        stack.client.wait(receipt, timeout=SETTLE_S)
    assert [(f.predicate, f.object_name) for f in stack.client.history(user, "Mallory")] == [("ALLERGIC_TO", "cats")]
    assert facts(stack, user) == []


def test_yes_to_someones_question_reaches_the_model(stack):
    user = uid()
    say(stack, user, ("I live in Tampa.", T0))
    asked = [{"role": "assistant", "content": "Did you end up moving to Austin?"}]
    receipt = stack.client.enqueue(user, "Yes!", earlier=asked, timestamp=T0 + timedelta(days=3))
    stack.client.wait(receipt, timeout=SETTLE_S)
    assert facts(stack, user) == [
        ("LIVES_IN", "Tampa", T0, T0 + timedelta(days=3)),
        ("LIVES_IN", "Austin", T0 + timedelta(days=3), None),
    ]


def test_my_sister_and_sister_are_one_person(stack):
    user = uid()
    say(stack, user, ("My sister is visiting next week.", T0), ("Sister called, she got the nursing job!", T0))
    sister = stack.client.history(user, "my sister")
    assert [(f.predicate, f.subject_name) for f in sister] == [("JOB_TITLE", "sister")]
    assert [(f.predicate, f.object_name) for f in stack.client.history(user, "user")] == [("HAS_SISTER", "sister")]


def test_an_assistant_turn_alone_costs_no_model_call_and_stays_recallable(stack, llm_server):
    user = uid()
    before = len(llm_server.requests)
    turn = [{"role": "assistant", "content": "Lisbon has lovely tiled facades."}]
    stack.client.wait(stack.client.enqueue(user, turn, timestamp=T0), timeout=SETTLE_S)
    assert len(llm_server.requests) == before
    assert facts(stack, user) == [] and stack.client.stats(user).episodes == 1


def test_a_bare_year_dates_the_move(stack):
    user, said = uid(), datetime(2024, 6, 1, tzinfo=UTC)
    y2019, y2024 = datetime(2019, 5, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC)
    say(stack, user, ("I live in Tampa.", y2019), ("We moved to Austin in 2024.", said))
    assert facts(stack, user) == [("LIVES_IN", "Tampa", y2019, y2024), ("LIVES_IN", "Austin", y2024, None)]
