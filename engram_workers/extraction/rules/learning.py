"""Rule family "learning": languages spoken and learned, studies and degrees."""

from __future__ import annotations

import re

from engram_api.naming import is_single_valued
from engram_workers.extraction.rules.handlers import _emit_list, _Handler, _since
from engram_workers.extraction.rules.lexicon import _LANGUAGES
from engram_workers.extraction.rules.objects import _org, _things
from engram_workers.extraction.rules.state import _MessageState, _Obj, _Subject
from engram_workers.extraction.rules.text import _possessive, _titlecase


def _language(item: _Obj, state: _MessageState) -> _Obj | None:
    """Languages come from the lexicon, or are capitalized in a cased message ("Tagalog").

    ``item`` must come from ``_things`` with a common-noun label, so its name is still as written.
    """
    low = item.name.casefold()
    if low in _LANGUAGES or (state.cased and item.name[:1].isupper() and len(item.name.split()) <= 2):
        name = item.name.upper() if low in ("asl", "bsl") else _titlecase(item.name)
        return _Obj(name, "Language", name)
    return None


def _languages(predicate: str, template: str) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        for item in _things(m.group("o"), state, "Thing", single=is_single_valued(predicate)):
            lang = _language(item, state)
            if lang is not None:
                statement = template.format(s=subj.name, p=_possessive(subj.name), o=lang.phrase)
                state.emit(subj, predicate, statement, lang)
        return True

    return handle


def _learning(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        for item in _things(m.group("o"), state, "Skill"):
            obj = _language(item, state) if item.name.casefold() in _LANGUAGES else item
            if obj is not None:
                statement = f"{subj.name} is learning {obj.phrase}"
                state.emit(subj, "LEARNING", statement, obj, valid_from=_since(state, changed))
        return True

    return handle


_STUDY_AT = re.compile(r"(?:^|\s+)at\s+(?P<org>.+)$", re.I | re.S)


def _studies(past: bool) -> _Handler:
    """'study physics (at MIT)', 'study at MIT'; the past tense gives STUDIED / STUDIED_AT."""
    field_predicate, org_predicate = ("STUDIED", "STUDIED_AT") if past else ("STUDIES", "STUDIES_AT")
    verb = "studied" if past else "studies"

    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        raw = m.group("o")
        at = _STUDY_AT.search(raw)
        subject_raw = raw[: at.start()] if at else raw
        if subject_raw.strip():
            _emit_list(subj, state, subject_raw, field_predicate, f"{{s}} {verb} {{o}}", "Subject")
        org = _org(at.group("org"), state) if at else None
        if org is not None:
            state.emit(subj, org_predicate, f"{subj.name} {verb} at {org.phrase}", org)
        return True

    return handle


_DEGREE_IN = re.compile(r"\s+with\s+(?:a|an|my)\s+(?:[\w']+\s+){0,2}?in\s+(?P<f>.+)$", re.I | re.S)
_YEAR = re.compile(r"\bin\s+((?:19|20)\d\d)\b")


def _h_graduated(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    raw = m.group("o")
    degree = _DEGREE_IN.search(raw)
    org = _org(raw[: degree.start()] if degree else raw, state)
    if org is not None:
        year = _YEAR.search(raw)
        when = f" in {year.group(1)}" if year else ""
        state.emit(subj, "GRADUATED_FROM", f"{subj.name} graduated from {org.phrase}{when}", org)
    if degree:
        _emit_list(subj, state, degree.group("f"), "STUDIED", "{s} studied {o}", "Subject")
    return True
