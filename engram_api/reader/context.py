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
- lines are chosen in recall order (most relevant first) while they fit in ``max_tokens``, headers and
  line breaks included, each line's tokens counted by ``count_tokens``; a line that does not fit is
  skipped, not cut;
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

import re
from collections.abc import Collection, Sequence

from engram_api.models import RecallItem
from engram_api.relative_dates import annotate
from engram_api.smalltalk import is_trivial

__all__ = ["EXCERPTS_HEADER", "FACTS_HEADER", "NEAR_S", "count_tokens", "render_context", "select_context"]

NEAR_S = 300  # turns this close in event time are one exchange (LoCoMo's are seconds apart)
# Short headers: every context pays for them (the long ones cost ~3 % of a 1,000-token budget).
FACTS_HEADER = "Facts that hold now:"
EXCERPTS_HEADER = "What was said (dated):"
# The pieces a GPT-style tokenizer first splits text into (cl100k's pre-tokenizer): a contraction's
# ending, a word with the one space or mark before it, up to three digits, a run of marks, line breaks,
# spaces. A common English word is one token, so the count of pieces is close to the count of tokens:
# on get_context's lines (LoCoMo) real tokens per piece are cl100k 1.01 (sd 0.03 a line), o200k 0.98,
# Claude's 1.04, where "four characters a token" was 1.06 with sd 0.17: right on average for English,
# but a date's digits cost about twice their characters' share and long words less, and a CJK character
# is about a token, not a quarter of one (a Chinese context overran its budget 4x).
_PIECE = re.compile(r"'(?:s|t|re|ve|m|ll|d)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def count_tokens(text: str) -> int:
    """About how many tokens an LLM's tokenizer makes of ``text``: one a piece (``_PIECE``), and a piece
    with other than ASCII one per three bytes of UTF-8 (a CJK character is about a token, a Cyrillic or
    Greek word several), so a context in another script is not counted a word a token and overrun."""
    pieces = _PIECE.findall(text)
    if text.isascii():
        return len(pieces)
    return sum(1 if p.isascii() else max(1, len(p.encode()) // 3) for p in pieces)


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
        # each line and header pays for its line break
        cost = count_tokens(_joined(item) if joins else _line(item)) + 1
        cost += 0 if header in headers else count_tokens(header) + 1
        if used + cost > max_tokens:
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
