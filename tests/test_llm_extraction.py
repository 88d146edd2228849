"""LLM extraction as real models answer it (issue 17): real worker processes, real Redis, SQLite, and the LLM
stand-in behind litellm answering the way real models plausibly do (a rebound "user", context handles,
prose around the JSON, a 1-10 importance, a date in words, a top-level list, a plan dated ahead).

Each test checks both ends: what the model was shown (the request body the stand-in received) and what the
graph holds afterwards; nothing a tolerant reader can keep is dead-lettered.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_api.errors import ConfigError, InvalidInputError
from engram_api.models import ExtractedEntity, ExtractedFact, Extraction, FactRecord
from engram_api.naming import self_entity_id
from engram_api.settings import Settings, load_settings
from engram_testing.llm_standin import LLMStandin, RecordedRequest, Reply
from engram_workers.extraction.llm import call_llm, response_format
from engram_workers.extraction.prompt import RESPONSE_SCHEMA, SYSTEM_PROMPT
from tests.support.extractions import entity, fact, message_text
from tests.support.stack import SETTLE_S, Stack, engram_stack

T0 = datetime(2024, 3, 1, 15, 0, tzinfo=UTC)
Answer = Callable[[Mapping[str, Any]], Any]


@pytest.fixture(scope="module")
def stack(redis_url, llm_server, tmp_path_factory) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("llm-extraction"), neo4j_uri=None, llm_url=llm_server.url
    ) as s:
        yield s


@pytest.fixture
def llm(llm_server: LLMStandin) -> Iterator[LLMStandin]:
    llm_server.reset()
    yield llm_server
    llm_server.reset()


def new_user() -> str:
    return f"x_{uuid.uuid4().hex[:10]}"


def script(llm: LLMStandin, answers: Mapping[str, Any]) -> None:
    """Answer by the first key found in the new turns of the prompt (a callable gets the request)."""

    def rule(request: Mapping[str, Any]) -> Any:
        said = message_text(request)
        for key, answer in answers.items():
            if key in said:
                return answer(request) if callable(answer) else answer
        return None

    llm.script(rule)


def ingest(stack: Stack, user: str, messages: Any, when: datetime, **kwargs: Any) -> str:
    receipt = stack.client.enqueue(user, messages, timestamp=when, **kwargs)
    result = stack.client.wait(receipt, timeout=SETTLE_S)
    dead = {d.message_id: d.reason for d in stack.client.dead_letters(user)}
    assert result.applied == [receipt.message_id], (result, dead)
    return receipt.message_id


def prompt_for(llm: LLMStandin, text: str) -> RecordedRequest:
    """The first request whose new turns contain ``text``."""
    return next(r for r in llm.requests if text in message_text(r.body))


def _messages(request: RecordedRequest | Mapping[str, Any]) -> list[dict[str, Any]]:
    return request.messages if isinstance(request, RecordedRequest) else list(request["messages"])


def user_part(request: RecordedRequest | Mapping[str, Any]) -> str:
    return next(m["content"] for m in _messages(request) if m["role"] == "user")


def system_part(request: RecordedRequest | Mapping[str, Any]) -> str:
    return next(m["content"] for m in _messages(request) if m["role"] == "system")


def handle(request: RecordedRequest | Mapping[str, Any], pattern: str) -> str:
    """The handle (E3, F1, ...) the prompt shows in front of a line matching ``pattern``."""
    found = re.search(rf"^([EF]\d+) {pattern}", user_part(request), re.MULTILINE)
    assert found, user_part(request)
    return found.group(1)


def facts(stack: Stack, user: str) -> list[FactRecord]:
    return stack.client.get_graph(user, page_size=200).facts


def current(stack: Stack, user: str, predicate: str) -> list[str]:
    return sorted(
        f.object_name or f.statement for f in facts(stack, user) if f.predicate == predicate and f.current_at(None)
    )


# ------------------------------------------------------------------------------- 1. earlier turns


def test_earlier_turns_are_shown_apart_from_the_new_message_and_never_extracted(stack, llm):
    user = new_user()
    script(
        llm,
        {
            "My sister Ana": {
                "entities": [entity("N1", "Ana", "Person")],
                "facts": [fact("user", "HAS_SISTER", "N1", "User has a sister, Ana")],
            }
        },
    )
    ingest(stack, user, "My sister Ana moved to Lisbon.", T0)
    ingest(stack, user, "She loves it there.", T0 + timedelta(hours=1))
    body = user_part(prompt_for(llm, "She loves it there."))
    earlier, new = body.split("Conversation:\n")
    assert "Earlier turns (context only, extract nothing from them):" in earlier
    assert "My sister Ana moved to Lisbon." in earlier and "My sister Ana" not in new
    assert new.strip() == "User (memory owner): She loves it there."
    assert "Earlier turns resolve" in system_part(prompt_for(llm, "She loves it there."))
    # Sent by the producer instead: those turns are the context (and are never extracted: no fact from them).
    ingest(
        stack,
        user,
        "Yes, we adopted him last week.",
        T0 + timedelta(hours=2),
        earlier=[
            {"role": "user", "content": "We went to the shelter."},
            {"role": "assistant", "content": "Did you find a dog?"},
        ],
    )
    body = user_part(prompt_for(llm, "we adopted him"))
    earlier, new = body.split("Conversation:\n")
    assert "User (memory owner): We went to the shelter.\nassistant: Did you find a dog?" in earlier
    assert "Ana moved to Lisbon" not in earlier  # the envelope's own earlier turns replace the stored ones
    assert [f.statement for f in facts(stack, user)] == ["User has a sister, Ana"]


# ------------------------------------------------------------------- 2. speakers and the self node


def test_two_person_conversation_keeps_each_persons_facts_on_that_person(stack, llm):
    user = new_user()
    turns = [
        {"role": "user", "name": "Caroline", "content": "I just started pottery classes."},
        {"role": "user", "name": "Melanie", "content": "Nice! I paint landscapes every weekend."},
    ]
    # The model rebinds "user" to the owner's name and lists Melanie as a person of her own.
    script(
        llm,
        {
            "pottery classes": {
                "entities": [
                    entity("user", "Caroline", "Person"),
                    entity("N1", "Melanie", "Person"),
                    entity("N2", "pottery", "Activity"),
                    entity("N3", "landscape painting", "Activity"),
                ],
                "facts": [
                    fact("user", "TAKES_CLASSES_IN", "N2", "User takes pottery classes"),
                    fact("N1", "PAINTS", "N3", "Melanie paints landscapes every weekend"),
                    fact("Caroline", "ENJOYS", "N2", "Caroline enjoys pottery"),
                ],
            }
        },
    )
    mid = ingest(stack, user, turns, T0, owner_name="Caroline")
    body = user_part(prompt_for(llm, "pottery classes"))
    assert "Caroline (memory owner): I just started pottery classes.\nMelanie: Nice! I paint landscapes" in body
    assert "Memory owner: Caroline" in body
    page = stack.client.get_graph(user, page_size=100)
    me = self_entity_id(user)
    by_statement = {f.statement: f for f in page.facts}
    assert by_statement["User takes pottery classes"].subject_id == me
    assert by_statement["Caroline enjoys pottery"].subject_id == me  # the owner's name is the self node
    melanie = by_statement["Melanie paints landscapes every weekend"]
    assert melanie.subject_id != me and melanie.subject_name == "Melanie"
    people = [e for e in page.entities if e.label == "Person"]
    assert sorted(e.name for e in people) == ["Melanie", "User"]
    assert "Caroline" in next(e for e in people if e.id == me).aliases
    assert stack.client.history(user, "Caroline")[0].subject_id == me
    # The episode keeps who said what.
    (episode,) = [e for e in stack.client.graph.episodes(user) if e.event_time < T0 + timedelta(seconds=1)]
    assert (episode.id, episode.content) == (
        mid,
        "Caroline: I just started pottery classes.\nMelanie: Nice! I paint landscapes every weekend.",
    )

    # A first message of another user answered with {"ref": "user", "name": "User"}: still one self node.
    other = new_user()
    script(
        llm,
        {
            "I like tea": {
                "entities": [entity("user", "User", "Person"), entity("N1", "tea", "Drink")],
                "facts": [fact("user", "LIKES", "N1", "User likes tea")],
            }
        },
    )
    ingest(stack, other, "I like tea.", T0)
    page = stack.client.get_graph(other)
    assert [e.id for e in page.entities if e.label == "Person"] == [self_entity_id(other)]
    assert page.facts[0].subject_id == self_entity_id(other)


# ----------------------------------------------------------------------------------- 3. handles


def test_context_handles_round_trip_and_ids_never_become_entities(stack, llm):
    user = new_user()
    script(
        llm,
        {
            "I work at Acme": {
                "entities": [entity("N1", "Acme", "Organization")],
                "facts": [fact("user", "WORKS_AT", "N1", "User works at Acme")],
            },
            "promoted me": lambda req: {
                "entities": [entity("N1", "lead engineer", "Role")],
                "facts": [
                    fact(handle(req, r"Acme \("), "PROMOTED", "user", "Acme promoted User"),
                    fact("user", "JOB_TITLE", "N1", "User is a lead engineer"),
                    fact("ent_0770a1b2c3d4e5f6a7b8c9d0", "OWNS", "N1", "A copied-badly id owns it"),
                    fact("E97", "LIKES", "user", "An unknown handle likes User"),
                ],
            },
        },
    )
    ingest(stack, user, "I work at Acme.", T0)
    ingest(stack, user, "Acme promoted me to lead engineer!", T0 + timedelta(days=1))
    body = user_part(prompt_for(llm, "promoted me"))
    assert re.search(r"^E\d+ Acme \(Organization\)", body, re.MULTILINE), body
    assert re.search(r"^F\d+ \[WORKS_AT\] User works at Acme \(since 2024-03-01\)", body, re.MULTILINE), body
    assert "ent_" not in body and "fact_" not in body  # ids never reach the model
    page = stack.client.get_graph(user)
    acme = next(e for e in page.entities if e.name == "Acme")
    promoted = next(f for f in page.facts if f.predicate == "PROMOTED")
    assert (promoted.subject_id, promoted.object_id) == (acme.id, self_entity_id(user))
    assert not [e for e in page.entities if e.name.startswith(("ent_", "E9"))]
    assert sorted(f.statement for f in page.facts) == [
        "Acme promoted User",
        "User is a lead engineer",
        "User works at Acme",
    ]


# -------------------------------------------------------------------------------- 4. supersession


def test_supersession_follows_the_declared_rules_not_the_models_flags(stack, llm):
    user = new_user()

    def ends(pattern: str) -> Answer:
        return lambda req: {"entities": [], "facts": [], "ends": [handle(req, pattern)]}

    script(
        llm,
        {
            "I live in Tampa": {
                "entities": [entity("N1", "Tampa", "City")],
                "facts": [fact("user", "LIVES_IN", "N1", "User lives in Tampa")],
            },
            "I work at Acme": {
                "entities": [entity("N1", "Acme", "Organization")],
                "facts": [fact("user", "WORKS_AT", "N1", "User works at Acme")],
            },
            "jazz and blues": {
                "entities": [entity("N1", "jazz", "Media"), entity("N2", "blues", "Media")],
                "facts": [
                    fact("user", "LIKES", "N1", "User likes jazz", single_valued=True),
                    fact("user", "LIKES", "N2", "User likes blues", single_valued=True),
                ],
            },
            "reside in Austin": {
                "entities": [entity("N1", "Austin", "City")],
                "facts": [fact("user", "RESIDES_IN", "N1", "User resides in Austin")],
            },
            "moving to Denver": {
                "entities": [entity("N1", "Denver", "City")],
                "facts": [
                    fact("user", "LIVES_IN", "N1", "User will live in Denver", valid_from="2024-04-05T00:00:00Z")
                ],
            },
            "I quit Acme": ends(r"\[WORKS_AT\] User works at Acme"),
            "like jazz anymore": ends(r"\[LIKES\] User likes jazz"),
        },
    )
    day = [T0 + timedelta(days=i) for i in range(8)]
    for i, text in enumerate(
        [
            "I live in Tampa.",
            "I work at Acme.",
            "I like jazz and blues.",
            "I now reside in Austin.",
            "I'm moving to Denver next month!",
            "I quit Acme, taking a break.",
            "I don't like jazz anymore.",
        ]
    ):
        ingest(stack, user, text, day[i])
    assert current(stack, user, "LIVES_IN") == ["Austin"]  # RESIDES_IN is LIVES_IN; Denver is a plan
    assert current(stack, user, "PLANS_LIVES_IN") == ["Denver"]
    assert current(stack, user, "LIKES") == ["blues"]  # "single_valued" on LIKES was ignored; jazz ended
    assert current(stack, user, "WORKS_AT") == []
    acme = next(f for f in facts(stack, user) if f.predicate == "WORKS_AT")
    assert (acme.valid_until, acme.superseded_by) == (day[5], None)
    jazz = next(f for f in facts(stack, user) if f.object_name == "jazz")
    assert jazz.valid_until == day[6]
    system = system_part(prompt_for(llm, "I quit Acme"))
    assert "One value at a time: AGE, BIRTHDAY" in system and "ends:" in system and "PLANS_TO_MOVE_TO" in system


def test_a_question_a_plan_and_a_hypothetical_leave_the_current_home_in_place(stack, llm):
    """The prompt's rule "a plan, wish, question or hypothetical changes nothing", with the drafts a model that
    follows it plausibly writes: episodic facts of their own predicates, one that still points ``updates`` at
    the home fact it is about, and a plan dated on the year it names (ahead of the message)."""
    user = new_user()
    tampa = r"\[LIVES_IN\] User lives in Tampa"
    denver = r"Denver \("
    script(
        llm,
        {
            "I live in Tampa": {
                "entities": [entity("N1", "Tampa", "City")],
                "facts": [fact("user", "LIVES_IN", "N1", "User lives in Tampa")],
            },
            "Should I move to Denver?": lambda req: {
                "entities": [entity("N1", "Denver", "City")],
                "facts": [
                    fact("user", "CONSIDERS_MOVING_TO", "N1", "User asked whether to move to Denver",
                         memory_type="episodic", importance=0.3, updates=handle(req, tampa))
                ],
            },
            "I might move to Denver next year": lambda req: {
                "entities": [],
                "facts": [
                    fact("user", "PLANS_TO_MOVE_TO", handle(req, denver),
                         "User might move to Denver in 2025", memory_type="episodic", importance=0.5,
                         valid_from="2025-01-01T00:00:00Z")
                ],
            },
            "If I lived in Denver": lambda req: {
                "entities": [entity("N1", "skiing", "Activity")],
                "facts": [
                    fact("user", "IMAGINES_LIVING_IN", handle(req, denver),
                         "User imagines living in Denver and skiing every weekend", memory_type="episodic"),
                ],
                "ends": [],
            },
        },
    )  # fmt: skip
    said = [
        "I live in Tampa.",
        "Should I move to Denver?",
        "I might move to Denver next year.",
        "If I lived in Denver I'd ski every weekend.",
    ]
    days = [T0 + timedelta(days=i) for i in range(len(said))]
    for text, when in zip(said, days, strict=True):
        ingest(stack, user, text, when)

    assert "A plan, wish, question or hypothetical changes nothing" in system_part(prompt_for(llm, "next year"))
    for text in said[1:]:  # the model was shown the home fact each time (it could have ended it)
        assert re.search(rf"^F\d+ {tampa}", user_part(prompt_for(llm, text)), re.MULTILINE)
    assert current(stack, user, "LIVES_IN") == ["Tampa"]
    home = next(f for f in facts(stack, user) if f.predicate == "LIVES_IN")
    assert (home.valid_from, home.valid_until, home.superseded_by) == (days[0], None, None)
    by_predicate = {f.predicate: f for f in facts(stack, user) if f.predicate != "LIVES_IN"}
    drafted = ["CONSIDERS_MOVING_TO", "PLANS_TO_MOVE_TO", "IMAGINES_LIVING_IN"]
    assert sorted(by_predicate) == sorted(drafted)
    for when, predicate in zip(days[1:], drafted, strict=True):
        draft = by_predicate[predicate]
        assert (draft.memory_type, draft.single_valued, draft.object_name) == ("episodic", False, "Denver")
        assert draft.valid_from == when  # the plan's 2025 date is not taken: never after the message
    assert not stack.client.dead_letters(user)


# ------------------------------------------------------------------------------------ 5. time rules


def test_time_rules_sender_offset_and_dates_clamped_to_the_message(stack, llm):
    user = new_user()
    script(
        llm,
        {
            "visited Kyoto": {
                "entities": [entity("N1", "Kyoto", "City")],
                "facts": [
                    fact(
                        "user",
                        "VISITED",
                        "N1",
                        "User visited Kyoto on 29 February 2024",
                        memory_type="episodic",
                        valid_from="9999-01-01T00:00:00Z",
                    )
                ],
            }
        },
    )
    when = datetime(2024, 3, 1, 3, 0, tzinfo=UTC)  # 22:00 the evening before in New York
    ingest(stack, user, "I visited Kyoto yesterday.", when, utc_offset_minutes=-300)
    request = prompt_for(llm, "visited Kyoto")
    assert "Message time: 2024-02-29T22:00:00-05:00 (Thursday, the sender's local time)" in user_part(request)
    assert '"yesterday" = the sender\'s previous day' in system_part(request)
    assert "a bare year is 1 January" in system_part(request)
    (kyoto,) = facts(stack, user)
    assert kyoto.valid_from == when and kyoto.current_at(None)  # a 9999 date is not trusted
    future = kyoto.model_copy(update={"valid_from": datetime.now(UTC) + timedelta(days=3)})
    assert not future.current_at(None)  # current only from valid_from on


def test_a_far_future_model_date_cannot_pin_a_one_value_slot(stack, llm):
    """Issue 12 finding 7: a LIVES_IN dated 9999 by the model stayed current forever and every later real
    home was created already superseded."""
    user = new_user()
    script(llm, {
        "I live in Tampa": {"entities": [entity("N1", "Tampa", "City")], "facts": [
            fact("user", "LIVES_IN", "N1", "User lives in Tampa", valid_from="9999-01-01T00:00:00Z")]},
        "I moved to Austin": {"entities": [entity("N1", "Austin", "City")], "facts": [
            fact("user", "LIVES_IN", "N1", "User lives in Austin")]},
    })  # fmt: skip
    ingest(stack, user, "I live in Tampa.", T0)
    ingest(stack, user, "I moved to Austin.", T0 + timedelta(days=30))
    assert current(stack, user, "LIVES_IN") == ["Austin"]
    assert all(f.valid_from <= T0 + timedelta(days=30) for f in facts(stack, user))


# --------------------------------------------------------------------- 6. assistant, system and tool turns


def test_assistant_turns_are_labelled_and_system_and_tool_turns_are_not_shown(stack, llm):
    user = new_user()
    script(
        llm,
        {
            "restaurant": {
                "entities": [entity("N1", "Nopa", "Organization")],
                "facts": [
                    fact(
                        "user",
                        "WAS_RECOMMENDED",
                        "N1",
                        "User was recommended Nopa",
                        memory_type="episodic",
                        importance=0.3,
                    )
                ],
            }
        },
    )
    turns = [
        {"role": "system", "content": "You are a helpful concierge named Max."},
        {"role": "user", "content": "Any restaurant tips for tonight?"},
        {"role": "tool", "content": '{"results": ["Nopa", "Zuni"]}'},
        {"role": "assistant", "content": "Try Nopa on Divisadero."},
    ]
    ingest(stack, user, turns, T0)
    request = prompt_for(llm, "restaurant")
    new = user_part(request).split("Conversation:\n")[1]
    assert new == "User (memory owner): Any restaurant tips for tonight?\nassistant: Try Nopa on Divisadero."
    assert "concierge" not in user_part(request) and "Zuni" not in user_part(request)
    assert "Assistant turns are never facts about the owner" in system_part(request)
    assert [f.statement for f in facts(stack, user)] == ["User was recommended Nopa"]


# ----------------------------------------------------------------------------- 7. output robustness


GOOD = fact("user", "LIKES", "N1", "User likes chess")
CHESS = [entity("N1", "chess", "Activity")]
MALFORMED = {
    "prose": Reply(content="Sure! Here is the JSON:\n" + json.dumps({"entities": CHESS, "facts": [GOOD]}) + "\nDone."),
    "fenced": Reply(content="```json\n" + json.dumps({"entities": CHESS, "facts": [GOOD]}) + "\n```"),
    "importance": Reply.json({"entities": CHESS, "facts": [{**GOOD, "importance": 8, "memory_type": "Semantic"}]}),
    "worddate": Reply.json({"entities": CHESS, "facts": [{**GOOD, "valid_from": "last week"}]}),
    "toplist": Reply.json([{**GOOD, "object": "chess"}]),
    "onebad": Reply.json(
        {
            "entities": [*CHESS, {"ref": "N2", "name": "x" * 5000}],
            "facts": [
                GOOD,
                {"subject": "user", "predicate": "LIKES"},
                {**GOOD, "importance": "NaN", "statement": "User likes chess a lot", "valid_from": "2024-02-30"},
            ],
        }
    ),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_slightly_off_answer_is_kept_not_dead_lettered(stack, llm, kind):
    user = new_user()
    script(llm, {f"{kind} chess": MALFORMED[kind]})
    ingest(stack, user, f"{kind} chess: I like chess.", T0)
    stored = facts(stack, user)
    assert "User likes chess" in {f.statement for f in stored}
    assert not stack.client.dead_letters(user)
    chess = next(f for f in stored if f.statement == "User likes chess")
    assert (chess.memory_type, chess.valid_from, chess.object_name) == ("semantic", T0, "chess")
    assert chess.importance == (0.8 if kind == "importance" else 0.5)
    assert len(llm.requests) == 1  # nothing here needed a second call


def test_an_unusable_answer_is_retried_once_with_the_error_appended(stack, llm):
    user = new_user()
    calls: list[str] = []

    def answer(request: Mapping[str, Any]) -> Any:
        calls.append(request["messages"][-1]["content"])
        if len(calls) == 1:
            return Reply(content="I'm sorry, but I can only answer in plain English: you like chess.")
        return {"entities": CHESS, "facts": [GOOD]}

    script(llm, {"retry chess": answer})
    ingest(stack, user, "retry chess: I like chess.", T0)
    assert len(calls) == 2
    second = llm.requests[-1].messages
    assert second[-2] == {
        "role": "assistant",
        "content": "I'm sorry, but I can only answer in plain English: you like chess.",
    }
    assert "Your answer could not be used: model answer holds no JSON object" in second[-1]["content"]
    assert [f.statement for f in facts(stack, user)] == ["User likes chess"]
    assert stack.client.stats(user).usage.llm_calls == 2


def test_request_sets_max_tokens_and_json_mode_and_a_cut_off_answer_keeps_only_complete_items(stack, llm):
    user = new_user()
    cut = json.dumps({"entities": CHESS, "facts": [GOOD]})[:60]
    script(
        llm,
        {
            "cutoff chess": Reply(content=cut, finish_reason="length"),
            "plain chess": {"entities": CHESS, "facts": [GOOD]},
        },
    )
    ingest(stack, user, "plain chess: I like chess.", T0)
    body = llm.requests[-1].body
    assert body["max_tokens"] == stack.settings.llm_max_output_tokens == 1500
    assert body["response_format"] == {"type": "json_object"} and body["temperature"] == 0
    system = system_part(llm.requests[-1])
    assert llm.requests[-1].messages[0]["role"] == "system" and "Importance (0 to 1)" in system
    assert "Examples" in system and system.count('{"entities"') >= 4
    # Cut off: asked once more with twice the room; cut off again, only the complete items are kept (here
    # the entity; the fact was never finished), never half an item, and no third call at full price.
    llm.reset()
    script(llm, {"cutoff chess": Reply(content=cut, finish_reason="length")})
    ingest(stack, user, "cutoff chess: I like chess.", T0)
    assert [r.body["max_tokens"] for r in llm.requests] == [1500, 3000]
    assert [f.statement for f in facts(stack, user)] == ["User likes chess"]  # the first message's only
    assert "chess" in {e.name for e in stack.client.get_graph(user).entities}


def test_stray_subjects_and_refs_resolve_to_the_owner_and_known_entities(stack, llm):
    """ "me" and the owner's own name are the self node; "E1 Tampa" is the known Tampa; an assistant's fact
    and an unlisted "N3" are skipped, never made entities; an ``ends`` line copied whole closes its fact."""
    user = new_user()
    script(
        llm,
        {
            "I live in Tampa": {
                "entities": [entity("N1", "Tampa", "Place")],
                "facts": [fact("user", "LIVES_IN", "N1", "User lives in Tampa")],
            },
            "I love the beaches": lambda req: {
                "entities": [entity("N1", "Acme", "Organization")],
                "facts": [
                    {"subject": "me", "predicate": "LIKES", "object": f"{handle(req, 'Tampa')} Tampa"},
                    fact("Kim", "WORKS_AT", "N1", "Kim works at Acme"),
                    fact("assistant", "RECOMMENDED", "N1", "Assistant recommended Acme"),
                    fact("the user", "VISITED", "N3", "User visited somewhere"),
                ],
                "ends": [handle(req, r"\[LIVES_IN\]") + ": User lives in Tampa"],
            },
        },
    )
    ingest(stack, user, "I live in Tampa.", T0, owner_name="Kim")
    ingest(
        stack,
        user,
        "I love the beaches of Tampa, moving out though; I work at Acme.",
        T0 + timedelta(days=1),
        owner_name="Kim",
    )
    page = stack.client.get_graph(user, page_size=200)
    me = self_entity_id(user)
    tampa = next(e for e in page.entities if e.name == "Tampa")
    got = {(f.subject_id, f.predicate, f.object_name, f.statement) for f in page.facts}
    assert got == {
        (me, "LIVES_IN", "Tampa", "User lives in Tampa"),
        (me, "LIKES", "Tampa", "User likes Tampa"),
        (me, "WORKS_AT", "Acme", "Kim works at Acme"),
    }
    assert next(f for f in page.facts if f.predicate == "LIKES").object_id == tampa.id
    assert not current(stack, user, "LIVES_IN")  # the whole-line ``ends`` closed it
    names = {e.name for e in page.entities}
    assert not names & {"me", "Kim", "assistant", "N3", "E1 Tampa", "the user"}, names


def test_providers_that_take_a_json_schema_get_one():
    strict = response_format("gpt-4o-mini")
    assert strict["type"] == "json_schema" and "facts" in strict["json_schema"]["schema"]["properties"]
    assert response_format("openai/some-unknown-model") == {"type": "json_object"}
    # ENGRAM_LLM_OUTPUT_MODE forces either (Ollama: litellm maps a schema to grammar-constrained output).
    assert response_format("ollama_chat/llama3.2", "schema") == strict
    assert response_format("gpt-4o-mini", "json") == {"type": "json_object"}


def test_the_schema_says_what_the_prompt_says():
    """The schema is written from the prompt's wording: every field it names is one the prompt's answer
    shape shows and the reader keeps, refs are handles ("user", E1, N1) as in the prompt, nothing the
    prompt never mentions (``single_valued``), and it costs far fewer tokens than the model-derived one."""
    props = {k: v["items"]["properties"] for k, v in RESPONSE_SCHEMA["properties"].items() if k != "ends"}
    assert set(props["facts"]) <= set(ExtractedFact.model_fields) - {"single_valued"}
    assert set(props["entities"]) <= set(ExtractedEntity.model_fields)
    shape = SYSTEM_PROMPT.split("References", 1)[0]  # the answer shape and the fields it may leave out
    assert all(re.search(rf"\b{key}\b", shape) for part in props.values() for key in part)
    assert all(f'"{key}"' in SYSTEM_PROMPT for key in RESPONSE_SCHEMA["properties"])
    assert "required" not in RESPONSE_SCHEMA  # the prompt's answers leave out empty lists ({"ends": ["F1"]})
    described = json.dumps(RESPONSE_SCHEMA)
    assert '\\"user\\" (the memory owner)' in described and "speaker" not in described and " id" not in described
    assert len(described) < 0.6 * len(json.dumps(Extraction.model_json_schema()))  # 387 tokens against 856


def test_forced_schema_mode_and_provider_parameters_reach_the_wire(llm):
    """ENGRAM_LLM_OUTPUT_MODE=schema asks for the schema from a model litellm knows nothing about (a local
    server); ENGRAM_LLM_EXTRA_PARAMS goes through litellm with every call (``num_ctx`` here: litellm puts it
    in Ollama's options for ollama_chat/ models, and passes it on as it is to an OpenAI-compatible server)."""
    script(llm, {"local chess": {"entities": CHESS, "facts": [GOOD]}})
    settings = Settings(
        llm_model="openai/local-model",
        llm_api_base=llm.url,
        llm_api_key="test-key",
        llm_output_mode="schema",
        llm_extra_params={"num_ctx": 8192, "temperature": 0.2},
    )
    answer = call_llm(
        settings, [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "local chess"}]
    )
    (request,) = llm.requests
    assert request.body["response_format"]["json_schema"]["schema"] == RESPONSE_SCHEMA
    assert (request.body["num_ctx"], request.body["temperature"]) == (8192, 0.2)
    assert [f.statement for f in answer.extraction.facts] == ["User likes chess"]


@pytest.mark.parametrize("key", ["model", "max_tokens", "response_format", "api_base"])
def test_provider_parameters_are_read_as_json_and_cannot_override_what_engram_sets(monkeypatch, key):
    monkeypatch.setenv("ENGRAM_LLM_EXTRA_PARAMS", '{"num_ctx": 8192, "top_p": 0.9}')
    monkeypatch.setenv("ENGRAM_LLM_OUTPUT_MODE", "schema")
    settings = load_settings()
    assert (settings.llm_extra_params, settings.llm_output_mode) == ({"num_ctx": 8192, "top_p": 0.9}, "schema")
    monkeypatch.setenv("ENGRAM_LLM_EXTRA_PARAMS", json.dumps({key: "x", "num_ctx": 8192}))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "ENGRAM_LLM_EXTRA_PARAMS" in str(info.value) and key in str(info.value)


def test_a_claude_request_carries_the_extraction_schema_as_a_forced_tool(llm):
    """litellm 1.110 drops ``{"type": "json_object"}`` for Anthropic, leaving Claude unconstrained; where it
    says the model takes a JSON schema (Claude 4 and later) Engram asks for one, and litellm sends it as a
    forced tool whose input is the schema. Asserted on Anthropic's wire format (the stand-in's /v1/messages),
    in process: the worker's call, not a whole stack."""
    model = "anthropic/claude-sonnet-4-20250514"
    assert response_format(model)["type"] == "json_schema"
    script(llm, {"claude chess": {"entities": CHESS, "facts": [GOOD]}})
    settings = Settings(llm_model=model, llm_api_base=llm.root, llm_api_key="test-key")
    turns = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Conversation:\nclaude chess"}]
    answer = call_llm(settings, turns)
    (request,) = llm.requests
    body = request.body
    assert body["model"] == "claude-sonnet-4-20250514" and "response_format" not in body
    assert body["tool_choice"] == {"type": "tool", "name": "json_tool_call"}
    (tool,) = body["tools"]
    schema = tool["input_schema"]  # litellm's Anthropic form of the extraction schema
    assert tool["name"] == "json_tool_call" and set(schema["properties"]) == {"entities", "facts", "ends"}
    facts_schema = RESPONSE_SCHEMA["properties"]["facts"]["items"]
    assert schema["properties"]["facts"]["items"]["required"] == facts_schema["required"]
    assert body["system"][0]["text"] == SYSTEM_PROMPT  # Anthropic takes the system part apart from the turns
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}  # the fixed part is cached
    assert (body["max_tokens"], body["temperature"]) == (settings.llm_max_output_tokens, 0)
    assert [f.statement for f in answer.extraction.facts] == ["User likes chess"]
    assert answer.usage.llm_calls == 1 and answer.usage.prompt_tokens > 0


def test_an_older_claude_without_schema_support_gets_no_constraint_and_prose_is_still_read(llm):
    """Where litellm says a Claude model takes no JSON schema (3.5 Haiku), JSON mode is all Engram can ask
    for, and litellm drops it for Anthropic: the request is unconstrained, the prompt alone asks for JSON,
    and the tolerant reader takes the object out of the prose such a model may wrap around it."""
    model = "anthropic/claude-3-5-haiku-20241022"
    assert response_format(model) == {"type": "json_object"}
    script(llm, {"haiku chess": MALFORMED["prose"]})
    settings = Settings(llm_model=model, llm_api_base=llm.root, llm_api_key="test-key")
    turns = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Conversation:\nhaiku chess"}]
    answer = call_llm(settings, turns)
    (request,) = llm.requests
    assert not {"tools", "tool_choice", "response_format", "output_format"} & set(request.body)
    assert [f.statement for f in answer.extraction.facts] == ["User likes chess"]


def test_system_part_is_identical_for_every_message(stack, llm):
    """Fixed text first and byte-identical across users and messages: providers' prompt caching applies."""
    script(llm, {})
    for user, text in ((new_user(), "cache one: I like chess."), (new_user(), "cache two: I live in Oslo.")):
        ingest(stack, user, text, T0, owner_name="Kim", utc_offset_minutes=60)
    first, second = (system_part(prompt_for(llm, t)) for t in ("cache one", "cache two"))
    assert first == second and llm.requests[0].messages[0]["role"] == "system"


# --------------------------------------------------------------------------------- envelope fields


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"utc_offset_minutes": 2000}, "utc_offset_minutes"),
        ({"utc_offset_minutes": "60"}, "utc_offset_minutes"),
        ({"owner_name": ""}, "owner_name"),
        ({"earlier": "We talked"}, "earlier"),
        ({"earlier": [{"role": "robot", "content": "x"}]}, "earlier[0].role"),
        ({"earlier": [{"content": "x"}] * 21}, "earlier"),
        ({"messages": [{"content": "hi", "name": 7}]}, "messages[0].name"),
    ],
)
def test_bad_extraction_context_is_a_typed_error_naming_the_field(stack, kwargs, field):
    user = new_user()
    args = {"messages": "hello there", **kwargs}
    with pytest.raises(InvalidInputError) as info:
        stack.client.enqueue(user, args.pop("messages"), **args)
    assert info.value.field == field
    assert stack.client.stats(user).episodes == 0 and not stack.client.redis.keys(f"*{user}*")
