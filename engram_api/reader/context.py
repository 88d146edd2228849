"""``get_context``: recalled items rendered as a prompt block within a token budget.

The contract (also in docs/api.md):
- two parts, each only when it has lines: ``FACTS_HEADER`` (facts that hold now, each with the date it
  became true) and ``EXCERPTS_HEADER`` (what was said, each with its date and speaker); the headers are
  short, since every context pays for them out of its budget;
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
- an excerpt whose text is already shown is left out (the same words said twice); a fact is kept next
  to the excerpt it came from, since only the fact says that it holds now;
- an excerpt said within ``NEAR_S`` of an excerpt already chosen (the other side of the exchange) is
  shown under it as an indented "speaker: text" line, without repeating the date: one excerpt of the
  exchange, which saves the tokens of a dated line;
- within each part, lines keep recall order (a merged turn follows the excerpt it joined);
- relative expressions ("last month", "yesterday") are followed by what they meant when the source
  message was sent (``relative_dates.annotate`` against the item's event time), e.g.
  "User visited Tokyo last month (= 2026-10) (since 2026-11-27)".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from engram_api.models import RecallItem
from engram_api.relative_dates import annotate
from engram_api.smalltalk import is_trivial

__all__ = ["CHARS_PER_TOKEN", "EXCERPTS_HEADER", "FACTS_HEADER", "NEAR_S", "render_context", "select_context"]

CHARS_PER_TOKEN = 4
NEAR_S = 300  # turns this close in event time are one exchange (LoCoMo's are seconds apart)
# Short headers: every context pays for them (the long ones cost ~3 % of a 1,000-token budget).
FACTS_HEADER = "Facts that hold now:"
EXCERPTS_HEADER = "What was said (dated):"


def _line(item: RecallItem) -> str:
    if item.kind == "fact":
        return f"- {annotate(item.statement, item.event_time)} (since {item.valid_from.date().isoformat()})"
    text = annotate(" ".join(item.statement.split()), item.event_time)
    return f"- [{item.event_time.date().isoformat()}] {item.speaker or 'user'}: {text}"


def _joined(item: RecallItem) -> str:
    """An excerpt's line under the excerpt of its exchange it joined: its speaker and text."""
    return f"  {item.speaker or 'user'}: {annotate(' '.join(item.statement.split()), item.event_time)}"


def _header(item: RecallItem) -> str:
    return FACTS_HEADER if item.kind == "fact" else EXCERPTS_HEADER


def _head(item: RecallItem, heads: Sequence[RecallItem]) -> RecallItem | None:
    """The first dated excerpt ``item`` (an excerpt) was said within ``NEAR_S`` of, if any."""
    return next((h for h in heads if abs((h.event_time - item.event_time).total_seconds()) <= NEAR_S), None)


def _groups(excerpts: Sequence[RecallItem]) -> list[list[RecallItem]]:
    """Excerpts in recall order, each joined to the first earlier dated one of its exchange."""
    groups: list[list[RecallItem]] = []
    for item in excerpts:
        head = _head(item, [g[0] for g in groups])
        if head is None:
            groups.append([item])
        else:
            next(g for g in groups if g[0] is head).append(item)
    return groups


def select_context(items: Sequence[RecallItem], max_tokens: int, replaced: Collection[str] = ()) -> list[RecallItem]:
    """The items whose lines fit in the budget, in recall order (superseded facts, small talk and the
    ``replaced`` excerpts never)."""
    budget = max_tokens * CHARS_PER_TOKEN
    chosen: list[RecallItem] = []
    heads: list[RecallItem] = []  # the chosen excerpts shown with their date
    headers: set[str] = set()
    texts: set[str] = set()
    used = 0
    for item in items:
        if item.kind == "fact" and not item.current:
            continue
        if item.kind == "episode" and (
            item.id in replaced or is_trivial(item.statement) or item.statement.strip() in texts
        ):
            continue
        header = _header(item)
        joins = item.kind == "episode" and _head(item, heads) is not None
        cost = len(_joined(item) if joins else _line(item)) + 1 + (0 if header in headers else len(header) + 1)
        if used + cost > budget:
            continue
        chosen.append(item)
        headers.add(header)
        used += cost
        if item.kind == "episode":
            heads += [] if joins else [item]
            texts.add(item.statement.strip())
    return chosen


def render_context(items: Sequence[RecallItem]) -> str:
    """Facts part, then excerpts part; each only when it has lines. ``items`` are ``select_context``'s."""
    blocks = []
    facts = [_line(i) for i in items if i.kind == "fact"]
    if facts:
        blocks.append("\n".join([FACTS_HEADER, *facts]))
    groups = _groups([i for i in items if i.kind == "episode"])
    if groups:
        blocks.append("\n".join([EXCERPTS_HEADER, *(line for g in groups for line in _lines(g))]))
    return "\n".join(blocks)


def _lines(group: Sequence[RecallItem]) -> list[str]:
    return [_line(group[0]), *(_joined(i) for i in group[1:])]
