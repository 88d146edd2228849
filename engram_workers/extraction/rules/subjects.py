"""Clauses and subjects: splitting a sentence into clauses and finding who each clause is about."""

from __future__ import annotations

import re

from engram_workers.extraction.rules.family import _introduce
from engram_workers.extraction.rules.habits import _HABIT_LEAD, _habit
from engram_workers.extraction.rules.lexicon import (
    _ADV,
    _ADV_WORDS,
    _KIN_MODS,
    _MAX_CLAUSE,
    _PET_MODS,
    _PETS,
    _RELATIONS,
    _alt,
)
from engram_workers.extraction.rules.objects import _take_name
from engram_workers.extraction.rules.state import _MessageState, _Subject
from engram_workers.extraction.rules.table import _RULES, _SELF_RULES

_FILLERS = (
    r"and|but|so|also|plus|then|oh|well|actually|btw|by\s+the\s+way|fyi|anyway|anyways|honestly|"
    r"basically|now|yeah|yes|yep|no|hey|hi|hello|ok|okay|um|uh|lol|haha|just\s+so\s+you\s+know|fun\s+fact|"
    r"ps|p\.s\.|i\s+think(?:\s+that)?|i\s+guess|i\s+believe(?:\s+that)?|i\s+mean|i\s+feel\s+like|"
    r"i\s+would\s+say|i\s+should\s+mention(?:\s+that)?|i\s+forgot\s+to\s+mention(?:\s+that)?|"
    r"to\s+be\s+honest|tbh|as\s+you\s+know|you\s+know|remember(?:\s+that)?|note(?:\s+that)?|"
    r"for\s+the\s+record|for\s+context|in\s+fact|guess\s+what|thanks|thank\s+you|" + _ADV_WORDS
)
_LEAD = re.compile(rf"^[\s,:;.!'\"*-]*(?:(?:{_FILLERS})\b[\s,:;.!*-]*)*", re.I)
_LEAD_ADV = re.compile(rf"^(?:{_ADV}[\s,]+)+", re.I)
_SEP = re.compile(
    r"(\s*[,;]\s*(?:(?:and|but|so|plus|also|then)\s+)?|\s+(?:and|but|so|plus|also|then|while|whereas|because|"
    r"cause|since|though|although)\s+|\s+[-–—]+\s+)",
    re.I,
)
_MY_SELF = (
    r"my\s+(?=(?:all[- ]time\s+|absolute\s+|very\s+|main\s+)?(?:favou?rite|fave?|hobby|hobbies|pastimes?|"
    r"passions?|birthday|bday|b-day|date\s+of\s+birth|dob|(?:first\s+|full\s+|real\s+)?name|native|first\s+language|"
    r"mother\s+tongue)\b)"
)
_SELF = re.compile(r"^i(?:\s+(?P<rest>.*))?$", re.I | re.S)
_PRONOUN = re.compile(r"^(?:he|she|who)(?:\s+(?P<rest>.*))?$", re.I | re.S)
_KIN_SUBJECT = re.compile(
    rf"^my\s+(?P<mods>{_KIN_MODS})(?P<word>{_alt(_RELATIONS)})(?![\w-])(?P<after>.*)$", re.I | re.S
)
_PET_SUBJECT = re.compile(rf"^my\s+(?P<mods>{_PET_MODS})(?P<word>{_alt(_PETS)})(?![\w-])(?P<after>.*)$", re.I | re.S)
_MY_SELF_RE = re.compile(rf"^{_MY_SELF}", re.I)
_INTRO = re.compile(
    r"^\s*(?:'s\s+name\s+is|,?\s*(?:whose\s+name\s+is|who\s+is\s+(?:named|called)|is\s+(?:named|called)|named|"
    r"called)|,)?\s*",
    re.I,
)


def _past(pattern: re.Pattern[str], text: str) -> str:
    """``text`` after ``pattern``'s match at its start (these patterns may match the empty string)."""
    m = pattern.match(text)
    return text[m.end() :] if m else text


def _strip_lead(text: str) -> str:
    return _past(_LEAD, text).strip()


def _starts_rule(text: str) -> bool:
    """Whether ``text`` opens with a verb phrase some rule knows ("works at ...")."""
    text = _LEAD_ADV.sub("", text.strip())
    return bool(_HABIT_LEAD.match(text)) or any(rule.pattern.match(text) for rule in _RULES)


def _opens_clause(piece: str) -> bool:
    """Whether a piece after a comma or conjunction stands on its own (else it continues a list).

    Only the piece's head decides (a clause longer than ``_MAX_CLAUSE`` is dropped either way), so the
    regex work per piece is bounded whatever the sentence's length.
    """
    text = _strip_lead(piece[: _MAX_CLAUSE + 1])
    if _SELF.match(text) or _PRONOUN.match(text) or _MY_SELF_RE.match(text):
        return True
    if _KIN_SUBJECT.match(text) or _PET_SUBJECT.match(text):
        return True
    return _starts_rule(text) or any(rule.pattern.match(text) for rule in _SELF_RULES)


def _clauses(sentence: str) -> list[str]:
    parts = _SEP.split(sentence)
    clauses = [parts[0]]
    for sep, piece in zip(parts[1::2], parts[2::2], strict=True):
        if _opens_clause(piece):
            clauses.append(piece)
        else:
            clauses[-1] += sep + piece
    return clauses


def _parse_subject(clause: str, state: _MessageState) -> tuple[_Subject, str] | None:
    """The clause's subject and the rest of it, or None when it opens with no known subject."""
    m = _SELF.match(clause)
    if m:
        return state.user(), m.group("rest") or ""
    m = _KIN_SUBJECT.match(clause) or _PET_SUBJECT.match(clause)
    if m:
        mods = " ".join(m.group("mods").casefold().split())
        after = m.group("after")
        taken = _take_name(_past(_INTRO, after), state)
        subject = _introduce(mods, m.group("word").casefold(), taken[0] if taken else None, state)
        if taken:
            state.subject_ref(subject)  # a named relative is worth remembering on its own
            return subject, taken[1]
        state.last_animate = subject
        return subject, after
    m = _PRONOUN.match(clause)
    if m:
        return (state.last_animate, m.group("rest") or "") if state.last_animate else None
    if _MY_SELF_RE.match(clause):
        return state.user(), clause
    return None


def _predicate(subj: _Subject, rest: str, state: _MessageState) -> None:
    rest = _LEAD_ADV.sub("", rest.strip(" ,"))
    habit = _habit(subj, rest, state)
    if habit is not None:
        core, negative = habit
        if negative:
            return
        rest = _LEAD_ADV.sub("", core)
    outer = state.routine
    state.routine = outer or habit is not None
    try:
        for rule in _RULES:
            m = rule.pattern.match(rest)
            if m is not None and rule.handler(m, subj, state):
                return
    finally:
        state.routine = outer


def _clause(clause: str, state: _MessageState, previous: _Subject | None) -> _Subject | None:
    """Extract from one clause; returns its subject, which a following subjectless clause inherits."""
    if len(clause) > 2 * _MAX_CLAUSE:
        return previous  # far too long even after stripping a lead: a paste, not a statement
    clause = _strip_lead(clause)
    if not clause or len(clause) > _MAX_CLAUSE:
        return previous
    parsed = _parse_subject(clause, state)
    if parsed is None:
        for rule in _SELF_RULES:
            m = rule.pattern.match(clause)
            if m is not None and rule.handler(m, state.user(), state):
                return state.user()
        if previous is None:
            return None  # "Play some jazz" is a request to the assistant, not a fact about the user
        parsed = previous, clause
    subject, rest = parsed
    _predicate(subject, rest, state)
    return subject
