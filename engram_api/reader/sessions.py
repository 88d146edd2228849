"""A conversation's sessions as evidence: a session whose turns together hold the query's words lifts
every turn said in it.

What answers a question is often spread over one sitting: "Where did you move?" / "Austin." / "We love the
food there", or a plan told over several turns. A turn whose own words miss the query ranks low by them,
yet the session it belongs to may hold every word of the query across its turns; LoCoMo's evidence sits
in one session for 1.0-1.6 of a question's sessions by category (2.3 multi-hop), and the session whose
keyword hits cover the most of the query holds it for three questions in four (docs/benchmarks/history.md,
"A conversation's sessions as evidence").

Invariants:
- a session is the calendar day (UTC) a turn was said on: a pure function of the turn's event time, so no
  store read and no boundary to keep as the conversation grows;
- a session's share is the share of the query's stems (those a turn's keyword share is scored on:
  ``fusion._Run._turn_stems``) that the keyword channel's episode hits said in it hold together, from 0 to 1;
  the hits are the same documents for a held snapshot and the store (the contract suite), so both readers
  give every turn the same share;
- it only adds: a turn (whichever channel found it or linked it) gets ``RecallRecipe.session_boost`` times
  its session's share on its fusion score, beside the query cues; a fact gets nothing, as with the cues,
  and a recipe without the keyword channel has no hits and lifts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime

from engram_api.storage.snapshot.rows import AnyChunk

__all__ = ["NO_SESSIONS", "SessionShares"]


def session_of(event_time: datetime) -> date:
    """The session a turn said at ``event_time`` belongs to: its day."""
    return event_time.date()


@dataclass(frozen=True, slots=True)
class SessionShares:
    """Each session's share of the query's stems, held by its keyword hits together (module doc)."""

    shares: dict[date, float]

    @classmethod
    def of(
        cls, hits: Iterable[AnyChunk], query_stems: frozenset[str], terms: Mapping[str, frozenset[str]]
    ) -> SessionShares:
        """The shares of the sessions ``hits`` (the keyword channel's episode hits) were said in; ``terms``:
        the recall's memo of texts' terms (``reader.terms``)."""
        if not query_stems:
            return cls({})
        held: dict[date, set[str]] = {}
        for chunk in hits:
            held.setdefault(session_of(chunk.event_time), set()).update(query_stems & terms[chunk.indexed_text])
        return cls({day: len(words) / len(query_stems) for day, words in held.items()})

    def share(self, chunk: AnyChunk) -> float:
        """The share of the session ``chunk`` was said in (0 when no hit was said in it)."""
        return self.shares.get(session_of(chunk.event_time), 0.0)


NO_SESSIONS = SessionShares({})
"""No session holds a word of the query: before the keyword channel is ranked, or with a boost of 0."""
