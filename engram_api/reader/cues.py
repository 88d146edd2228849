"""What a query's words say about the turn that answers it, read without a model: who it names, whether
it asks when, and which period it names.

Invariants:
- a pure function of the query text and the candidate's own fields (speaker, text, event time); no store
  reads, so a cue costs the same on a held snapshot and on the store;
- a speaker is named when one of the words of its name is a word of the query (case-insensitive,
  possessive "'s" dropped): "When did Melanie sign up?" names the speaker "Melanie", "my brother"
  names no one, and the user's own turns (speaker "user") are never named;
- a turn says when if the project's relative-date resolver resolves an expression in it ("yesterday",
  "last Friday": ``relative_dates.annotate``) or it names a month, a weekday or a year;
- a query asks when if it opens with "when" or asks for a date, day, month, year or time;
- a query names a period when it names a month (with or without a day and a year: "in June", "in May
  2023", "on October 13, 2023", "13 October 2023") or a year alone ("in 2022"); the first such mention
  counts. A turn is in it when its event time is, or when a date the relative-date resolver finds in its
  words is ("last week", said on 27 June, is in June), compared at the precision the query gives (a month
  without a year matches that month of any year).
- what a turn's words say of dates (``TurnDates``: whether they say when, the days they name) depends on its
  text and event time alone, so it is read once per text and kept in the user's memo of texts
  (``TextTerms.read``, dropped with the user's held state as the texts' terms are): the resolver's scan
  costs ~17 us a turn, and a query that asks when or names a period reads ~75 turns a recall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import cast

from engram_api.relative_dates import annotate
from engram_api.storage.snapshot.keywords import TextTerms

__all__ = ["QueryCues", "TurnDates"]

_WORD = re.compile(r"[a-z0-9]+")
_ASKS_WHEN = re.compile(
    r"^\s*when\b|\bwhat (?:date|day|month|year|time|week)\b|\bwhich (?:date|day|month|year|week)\b|\bhow long ago\b",
    re.IGNORECASE,
)
_NAMES_TIME = re.compile(
    r"\b(?:january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|(?:19|20)\d\d)\b",
    re.IGNORECASE,
)
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october")
_MONTHS += ("november", "december")
_M = "|".join(_MONTHS)
_PERIOD = re.compile(  # "13 October 2023", "the 13th of October", "October 13, 2023", "in June", "in 2022"
    rf"\b(?:(?P<dday>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dmonth>{_M})(?:,?\s+(?P<dyear>(?:19|20)\d\d))?"
    rf"|(?P<month>{_M})(?:\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b)?(?:,?\s+(?P<year>(?:19|20)\d\d))?"
    r"|(?P<ayear>(?:19|20)\d\d))\b",
    re.IGNORECASE,
)
_RESOLVED = re.compile(r"\(= (?P<week>week of )?(?P<y>\d{4})(?:-(?P<m>\d\d))?(?:-(?P<d>\d\d))?\)")
_NOBODY = frozenset({"user", "assistant", "system", "i", "me", "my"})


@lru_cache(maxsize=4096)
def _name_words(speaker: str) -> tuple[str, ...]:
    """The words of a speaker's name that can name it (a conversation has few speakers: read once)."""
    return tuple(w for w in _WORD.findall(speaker.lower()) if w not in _NOBODY)


def _spans(annotated: str) -> tuple[tuple[date, int], ...]:
    """The days the resolver's notes in ``annotated`` (``annotate``'s text) name, each as (first day, number of
    days)."""
    spans = []
    for m in _RESOLVED.finditer(annotated):
        y, mo, d = int(m.group("y")), m.group("m"), m.group("d")
        if d is not None:
            spans.append((date(y, int(mo), int(d)), 7 if m.group("week") else 1))
        elif mo is not None:
            first = date(y, int(mo), 1)
            spans.append((first, ((first + timedelta(days=31)).replace(day=1) - first).days))
        else:
            spans.append((date(y, 1, 1), (date(y + 1, 1, 1) - date(y, 1, 1)).days))
    return tuple(spans)


@dataclass(frozen=True, slots=True)
class TurnDates:
    """What a turn's words say of dates: whether they say when (a month, a weekday or a year named, or an
    expression the resolver resolves) and the days the resolved ones name (first day, number of days)."""

    says_when: bool
    spans: tuple[tuple[date, int], ...]

    @classmethod
    def of(cls, text: str, event_time: datetime, memo: TextTerms | None = None) -> TurnDates:
        """The turn's dates, kept in ``memo`` (the user's memo of texts) when given."""
        if memo is None:
            return cls._read(text, event_time)
        return cast(TurnDates, memo.read((text, event_time), lambda: cls._read(text, event_time)))

    @classmethod
    def _read(cls, text: str, event_time: datetime) -> TurnDates:
        annotated = annotate(text, event_time)
        return cls(bool(_NAMES_TIME.search(text)) or annotated != text, _spans(annotated))


@dataclass(frozen=True, slots=True)
class Period:
    """A period a query names, to the precision it names it: a year, a month (of any year when ``year``
    is None) or a day."""

    year: int | None
    month: int | None = None
    day: int | None = None

    @classmethod
    def named_in(cls, query: str) -> Period | None:
        m = _PERIOD.search(query)
        if m is None:
            return None
        if m.group("ayear"):
            return cls(year=int(m.group("ayear")))
        month, day, year = (m.group("dmonth"), m.group("dday"), m.group("dyear"))
        if month is None:
            month, day, year = m.group("month"), m.group("day"), m.group("year")
        if month.lower() == "may" and day is None and year is None and not re.search(r"\bin\s+may\b", query, re.I):
            return None  # "may" the verb ("May I ask...", "she may go"): only "in May" names the month
        day_n = int(day) if day and 1 <= int(day) <= 31 else None
        return cls(year=int(year) if year else None, month=_MONTHS.index(month.lower()) + 1, day=day_n)

    def holds(self, day: date) -> bool:
        """``day`` is in the period."""
        return (
            (self.year is None or day.year == self.year)
            and (self.month is None or day.month == self.month)
            and (self.day is None or day.day == self.day)
        )

    def meets(self, first: date, days: int) -> bool:
        """Some day of [first, first + days) is in the period."""
        return any(self.holds(first + timedelta(days=i)) for i in range(days))


@dataclass(frozen=True, slots=True)
class QueryCues:
    words: frozenset[str]
    asks_when: bool
    period: Period | None = None

    @classmethod
    def of(cls, query: str) -> QueryCues:
        text = query.lower().replace("'s", "").replace("\u2019s", "")
        return cls(
            words=frozenset(_WORD.findall(text)),
            asks_when=bool(_ASKS_WHEN.search(query)),
            period=Period.named_in(query),
        )

    def names(self, speaker: str | None) -> bool:
        """The query names ``speaker`` (one of its name's words)."""
        return bool(speaker) and any(w in self.words for w in _name_words(speaker))

    def answers_when(self, text: str, event_time: datetime, memo: TextTerms | None = None) -> bool:
        """The query asks when and ``text`` says when (``memo``: the user's memo of texts, ``TurnDates.of``)."""
        return self.asks_when and TurnDates.of(text, event_time, memo).says_when

    def in_period(self, text: str, event_time: datetime, memo: TextTerms | None = None) -> bool:
        """The query names a period and the turn is in it: said in it, or its words resolve into it."""
        period = self.period
        if period is None:
            return False
        if period.holds(event_time.date()):
            return True
        return any(period.meets(first, days) for first, days in TurnDates.of(text, event_time, memo).spans)
