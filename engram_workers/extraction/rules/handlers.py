"""What a rule's handler is, and the generic handlers every rule family builds on.

A handler gets the rule's match and the clause's subject, emits facts, and returns whether it took the
clause (False lets later rules try: "I'm a morning person" is no job, maybe something else).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

from engram_api.naming import is_single_valued
from engram_workers.extraction.rules.objects import _things
from engram_workers.extraction.rules.state import _MessageState, _Obj, _Subject
from engram_workers.extraction.rules.text import _possessive

_Handler = Callable[[re.Match[str], _Subject, _MessageState], bool]


def _since(state: _MessageState, changed: bool) -> datetime | None:
    """valid_from: the message time for changes stated as just happening ("I moved", "I joined")."""
    return state.event_time if changed else None


def _simple(predicate: str, template: str, parse: Callable[[str, _MessageState], _Obj | None]) -> _Handler:
    """One object from group "o", one fact worded by ``template`` ({s} subject, {o} object)."""

    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        obj = parse(m.group("o"), state)
        if obj is not None:
            state.emit(subj, predicate, template.format(s=subj.name, o=obj.phrase), obj)
        return True

    return handle


def _emit_list(
    subj: _Subject, state: _MessageState, raw: str, predicate: str, template: str, default_label: str
) -> None:
    """One fact per listed thing; ``template`` may use {s} subject, {p} its possessive, {o} the thing."""
    for obj in _things(raw, state, default_label, single=is_single_valued(predicate)):
        state.emit(subj, predicate, template.format(s=subj.name, p=_possessive(subj.name), o=obj.phrase), obj)


def _listing(predicate: str, template: str, default_label: str) -> _Handler:
    """A list of things from group "o" ("I like hiking and jazz"), one fact each."""

    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        _emit_list(subj, state, m.group("o"), predicate, template, default_label)
        return True

    return handle
