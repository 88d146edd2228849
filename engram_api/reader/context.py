"""``get_context``: recalled items rendered as a prompt block within a token budget.

The contract (also in docs/api.md):
- two parts, each only when it has lines: "Current facts" (facts that hold now, each with the date it
  became true) and "Conversation excerpts" (what was said, each with its date and speaker);
- a fact that is no longer current is never in the first part; an excerpt may state an old value, and
  its date lets the reader see that a later fact replaced it;
- lines are chosen in recall order (most relevant first) while they fit in ``max_tokens`` (about four
  characters a token, headers included); a line that does not fit is skipped, not cut;
- within each part, lines keep recall order.
"""

from __future__ import annotations

from collections.abc import Sequence

from engram_api.models import RecallItem

__all__ = ["CHARS_PER_TOKEN", "EXCERPTS_HEADER", "FACTS_HEADER", "build_context"]

CHARS_PER_TOKEN = 4
FACTS_HEADER = "Current facts about the user (most relevant first):"
EXCERPTS_HEADER = "Conversation excerpts (most relevant first; dated, with the speaker):"


def _line(item: RecallItem) -> str:
    if item.kind == "fact":
        return f"- {item.statement} (since {item.valid_from.date().isoformat()})"
    text = " ".join(item.statement.split())
    return f"- [{item.event_time.date().isoformat()}] {item.speaker or 'user'}: {text}"


def build_context(items: Sequence[RecallItem], max_tokens: int) -> str:
    budget = max_tokens * CHARS_PER_TOKEN
    facts: list[str] = []
    excerpts: list[str] = []
    used = 0
    for item in items:
        if item.kind == "fact" and not item.current:
            continue
        part = facts if item.kind == "fact" else excerpts
        line = _line(item)
        cost = len(line) + 1 + (0 if part else len(FACTS_HEADER if part is facts else EXCERPTS_HEADER) + 1)
        if used + cost > budget:
            continue
        part.append(line)
        used += cost
    blocks = []
    if facts:
        blocks.append("\n".join([FACTS_HEADER, *facts]))
    if excerpts:
        blocks.append("\n".join([EXCERPTS_HEADER, *excerpts]))
    return "\n".join(blocks)
