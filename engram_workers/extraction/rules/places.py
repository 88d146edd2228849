"""Rule family "where one lives and has been": moves, birthplaces, trips, coming back from somewhere."""

from __future__ import annotations

import re

from engram_workers.extraction.rules.context import _Ctx, _Obj, _Subject
from engram_workers.extraction.rules.dates import _date, _resolve_when, _split_when
from engram_workers.extraction.rules.handlers import _Handler
from engram_workers.extraction.rules.objects import _place


def _h_move(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'moved (from X) to Y': LIVES_IN Y from now on; where they came from is a MOVED_FROM event."""
    groups = m.groupdict()
    to = _place(groups["b"], ctx) if groups.get("b") else None
    origin = _place(groups["a"], ctx) if groups.get("a") else None
    if to is not None:
        ctx.emit(subj, "LIVES_IN", f"{subj.name} lives in {to.phrase}", to, valid_from=ctx.event_time)
    if origin is not None:
        where = f" to {to.phrase}" if to is not None else ""
        ctx.emit(
            subj,
            "MOVED_FROM",
            f"{subj.name} moved from {origin.phrase}{where}",
            origin,
            memory_type="episodic",
            valid_from=ctx.event_time,
        )
    return True


def _h_born(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    raw = m.group("o").strip()
    date = _date(raw)
    if date is not None:
        ctx.emit(subj, "BIRTHDAY", f"{subj.name} was born {m.group('prep').lower()} {date}")
    elif re.match(r"(?:19|20)\d\d\b", raw):
        ctx.emit(subj, "BIRTH_YEAR", f"{subj.name} was born in {raw[:4]}")
    else:
        place = _place(raw, ctx)
        if place is not None:
            ctx.emit(subj, "BORN_IN", f"{subj.name} was born in {place.phrase}", place)
    return True


def _visited(*, need_when: bool, school_hint: bool = False) -> _Handler:
    """Trips: episodic with a time phrase, semantic without ("I've been to Japan")."""

    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        raw, when = _split_when(m.group("o"))
        if need_when and when is None:
            return True
        place = _place(raw, ctx)
        if place is None:
            return True
        if school_hint and _SCHOOL.search(place.name):  # "I went to Boston College" is schooling
            org = _Obj(place.name, "Organization", place.phrase)
            ctx.emit(subj, "STUDIED_AT", f"{subj.name} studied at {org.phrase}", org)
            return True
        at = _resolve_when(when, ctx.event_time) if when else None
        tail = f" on {at:%Y-%m-%d}" if at is not None else f" {when}" if when else ""
        ctx.emit(
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


def _h_back_from(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    place = _place(_split_when(m.group("o"))[0], ctx)
    if place is not None:
        ctx.emit(
            subj,
            "VISITED",
            f"{subj.name} came back from {place.phrase}",
            place,
            memory_type="episodic",
            valid_from=ctx.event_time,
        )
    return True
