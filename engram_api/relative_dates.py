"""Relative time expressions ("yesterday", "last month", "two days ago", "next Friday") resolved against
the time a message was sent, so a line read later still says when.

Invariants:
- deterministic and table-driven: only the expressions below are resolved, each to the precision it
  carries (a day "2026-11-26", a week "week of 2026-11-16" (its Monday), a month "2026-10", a year
  "2026"); vague ones ("a few days ago", "recently", "last summer") are left as said;
- dates are of the event time's calendar (UTC, as every date Engram shows);
- ``annotate`` never changes the words: it appends " (= resolved)" after each expression it resolves.

"last Friday" is the latest Friday strictly before the message's day and "next Friday" the first one
strictly after it (a same-day "Friday" is not "last"/"next" Friday).
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

__all__ = ["annotate"]

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_NUMBERS |= {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
_DAYS = {
    "the day before yesterday": -2,
    "the day after tomorrow": 2,
    "yesterday": -1,
    "last night": -1,
    "today": 0,
    "tonight": 0,
    "this morning": 0,
    "this afternoon": 0,
    "this evening": 0,
    "tomorrow": 1,
}
_STEP = {"last": -1, "this": 0, "next": 1}
_NUMBER = r"\d{1,3}|" + "|".join(_NUMBERS)
_PATTERN = re.compile(
    r"\b(?:"
    + "|".join(re.escape(k) for k in _DAYS)
    + rf"|(?P<n>{_NUMBER})\s+(?P<unit>day|week|month|year)s?\s+ago"
    + r"|(?P<step>last|this|next)\s+(?P<span>week|month|year|"
    + "|".join(_WEEKDAYS)
    + r"))\b",
    re.IGNORECASE,
)


def _month(day: date, shift: int) -> str:
    index = day.year * 12 + day.month - 1 + shift
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def _week(day: date, shift: int) -> str:
    monday = day - timedelta(days=day.weekday()) + timedelta(weeks=shift)
    return f"week of {monday.isoformat()}"


def _resolve(match: re.Match[str], day: date) -> str | None:
    words = " ".join(match.group(0).lower().split())
    if words in _DAYS:
        return (day + timedelta(days=_DAYS[words])).isoformat()
    if match.group("n"):
        raw = match.group("n").lower()
        n = int(raw) if raw.isdigit() else _NUMBERS[raw]
        unit = match.group("unit").lower()
        if unit in ("day", "week"):
            return (day - timedelta(days=n * (7 if unit == "week" else 1))).isoformat()
        return _month(day, -n) if unit == "month" else str(day.year - n)
    step, span = _STEP[match.group("step").lower()], match.group("span").lower()
    if span == "week":
        return _week(day, step)
    if span == "month":
        return _month(day, step)
    if span == "year":
        return str(day.year + step)
    if step == 0:
        return None  # "this Friday" may be either side of the message: left as said
    ahead = (_WEEKDAYS.index(span) - day.weekday()) % 7 or 7
    return (day + timedelta(days=ahead) if step > 0 else day - timedelta(days=(7 - ahead) or 7)).isoformat()


def annotate(text: str, event_time: datetime) -> str:
    """``text`` with " (= resolved)" after every expression of the table that ``event_time`` resolves."""
    day = event_time.date()

    def note(match: re.Match[str]) -> str:
        when = _resolve(match, day)
        return match.group(0) if when is None else f"{match.group(0)} (= {when})"

    return _PATTERN.sub(note, text)
