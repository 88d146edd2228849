"""``get_context``'s assembly (``reader.context``): nothing said twice, and the turns of one exchange shown
as one excerpt, on recalled items built here (the reader tests cover the recall that produces them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engram_api.models import RecallItem, ScoreBreakdown
from engram_api.reader.context import EXCERPTS_HEADER, FACTS_HEADER, count_tokens, render_context, select_context

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
    other = excerpt("q", "Where did you move?", "Ana", 1)
    lines = [EXCERPTS_HEADER, "- [2023-05-08] Ben: Austin.", "  Ana: Where did you move?"]
    budget = sum(count_tokens(line) + 1 for line in lines)  # each line pays for its line break
    assert select_context([first, other], budget) == [first, other]
    alone = excerpt("q2", "Where did you move?", "Ana", 86400)  # another day: a dated line, 7 tokens more
    assert select_context([first, alone], budget) == [first]


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
    chosen = select_context([derived, said], 43)  # both parts with their headers: 6 + 16 + 7 + 14 tokens
    assert chosen == [derived, said]
    assert render_context(chosen).splitlines() == [
        FACTS_HEADER,
        "- User lives in Austin (since 2023-05-08)",
        EXCERPTS_HEADER,
        "- [2023-05-08] Ben: Austin.",
    ]
    assert select_context([derived, said], 42) == [derived]


def test_tokens_are_counted_as_a_tokenizer_splits_text_not_four_characters_apiece() -> None:
    # cl100k makes 13, 15 and 12 tokens of these (o200k the same); four characters a token said 7, 10 and 28
    assert count_tokens("- [2023-05-08] Ben: Austin.") == 13
    assert count_tokens("- User lives in Austin (since 2023-05-08)") == 15
    long_words = (
        "Understanding international relationships requires extraordinary patience and considerable determination."
    )
    assert count_tokens(f"Ben: {long_words}") == 12
    # a CJK character is about a token (cl100k 17 here; four characters a token said 4)
    assert count_tokens("我昨天去了北京，见到了我的哥哥。") == 16


def test_the_budget_holds_long_words_and_refuses_text_in_another_script_that_would_overrun_it() -> None:
    worded = excerpt("w", "Understanding international relationships requires extraordinary patience.", "Ben")
    assert select_context([worded], 26) == [worded]  # 7 + 19 tokens; 30 by four characters a token
    chinese = excerpt("c", "我昨天去了北京，见到了我的哥哥。" * 5, "Ana")  # 80 characters, cl100k 85 tokens
    assert select_context([chinese], 60) == []  # four characters a token let it in at 31
    assert select_context([chinese], 99) == [chinese]  # 7 + 92 tokens
