"""Time phrases: "last week", "3 days ago", "on 12 March 2024" resolved against the message's event time."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from engram_workers.extraction.rules.lexicon import _MONTHS, _NUMBERS, _WEEKDAYS

_WHEN = re.compile(
    rf"\s+(?P<when>yesterday|today|tonight|this\s+(?:morning|afternoon|evening|week|weekend|month|year|"
    rf"summer|winter|spring|fall)|last\s+(?:night|week|weekend|month|year|summer|winter|spring|fall|"
    rf"autumn|christmas|{_WEEKDAYS})|the\s+day\s+before\s+yesterday|(?:\d+|a|an|one|two|three|four|five|"
    rf"six|seven|eight|nine|ten|a\s+few|a\s+couple\s+of)\s+(?:days?|weeks?|months?|years?)\s+ago|"
    rf"(?:back\s+)?in\s+(?:(?:19|20)\d\d|{_MONTHS})\b[^,;]*|on\s+(?:{_WEEKDAYS})|over\s+the\s+"
    rf"(?:weekend|holidays|summer))\b",
    re.I,
)
_DAY_OFFSETS = {
    **dict.fromkeys(("today", "tonight", "this morning", "this afternoon", "this evening"), 0),
    **dict.fromkeys(("yesterday", "last night"), 1),
    "the day before yesterday": 2,
}
_AGO = re.compile(r"(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten) (days?|weeks?) ago")


_DATE = re.compile(
    rf"(?:(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b\.?)"
    rf"(?:,?\s+(?:19|20)\d\d\b)?|(?:{_MONTHS})\s+(?:19|20)\d\d\b|\d{{1,4}}[/.-]\d{{1,2}}(?:[/.-]\d{{2,4}})?\b",
    re.I,
)


def _date(raw: str) -> str | None:
    """A calendar date at the head of ``raw``: "March 3rd, 1990", "3 March", "1990-03-03"."""
    m = _DATE.match(raw.strip())
    return m.group(0) if m else None


def _split_when(raw: str) -> tuple[str, str | None]:
    m = _WHEN.search(raw)
    return (raw[: m.start()], " ".join(m.group("when").split())) if m else (raw, None)


def _resolve_when(when: str, event_time: datetime) -> datetime | None:
    """Day-precise expressions only: "last summer" has no honest single date."""
    low = " ".join(when.casefold().split())
    if low in _DAY_OFFSETS:
        return event_time - timedelta(days=_DAY_OFFSETS[low])
    m = _AGO.fullmatch(low)
    if m:
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBERS[m.group(1)]
        return event_time - timedelta(days=n * (7 if m.group(2).startswith("week") else 1))
    return None
