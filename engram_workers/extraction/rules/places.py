"""Rule family "where one lives and has been": moves, birthplaces, trips, coming back from somewhere."""

from __future__ import annotations

import re

from engram_workers.extraction.rules.dates import _date, _resolve_when, _split_when
from engram_workers.extraction.rules.handlers import _Handler
from engram_workers.extraction.rules.objects import _place
from engram_workers.extraction.rules.state import _MessageState, _Obj, _Subject


def _h_move(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'moved (from X) to Y': LIVES_IN Y from now on; where they came from is a MOVED_FROM event."""
    groups = m.groupdict()
    to = _place(groups["b"], state) if groups.get("b") else None
    origin = _place(groups["a"], state) if groups.get("a") else None
    if to is not None:
        state.emit(subj, "LIVES_IN", f"{subj.name} lives in {to.phrase}", to, valid_from=state.event_time)
    if origin is not None:
        where = f" to {to.phrase}" if to is not None else ""
        state.emit(
            subj,
            "MOVED_FROM",
            f"{subj.name} moved from {origin.phrase}{where}",
            origin,
            memory_type="episodic",
            valid_from=state.event_time,
        )
    return True


def _h_born(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    raw = m.group("o").strip()
    date = _date(raw)
    if date is not None:
        state.emit(subj, "BIRTHDAY", f"{subj.name} was born {m.group('prep').lower()} {date}")
    elif re.match(r"(?:19|20)\d\d\b", raw):
        state.emit(subj, "BIRTH_YEAR", f"{subj.name} was born in {raw[:4]}")
    else:
        place = _place(raw, state)
        if place is not None:
            state.emit(subj, "BORN_IN", f"{subj.name} was born in {place.phrase}", place)
    return True


def _visited(*, need_when: bool, school_hint: bool = False) -> _Handler:
    """Trips: episodic with a time phrase, semantic without ("I've been to Japan")."""

    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        raw, when = _split_when(m.group("o"))
        if need_when and when is None:
            return True
        place = _place(raw, state)
        if place is None:
            return True
        if school_hint and _SCHOOL.search(place.name):  # "I went to Boston College" is schooling
            org = _Obj(place.name, "Organization", place.phrase)
            state.emit(subj, "STUDIED_AT", f"{subj.name} studied at {org.phrase}", org)
            return True
        at = _resolve_when(when, state.event_time) if when else None
        tail = f" on {at:%Y-%m-%d}" if at is not None else f" {when}" if when else ""
        state.emit(
            subj,
            "VISITED",
            f"{subj.name} visited {place.phrase}{tail}",
            place,
            memory_type="episodic" if when else "semantic",
            valid_from=at,
        )
        return True

    return handle


_SCHOOL = re.compile(r"\b(?:university|college|school|institute|academy|polytechnic)\b", re.I)


def _h_back_from(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    place = _place(_split_when(m.group("o"))[0], state)
    if place is not None:
        state.emit(
            subj,
            "VISITED",
            f"{subj.name} came back from {place.phrase}",
            place,
            memory_type="episodic",
            valid_from=state.event_time,
        )
    return True
