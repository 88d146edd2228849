"""``get_context``: recalled items rendered as a prompt block within a token budget.

The contract (also in docs/api.md):
- two parts, each only when it has lines: "Current facts" (facts that hold now, each with the date it
  became true) and "Conversation excerpts" (what was said, each with its date and speaker);
- a fact that is no longer current is never in the first part; an excerpt may state an old value, and
  its date lets the reader see that a later fact replaced it; but an excerpt whose every extracted fact
  has ended is shown only when the query names it (a keyword match): "I live in Tampa." answers "where
  did I live?", and is only misleading in a context for "plan a dinner for me" that has no room for
  "User lives in Austin" (``Reader.context_items`` finds them: ``replaced``);
- small talk ("Good morning!", "thanks!": ``engram_api.smalltalk``) is never an excerpt: recall ranks
  every message, and for a query nothing in the conversation answers, a greeting can be the nearest
  (MiniLM puts "Good morning!" closer to "plan a dinner for me" than many an answer to its question);
- lines are chosen in recall order (most relevant first) while they fit in ``max_tokens`` (about four
  characters a token, headers included); a line that does not fit is skipped, not cut;
- within each part, lines keep recall order;
- relative expressions ("last month", "yesterday") are followed by what they meant when the source
  message was sent (``relative_dates.annotate`` against the item's event time), e.g.
  "User visited Tokyo last month (= 2026-10) (since 2026-11-27)".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from engram_api.models import RecallItem
from engram_api.relative_dates import annotate
from engram_api.smalltalk import is_trivial

__all__ = ["CHARS_PER_TOKEN", "EXCERPTS_HEADER", "FACTS_HEADER", "render_context", "select_context"]

CHARS_PER_TOKEN = 4
FACTS_HEADER = "Current facts about the user (most relevant first):"
EXCERPTS_HEADER = "Conversation excerpts (most relevant first; dated, with the speaker):"


def _line(item: RecallItem) -> str:
    if item.kind == "fact":
        return f"- {annotate(item.statement, item.event_time)} (since {item.valid_from.date().isoformat()})"
    text = annotate(" ".join(item.statement.split()), item.event_time)
    return f"- [{item.event_time.date().isoformat()}] {item.speaker or 'user'}: {text}"


def _header(item: RecallItem) -> str:
    return FACTS_HEADER if item.kind == "fact" else EXCERPTS_HEADER


def select_context(items: Sequence[RecallItem], max_tokens: int, replaced: Collection[str] = ()) -> list[RecallItem]:
    """The items whose lines fit in the budget, in recall order (superseded facts, small talk and the
    ``replaced`` excerpts never)."""
    budget = max_tokens * CHARS_PER_TOKEN
    chosen: list[RecallItem] = []
    headers: set[str] = set()
    used = 0
    for item in items:
        if item.kind == "fact" and not item.current:
            continue
        if item.kind == "episode" and (item.id in replaced or is_trivial(item.statement)):
            continue
        header = _header(item)
        cost = len(_line(item)) + 1 + (0 if header in headers else len(header) + 1)
        if used + cost > budget:
            continue
        chosen.append(item)
        headers.add(header)
        used += cost
    return chosen


def render_context(items: Sequence[RecallItem]) -> str:
    """Facts part, then excerpts part; each only when it has lines."""
    blocks = []
    for header in (FACTS_HEADER, EXCERPTS_HEADER):
        lines = [_line(i) for i in items if _header(i) == header]
        if lines:
            blocks.append("\n".join([header, *lines]))
    return "\n".join(blocks)
