"""Relative time expressions resolved against the message's event time (``engram_api.relative_dates``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_api.relative_dates import annotate

SENT = datetime(2026, 11, 27, 15, 30, tzinfo=UTC)  # a Friday

TABLE = [
    ("User visited Tokyo last month", "User visited Tokyo last month (= 2026-10)"),
    ("I ran yesterday.", "I ran yesterday (= 2026-11-26)."),
    ("We met the day before yesterday", "We met the day before yesterday (= 2026-11-25)"),
    ("Two days ago it rained", "Two days ago (= 2026-11-25) it rained"),
    ("3 weeks ago", "3 weeks ago (= 2026-11-06)"),
    ("a month ago", "a month ago (= 2026-10)"),
    ("13 months ago", "13 months ago (= 2025-10)"),
    ("two years ago", "two years ago (= 2024)"),
    ("last week", "last week (= week of 2026-11-16)"),
    ("next week", "next week (= week of 2026-11-30)"),
    ("next month", "next month (= 2026-12)"),
    ("last year", "last year (= 2025)"),
    ("tomorrow and tonight", "tomorrow (= 2026-11-28) and tonight (= 2026-11-27)"),
    ("next Friday", "next Friday (= 2026-12-04)"),
    ("last Friday", "last Friday (= 2026-11-20)"),
    ("last Thursday", "last Thursday (= 2026-11-26)"),
    ("next Monday", "next Monday (= 2026-11-30)"),
    # Vague or either-side expressions stay as said.
    ("a few days ago, this Friday, last summer, recently", "a few days ago, this Friday, last summer, recently"),
    ("the lastmonth todayish", "the lastmonth todayish"),
]


@pytest.mark.parametrize(("said", "shown"), TABLE, ids=[s for s, _ in TABLE])
def test_expressions_resolve_against_the_event_time(said: str, shown: str) -> None:
    assert annotate(said, SENT) == shown


def test_a_month_back_crosses_the_year() -> None:
    assert annotate("last month", datetime(2026, 1, 5, tzinfo=UTC)) == "last month (= 2025-12)"
