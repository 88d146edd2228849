"""Off-spec model answers (issue 43): what a competent reader keeps from the answers real models give.

The corpus (tests/support/off_spec.py, 60+ answers) goes through ``read_answer``; the share of answers
whose facts survive is printed (``ops/bench/parse_corpus.py`` prints it too, for any parser) and no answer
may lose facts without an error or a note naming why. Dates are table-tested; the cut-off and retry rules
are asserted on the wire, against the LLM stand-in (a real HTTP server) behind litellm.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from engram_api.errors import LLMError
from engram_api.models import SELF_REF
from engram_api.settings import Settings
from engram_testing.llm_standin import LLMStandin, Reply
from engram_workers.extraction.answer import _date_or_none, read_answer
from engram_workers.extraction.dates import read_date
from engram_workers.extraction.llm import call_llm
from tests.support.off_spec import BOTH, CASES, COMPACT, ONE, score

SYSTEM = {"role": "system", "content": "Extract memory as JSON."}


@pytest.fixture
def llm(llm_server: LLMStandin) -> Iterator[LLMStandin]:
    llm_server.reset()
    yield llm_server
    llm_server.reset()


def settings_for(llm: LLMStandin) -> Settings:
    return Settings(llm_model="openai/standin-model", llm_api_base=llm.url, llm_api_key="test-key")


def test_the_corpus_keeps_the_facts_of_nine_answers_in_ten_and_drops_none_silently():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)
    result = score(read_answer)
    print(f"\n{result.line()}")
    assert result.share >= 0.9, result.failed
    assert result.silent == [], result.silent


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024", ("2024-01-01T00:00:00+00:00", "year")),
        (2024, ("2024-01-01T00:00:00+00:00", "year")),
        (2024.0, ("2024-01-01T00:00:00+00:00", "year")),
        (" 1999 ", ("1999-01-01T00:00:00+00:00", "year")),
        ("20240301", ("2024-03-01T00:00:00+00:00", "day")),
        (20240301, ("2024-03-01T00:00:00+00:00", "day")),
        ("2025-03", ("2025-03-01T00:00:00+00:00", "month")),
        ("2025/3", ("2025-03-01T00:00:00+00:00", "month")),
        ("March 2024", ("2024-03-01T00:00:00+00:00", "month")),
        ("Mar 2024", ("2024-03-01T00:00:00+00:00", "month")),
        ("mar. 2024", ("2024-03-01T00:00:00+00:00", "month")),
        ("March 5, 2024", ("2024-03-05T00:00:00+00:00", "day")),
        ("5 March 2024", ("2024-03-05T00:00:00+00:00", "day")),
        ("2024-03-01", ("2024-03-01T00:00:00+00:00", "day")),
        ("2024-03-01T10:00:00", ("2024-03-01T10:00:00+00:00", "time")),
        ("2024-03-01T10:00:00+02:00", ("2024-03-01T08:00:00+00:00", "time")),
        ("2024-03-01T10:00:00Z", ("2024-03-01T10:00:00+00:00", "time")),
        # Epochs and other numbers are refused: never 1970.
        (1709251200, None),
        ("1709251200", None),
        (1709251200000, None),
        ("1709251200.5", None),
        (1709251200.5, None),
        ("0", None),
        ("-2024", None),
        (True, None),
        (None, None),
        # Unreadable: no date.
        ("last week", None),
        ("2024-13", None),
        ("February 30 2024", None),
        ("Smarch 2024", None),
        ("2024-13-45", None),
    ],
)
def test_dates_as_models_write_them(value, expected):
    read = read_date(value)
    assert (None if read is None else (read[0].isoformat(), read[1])) == expected
    assert _date_or_none(value) == (None if expected is None else datetime.fromisoformat(expected[0]))
    assert read is None or read[0].tzinfo is UTC


def test_a_fact_without_statement_is_written_from_the_names_it_links():
    answer = {
        "entities": [{"ref": "N1", "name": "Austin"}],
        "facts": [{"subject": "me", "predicate": "LIVES_IN", "object": "N1"}],
    }
    extraction, skipped = read_answer(json.dumps(answer))
    assert [(f.subject, f.statement) for f in extraction.facts] == [(SELF_REF, "User lives in Austin")] and not skipped
    # A context handle's name comes from the prompt (``names``); "E2 Acme" is read as the handle E2.
    answer = {"facts": [{"subject": "user", "predicate": "WORKS_AT", "object": "E2 Acme"}]}
    extraction, _ = read_answer(json.dumps(answer), {"E2": "Acme Corp"})
    assert [(f.object, f.statement) for f in extraction.facts] == [("E2", "User works at Acme Corp")]
    # A handle the prompt did not show in front of a name is refused with a note, never made an entity;
    # other letters and digits are names ("F1 racing", "K2").
    objects = ("E7 Acme", "N4: Porto", "F1 racing", "K2")
    answer = {"facts": [{"subject": "user", "predicate": "LIKES", "object": o} for o in objects]}
    extraction, skipped = read_answer(json.dumps(answer), {"E2": "Acme Corp"})
    assert [f.object for f in extraction.facts] == ["F1 racing", "K2"]
    assert skipped == [
        "facts.0.object: E7 (in 'E7 Acme') is not a handle the prompt showed or the answer lists",
        "facts.1.object: N4 (in 'N4: Porto') is not a handle the prompt showed or the answer lists",
    ]


def test_stray_subjects_and_refs_are_named_when_refused():
    answer = {
        "entities": [{"ref": "N1", "name": "Nopa", "label": "Place"}],
        "facts": [
            {
                "subject": "assistant",
                "predicate": "RECOMMENDED",
                "object": "N1",
                "statement": "Assistant recommended Nopa",
            },
            {"subject": "user", "predicate": "LIKES", "object": "N3", "statement": "User likes it"},
        ],
        "ends": ["F4: User lives in Tampa", "F5 [WORKS_AT] User works at Acme (since 2024-02-01)"],
    }
    extraction, skipped = read_answer(json.dumps(answer))
    assert extraction.facts == [] and extraction.ends == ["F4", "F5"]
    assert skipped == [
        "facts.0.subject: the assistant is not the memory owner (facts are about the owner or people)",
        "facts.1.object: N3 is not an entity the answer lists",
    ]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("{{{{", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"summary": "User lives in Austin"}', "has none of entities, facts, ends"),
        ("I'm sorry, I can only answer in prose.", "holds no JSON object"),
        ('<think>The user lives in Austin, so {"facts": [', "holds no JSON object"),
        # Hostile shapes get bounded work (no lenient decoding past 64 levels or 50,000 characters).
        ("{" * 50_000, "not valid JSON: Expecting property name"),
        ("[{" * 25_000, "not valid JSON: Expecting property name"),
        ('{"facts": [{"statement": "' + "x" * 60_000, "not valid JSON: Unterminated string"),
    ],
    ids=["braces", "no-answer-keys", "prose", "think-cut-off", "deep-braces", "deep-mixed", "long-string"],
)
def test_an_unusable_answer_names_its_real_problem(raw, error):
    with pytest.raises(LLMError) as info:
        read_answer(raw)
    assert error in str(info.value) and info.value.raw == raw and not info.value.transient


def test_a_cut_off_answer_is_asked_again_once_with_twice_the_room(llm):
    """The first answer stops at max_tokens; the second call carries twice the room and is taken whole."""
    cut = COMPACT[: COMPACT.index("User works at")]

    def answer(body: Mapping[str, Any]) -> Reply:
        if body["max_tokens"] == 1500:
            return Reply(content=cut, finish_reason="length")
        return Reply(content=COMPACT)

    llm.script(answer)
    result = call_llm(settings_for(llm), [SYSTEM, {"role": "user", "content": "I live in Austin, work at Google"}])
    assert [r.body["max_tokens"] for r in llm.requests] == [1500, 3000]
    first, second = (r.body["messages"] for r in llm.requests)
    assert first == second  # the same turns, only more room
    assert [f.predicate for f in result.extraction.facts] == ["LIVES_IN", "WORKS_AT"] and not result.skipped
    assert result.usage.llm_calls == 2 and result.raw == COMPACT


def test_an_answer_cut_off_twice_keeps_its_complete_items_without_a_third_call(llm):
    cut = COMPACT[: COMPACT.index("User works at")]
    llm.script(lambda body: Reply(content=cut, finish_reason="length"))
    result = call_llm(settings_for(llm), [SYSTEM, {"role": "user", "content": "I live in Austin, work at Google"}])
    assert [r.body["max_tokens"] for r in llm.requests] == [1500, 3000]
    assert [f.statement for f in result.extraction.facts] == ["User lives in Austin"]
    assert result.skipped[0] == "answer cut off at max_tokens=3000: only its complete items were kept"
    assert result.usage.llm_calls == 2


def test_the_retry_tells_the_model_the_real_decode_error(llm):
    answers = iter([Reply(content="{{{{"), Reply.json(ONE)])
    llm.script(lambda body: next(answers))
    result = call_llm(settings_for(llm), [SYSTEM, {"role": "user", "content": "I live in Austin"}])
    fix = llm.requests[1].body["messages"][-1]["content"]
    assert "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2" in fix
    assert [f.statement for f in result.extraction.facts] == ["User lives in Austin"]
    assert result.usage.llm_calls == 2


def test_an_answer_the_repair_reads_needs_no_second_call(llm):
    """Trailing commas and Python literals are read at once: no retry is spent on them."""
    llm.script(lambda body: Reply(content="```json\n" + str(BOTH).replace("}]", "},]") + "\n```"))
    result = call_llm(settings_for(llm), [SYSTEM, {"role": "user", "content": "I live in Austin, work at Google"}])
    assert len(llm.requests) == 1 and result.usage.llm_calls == 1
    assert [f.statement for f in result.extraction.facts] == ["User lives in Austin", "User works at Google"]
