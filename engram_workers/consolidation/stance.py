"""What a model's own statement says about the fact it gives: negated, hypothetical, past, or about someone else.

Models get the triple wrong in ordinary ways that the sentence they write next to it gets right: ``LIVES_IN
Berlin`` with "User might move to Berlin", ``WORKS_AT Google`` with "User no longer works at Google",
``ALLERGIC_TO peanuts`` with "User is not allergic to peanuts", subject ``user`` with "User's sister lives
in Paris". Consolidation therefore reads the statement before it lets a fact change a one-value slot or
reinforce a stored fact (docs/extraction.md, "How a statement is read").

The cues are English word patterns on the statement (the prompt asks for statements in English, written
about "User"). They are deliberately narrow: a cue that fires wrongly only keeps a fact out of a slot or
records it as history, it never deletes anything; a missed cue leaves the model's triple as it was.

Invariants: pure functions of the text, no I/O; ``read_stance`` never raises on any string.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from engram_api.naming import RELATIONS

__all__ = ["Stance", "read_stance"]

_NEGATION = re.compile(
    r"\b(?:not|never|no longer|no more|nor|isn't|aren't|wasn't|weren't|doesn't|don't|didn't|hasn't|haven't|"
    r"won't|cannot|can't|nobody|none)\b",
    re.IGNORECASE,
)
_NO = re.compile(r"\bno\s+(?!one\b)[a-z]")  # "has no pets"; lower-case only: "No Frills" is a name
_HYPOTHETICAL = re.compile(
    r"\b(?:might|maybe|perhaps|possibly|could|would|considering|consider|thinking (?:about|of)|plans?|planning|"
    r"hopes?|hoping|wants?|wanting|wish(?:es)?|dreams? of|if|whether|going to|will|someday|eventually|"
    r"intends?|undecided)\b|\bmay\b",  # "may" lower-case only: "in May" is a date
    re.IGNORECASE,
)
_MAY_MONTH = re.compile(r"\bMay\b")
_PAST = re.compile(
    r"\b(?:used to|formerly|previously|former|ex-|no longer|anymore|any more|in the past|once (?:lived|worked|"
    r"studied)|was (?:living|working|married|studying|dating|employed|based|engaged|a|an)|were (?:living|"
    r"working|married|dating|based))\b|(?<!has )(?<!have )(?<!had )\b(?:lived|worked|studied|resided|dated)\b",
    re.IGNORECASE,
)
# Verbs of leaving say "past" only of what they leave: "left Google to join Meta" ends Google, not Meta.
_LEFT = re.compile(r"\b(?:left|quit|retired from|moved (?:away )?(?:from|out of)|divorced)\s+(?:the\s+)?(\w+)", re.I)
# A clause boundary: "used to live in Tampa, now lives in Austin" says two things; each object gets its own.
_CLAUSE = re.compile(r"[,;]|\b(?:but|while|whereas|then|now|currently|these days|nowadays|since)\b", re.I)
_OTHER_SUBJECT = re.compile(
    rf"^\s*(?:the\s+)?(?:user(?:'s|’s|s')|my|his|her|their)\s+(?:\w+\s+)?(?:{RELATIONS})\b", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Stance:
    """How the statement stands toward its triple. All false: a plain present assertion."""

    negated: bool = False  # "is not", "no longer", "never": the opposite of the triple holds
    hypothetical: bool = False  # "might", "wants to", "is considering": nothing holds yet
    past: bool = False  # "used to", "left", "lived" (not "has lived"): held once, not now
    other_subject: bool = False  # "User's sister ...": about someone else than the subject given

    @property
    def plain(self) -> bool:
        return not (self.negated or self.hypothetical or self.past or self.other_subject)


def _clause_of(text: str, names: Sequence[str]) -> str:
    """The clause that names the fact's object (the whole statement when none does)."""
    wanted = [n.lower() for n in names if n and n.strip()]
    if not wanted:
        return text
    for clause in _CLAUSE.split(text):
        if any(n in clause.lower() for n in wanted):
            return clause
    return text


def read_stance(statement: str, object_names: Sequence[str] = ()) -> Stance:
    """The cues in one statement about the object called ``object_names`` (its name and aliases; none for
    an attribute fact). Negation, modality and tense are read in the clause that names the object; whose
    fact it is, from the statement's start."""
    text = " ".join(statement.split())[:1000]
    clause = _clause_of(text, object_names)
    # "in May" is a month, not a modal: take capitalised "May" out before the case-blind match.
    modal = _MAY_MONTH.sub(" ", clause)
    firsts = {n.lower().split()[0] for n in object_names if n and n.split()}
    left = any(m.group(1).lower() in firsts for m in _LEFT.finditer(clause)) if firsts else bool(_LEFT.search(clause))
    return Stance(
        negated=bool(_NEGATION.search(clause) or _NO.search(clause)),
        hypothetical=bool(_HYPOTHETICAL.search(modal)),
        past=bool(_PAST.search(clause)) or left,
        other_subject=bool(_OTHER_SUBJECT.search(text)),
    )
