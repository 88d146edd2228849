"""``get_context``'s assembly (``reader.context``): nothing said twice, and the turns of one exchange shown
as one excerpt, on recalled items built here (the reader tests cover the recall that produces them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engram_api.models import RecallItem, ScoreBreakdown
from engram_api.reader.context import EXCERPTS_HEADER, FACTS_HEADER, render_context, select_context

SAID = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)
NONE = ScoreBreakdown(similarity=0, graph=0, strength=0, recency=0, importance=0)


def excerpt(cid: str, text: str, speaker: str, after_s: float = 0, message: str | None = None) -> RecallItem:
    when = SAID + timedelta(seconds=after_s)
    return RecallItem(
        id=cid, kind="episode", statement=text, memory_type="episodic", subject=speaker, predicate="SAID",
        object=None, entities=[], valid_from=when, valid_until=None, event_time=when, current=False,
        speaker=speaker, source_ids=[message or cid], path="keyword", hops=-1, score=1.0, breakdown=NONE,
    )  # fmt: skip


def fact(fid: str, text: str, source: str) -> RecallItem:
    return RecallItem(
        id=fid, kind="fact", statement=text, memory_type="semantic", subject="User", predicate="LIVES_IN",
        object="Austin", entities=["User", "Austin"], valid_from=SAID, valid_until=None, event_time=SAID,
        current=True, source_ids=[source], path="vector", hops=-1, score=1.0, breakdown=NONE,
    )  # fmt: skip


def test_a_turn_of_the_exchange_is_shown_under_the_excerpt_it_answers_without_its_date() -> None:
    question = excerpt("q", "Where did you move?", "Ana", 0)
    answer = excerpt("a", "Austin.", "Ben", 1)
    later = excerpt("l", "I adopted a dog.", "Ben", 86400)
    chosen = select_context([answer, later, question], 1000)
    assert chosen == [answer, later, question]
    assert render_context(chosen).splitlines() == [
        EXCERPTS_HEADER,
        "- [2023-05-08] Ben: Austin.",
        "  Ana: Where did you move?",
        "- [2023-05-09] Ben: I adopted a dog.",
    ]


def test_a_joined_turn_costs_only_its_words_so_it_fits_where_a_dated_line_would_not() -> None:
    first = excerpt("a", "Austin.", "Ben", 0)
    other = excerpt("q", "x" * 40, "Ana", 1)
    budget = len(EXCERPTS_HEADER) + 1 + len("- [2023-05-08] Ben: Austin.") + 1 + len("  Ana: " + "x" * 40) + 1
    assert select_context([first, other], 1 + budget // 4) == [first, other]
    alone = excerpt("q2", "x" * 40, "Ana", 86400)  # another day: a dated line, 13 characters longer
    assert select_context([first, alone], budget // 4) == [first]


def test_the_same_words_are_not_shown_twice_and_a_fact_stays_beside_its_excerpt() -> None:
    said = excerpt("c1", "I moved to Austin last week.", "user", message="m1")
    again = excerpt("c2", "I moved to Austin last week.", "user", 86400 * 3, message="m2")
    derived = fact("f1", "User lives in Austin", "m1")
    chosen = select_context([said, derived, again], 1000)
    assert chosen == [said, derived]  # only the fact says it holds now
    assert render_context(chosen).splitlines()[:2] == [FACTS_HEADER, "- User lives in Austin (since 2023-05-08)"]


def test_the_headers_are_short_so_a_small_budget_holds_a_fact_and_an_excerpt() -> None:
    said = excerpt("a", "Austin.", "Ben")
    derived = fact("f1", "User lives in Austin", "other")
    chosen = select_context([derived, said], 30)  # 120 characters: both parts with their headers
    assert chosen == [derived, said]
    text = render_context(chosen)
    assert text.splitlines() == [
        FACTS_HEADER,
        "- User lives in Austin (since 2023-05-08)",
        EXCERPTS_HEADER,
        "- [2023-05-08] Ben: Austin.",
    ]
    assert len(text) + 1 <= 30 * 4
