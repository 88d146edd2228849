"""The trivial-message filter: small talk that can hold no memory skips extraction entirely.

What small talk is lives in ``engram_api.smalltalk`` (the reader's ``get_context`` uses it too). Small
talk that answers a question someone else asked in the message or just before it ("Still in Tampa?" /
"Yes!") still goes to an extractor: then "yes" may hold a fact.
"""

from __future__ import annotations

from engram_api.models import Envelope
from engram_api.smalltalk import is_trivial
from engram_workers.extraction.prompt import is_owner_turn

__all__ = ["answers_a_question", "is_trivial"]


def answers_a_question(envelope: Envelope) -> bool:
    """True when a turn by someone else than the sender, in the message or the last earlier turn, asks a
    question: then "yes" or "sure" is an answer that may hold a fact, not small talk."""
    turns = [*envelope.earlier[-1:], *envelope.messages]
    owners = [i for i, m in enumerate(turns) if is_owner_turn(m, envelope.owner_name)]
    last = owners[-1] if owners else len(turns)
    return any("?" in m.content for m in turns[:last] if not is_owner_turn(m, envelope.owner_name))
