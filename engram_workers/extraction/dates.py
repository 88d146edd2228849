"""Dates as models write them: ISO 8601, and the shorter forms ("2024", "March 2024") read as the start
of the period they name, with that period's precision; epoch numbers are refused.

Invariant: every datetime returned is timezone-aware UTC (a naive one is read as UTC: a model that writes
"2024-01-05" means a date, not a local time somewhere).
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, date, datetime
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

__all__ = ["DatePrecision", "read_date"]

DatePrecision = Literal["year", "month", "day", "time"]
_DATE: TypeAdapter[datetime] = TypeAdapter(datetime)
_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?$")
_YEAR_MONTH = re.compile(r"^(\d{4})[-/.](\d{1,2})$")
_MONTHS = {m: i for i, name in enumerate(calendar.month_name[1:], 1) for m in (name.lower(), name[:3].lower())}
# "March 2024", "Mar. 2024", "March 5, 2024", "5 March 2024"
_WORDS_DATE = re.compile(r"^(?:(\d{1,2})\s+)?([a-z]{3,9})\.?(?:\s+(\d{1,2})(?:st|nd|rd|th)?)?,?\s+(\d{4})$", re.I)


def _day(year: int, month: int = 1, day: int = 1) -> datetime | None:
    try:
        return datetime(year, month, day, tzinfo=UTC)
    except ValueError:
        return None  # "2024-13", "February 30 2024"


def read_date(value: Any) -> tuple[datetime, DatePrecision] | None:
    """A date as a model writes it, in UTC, and how precise it is; None when it is not a date we can read.

    A bare year (``"2024"`` or ``2024``) is 1 January, ``"20240301"`` is that day, ``"2025-03"`` and
    ``"March 2024"`` / ``"Mar 2024"`` the first of the month; ISO dates and datetimes as ISO 8601 says (a
    naive one is UTC). Other numbers are refused: an epoch count is never what a model means by a date,
    and reading one made "2024" into 1970-01-01T00:33:44Z."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None  # a fractional epoch
        value = int(value)
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        return _iso(value) if isinstance(value, date) else None  # a datetime (a date object as its midnight)
    text = " ".join(value.split())
    if _NUMBER.match(text):
        if len(text) == 4:
            when = _day(int(text))
            return (when, "year") if when else None
        if len(text) == 8 and text.isdigit():
            when = _day(int(text[:4]), int(text[4:6]), int(text[6:]))
            return (when, "day") if when else None
        return None  # an epoch in seconds or milliseconds, or any other number
    if match := _YEAR_MONTH.match(text):
        when = _day(int(match[1]), int(match[2]))
        return (when, "month") if when else None
    if (match := _WORDS_DATE.match(text)) and match[2].lower() in _MONTHS:
        day = match[1] or match[3]
        when = _day(int(match[4]), _MONTHS[match[2].lower()], int(day or 1))
        return (when, "day" if day else "month") if when else None
    return _iso(text)


def _iso(value: Any) -> tuple[datetime, DatePrecision] | None:
    try:
        when = _DATE.validate_python(value)
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except (ValidationError, OverflowError):
        return None  # "last week", "2024-13-45": a date we cannot read is no date
    plain_day = isinstance(value, str) and len(value.strip()) == 10
    return when, "day" if plain_day else "time"
