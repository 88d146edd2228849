"""Rule family "the person": marriage and relationship status, diet, age, birthday and name."""

from __future__ import annotations

import re
from datetime import timedelta

from engram_workers.extraction.rules.dates import _date
from engram_workers.extraction.rules.handlers import _Handler, _since
from engram_workers.extraction.rules.objects import _person, _take_name
from engram_workers.extraction.rules.state import _MessageState, _Subject
from engram_workers.extraction.rules.text import _ARTICLE, _a, _cut, _possessive


def _h_married(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    person = _person(m.group("o"), state)
    if person is None:
        return True
    engaged = m.group("kind").casefold() == "engaged"
    if subj.is_user:
        person = person._replace(aliases=("user's fiance" if engaged else "user's spouse",))
    predicate, verb = ("ENGAGED_TO", "is engaged to") if engaged else ("MARRIED_TO", "is married to")
    changed = m.group("verb").casefold() == "got"
    state.emit(subj, predicate, f"{subj.name} {verb} {person.phrase}", person, valid_from=_since(state, changed))
    return True


def _h_status(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    status = " ".join(m.group("o").casefold().split())
    changed = m.group("verb").casefold() == "got"
    state.emit(subj, "RELATIONSHIP_STATUS", f"{subj.name} is {status}", valid_from=_since(state, changed))
    return True


def _h_diet(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    diet = "-".join(m.group("o").casefold().replace("-", " ").split())
    state.emit(subj, "DIET", f"{subj.name} follows {_a(diet)} {diet} diet")
    return True


def _age(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        years = int(m.group("n"))
        if 0 < years <= 120:
            state.emit(subj, "AGE", f"{subj.name} is {years} years old", valid_from=_since(state, changed))
        return True

    return handle


_BIRTHDAY_SHIFT = {"today": 0, "tomorrow": 1, "yesterday": -1}


def _h_birthday(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'my birthday is March 3rd' (or "today", resolved to the message's date)."""
    raw = _ARTICLE.sub("", m.group("o").strip())
    shift = _BIRTHDAY_SHIFT.get(_cut(raw).casefold())
    if shift is not None:
        day = state.event_time + timedelta(days=shift)
        date: str | None = f"{day:%B} {day.day}"
    else:
        date = _date(raw)
    if date is not None:  # "my birthday is soon" gives no date
        state.emit(subj, "BIRTHDAY", f"{_possessive(subj.name)} birthday is {date}")
    return True


def _h_name(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    taken = _take_name(m.group("o").strip(), state)
    if taken is not None:
        state.emit(subj, "NAME", f"{_possessive(subj.name)} name is {taken[0]}")
    return True
