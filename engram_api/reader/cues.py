"""What a query's words say about the turn that answers it, read without a model: who it names and
whether it asks when.

Invariants:
- a pure function of the query text and the candidate's own fields (speaker, text, event time); no store
  reads, so a cue costs the same on a held snapshot and on the store;
- a speaker is named when one of the words of its name is a word of the query (case-insensitive,
  possessive "'s" dropped): "When did Melanie sign up?" names the speaker "Melanie", "my brother"
  names no one, and the user's own turns (speaker "user") are never named;
- a turn says when if the project's relative-date resolver resolves an expression in it ("yesterday",
  "last Friday": ``relative_dates.annotate``) or it names a month, a weekday or a year;
- a query asks when if it opens with "when" or asks for a date, day, month, year or time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from engram_api.relative_dates import annotate

__all__ = ["QueryCues"]

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
_NOBODY = frozenset({"user", "assistant", "system", "i", "me", "my"})


@lru_cache(maxsize=4096)
def _name_words(speaker: str) -> tuple[str, ...]:
    """The words of a speaker's name that can name it (a conversation has few speakers: read once)."""
    return tuple(w for w in _WORD.findall(speaker.lower()) if w not in _NOBODY)


@dataclass(frozen=True, slots=True)
class QueryCues:
    words: frozenset[str]
    asks_when: bool

    @classmethod
    def of(cls, query: str) -> QueryCues:
        text = query.lower().replace("'s", "").replace("\u2019s", "")
        return cls(words=frozenset(_WORD.findall(text)), asks_when=bool(_ASKS_WHEN.search(query)))

    def names(self, speaker: str | None) -> bool:
        """The query names ``speaker`` (one of its name's words)."""
        return bool(speaker) and any(w in self.words for w in _name_words(speaker))

    def answers_when(self, text: str, event_time: datetime) -> bool:
        """The query asks when and ``text`` says when."""
        return self.asks_when and (bool(_NAMES_TIME.search(text)) or annotate(text, event_time) != text)
