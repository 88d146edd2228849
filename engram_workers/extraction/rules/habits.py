"""Habits: "I usually ...", "... every morning" make a routine (procedural) fact; "never" makes none."""

from __future__ import annotations

import re

from engram_workers.extraction.rules.lexicon import _BAD_FIRST, _WEEKDAYS, _set
from engram_workers.extraction.rules.state import _MessageState, _Subject
from engram_workers.extraction.rules.text import _HARD_STOP, _about_user, _third_person

_FREQ = (
    r"always|usually|often|normally|typically|generally|regularly|frequently|sometimes|occasionally|"
    r"never|rarely|seldom|hardly\s+ever|almost\s+always|almost\s+never"
)
_NEGATIVE_FREQ = re.compile(r"never|rarely|seldom|hardly\s+ever|almost\s+never", re.I)
_HABIT_LEAD = re.compile(rf"^(?P<aux>(?:am|is|are)\s+)?(?P<adv>{_FREQ})\s+(?P<body>\S.*)$", re.I | re.S)
_HABIT_TAIL = re.compile(
    rf"^(?P<body>.+?)\s+(?P<freq>(?:every|each)\s+(?:single\s+)?(?:day|morning|afternoon|evening|night|week|"
    rf"weekend|month|year|summer|winter|{_WEEKDAYS})|daily|weekly|nightly|monthly|on\s+weekends|"
    rf"on\s+(?:{_WEEKDAYS})s|most\s+(?:days|mornings|evenings|nights|weekends)|"
    rf"(?:once|twice|three\s+times|\d+\s+times)\s+a\s+(?:day|week|month|year))\b(?P<after>.*)$",
    re.I | re.S,
)
_PAST = _set(
    "was|were|had|did|been|went|got|said|made|thought|wanted|used|came|took|saw|knew|felt|became|left|"
    "ran|began|would|could|should"
)


def _present_verb(word: str) -> bool:
    low = word.casefold()
    if not low.isalpha() or low in _PAST or low in _BAD_FIRST:
        return False
    return not (low.endswith("ed") and not low.endswith("eed"))


def _habit(subj: _Subject, rest: str, state: _MessageState) -> tuple[str, bool] | None:
    """'I usually run before work' / 'I run every morning': a procedural HAS_HABIT fact.

    Returns the clause without its frequency words (so "I play tennis every Sunday" still gives
    PLAYS) and whether the frequency negates it ("I never eat meat" says nothing about liking meat).
    """
    lead = _HABIT_LEAD.match(rest)
    tail = None if lead else _HABIT_TAIL.match(rest)
    if lead:
        adv, body = " ".join(lead.group("adv").casefold().split()), lead.group("body")
        if lead.group("aux"):
            said, core = f"is {adv} {body}", f"{lead.group('aux')}{body}"
        else:
            verb, _, after = body.partition(" ")
            if not _present_verb(verb):
                return None
            said, core = f"{adv} {_third_person(verb) if subj.is_user else verb} {after}", body
        negative = bool(_NEGATIVE_FREQ.fullmatch(adv))
    elif tail:
        body = tail.group("body")
        verb, _, after = body.partition(" ")
        if not _present_verb(verb):
            return None
        verb = _third_person(verb) if subj.is_user else verb
        said, core, negative = f"{verb} {after} {tail.group('freq')}{tail.group('after')}", body, False
    else:
        return None
    said = _HARD_STOP.split(said, maxsplit=1)[0].strip(" ,")[:300]
    statement = f"{subj.name} {_about_user(said) if subj.is_user else said}"
    state.emit(subj, "HAS_HABIT", statement, memory_type="procedural")
    return core, negative
