"""Rule family "work": employers, roles ("a nurse at Mercy", "CEO of Acme"), new jobs, clubs joined, students."""

from __future__ import annotations

import re

from engram_workers.extraction.rules.handlers import _emit_list, _Handler, _since
from engram_workers.extraction.rules.lexicon import _CLUBS, _EXEC_HEADS, _STUDENT_HEADS
from engram_workers.extraction.rules.objects import _loose_role, _org, _role
from engram_workers.extraction.rules.state import _MessageState, _Obj, _Subject
from engram_workers.extraction.rules.text import _a, _cut, _role_case, _soft, _split_article, _valid


def _emit_role(subj: _Subject, state: _MessageState, role: str, *, changed: bool = False) -> None:
    obj = _Obj(_role_case(role), "Role", f"{_a(role)} {role}")
    verb = "is" if role.split()[-1].casefold() in _STUDENT_HEADS else "works as"
    state.emit(subj, "WORKS_AS", f"{subj.name} {verb} {obj.phrase}", obj, valid_from=_since(state, changed))


def _emit_org(subj: _Subject, state: _MessageState, raw: str, *, changed: bool, student: bool = False) -> None:
    org = _org(raw, state)
    if org is None:
        return
    predicate, verb = ("STUDIES_AT", "studies at") if student else ("WORKS_AT", "works at")
    state.emit(subj, predicate, f"{subj.name} {verb} {org.phrase}", org, valid_from=_since(state, changed))


_AS_ROLE = re.compile(r"\s+as\s+(?:a|an|the)\s+(?P<role>.+)$", re.I | re.S)
_AT_ORG = re.compile(r"^\s*,?\s*(?:at|for|with)\s+(?P<org>.+)$", re.I | re.S)


def _employment(subj: _Subject, state: _MessageState, raw: str, *, changed: bool) -> None:
    """'Google (as a software engineer)': WORKS_AT, plus WORKS_AS when a role is given."""
    as_role = _AS_ROLE.search(raw)
    _emit_org(subj, state, raw[: as_role.start()] if as_role else raw, changed=changed)
    role = _loose_role(as_role.group("role")) if as_role else None
    if role:
        _emit_role(subj, state, role[0], changed=changed)


def _work(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
        _employment(subj, state, m.group("o"), changed=changed)
        return True

    return handle


def _role_then_org(subj: _Subject, state: _MessageState, raw: str, *, changed: bool) -> None:
    """'a nurse (at St. Mary's)' after "work as" or "a new job as"."""
    role = _loose_role(_split_article(raw.strip())[1])
    if role:
        _emit_role(subj, state, role[0], changed=changed)
        at = _AT_ORG.match(role[1])
        if at:
            _emit_org(subj, state, at.group("org"), changed=changed)


def _work_as(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    _role_then_org(subj, state, m.group("o"), changed=False)
    return True


def _h_new_job(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'a new job at X (as Y)' / 'a new job as Y (at X)'."""
    rest = m.group("o")
    if rest[:2].casefold() == "as":
        _role_then_org(subj, state, rest[2:], changed=True)
    else:
        _employment(subj, state, rest.split(None, 1)[1], changed=True)
    return True


def _h_joined(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'joined Google' is a job; 'joined a gym' or 'joined the choir' is a membership."""
    raw = m.group("o")
    as_role = _AS_ROLE.search(raw)
    article, core = _split_article(_soft(_cut(raw[: as_role.start()] if as_role else raw)))
    if not _valid(core):
        return True
    lowercase = not any(c.isupper() for c in core)
    if article in ("a", "an") or core.split()[-1].casefold() in _CLUBS or (state.cased and lowercase):
        phrase = f"{article} {core}" if article else core
        obj = _Obj(core, "Organization", phrase)
        state.emit(subj, "MEMBER_OF", f"{subj.name} joined {phrase}", obj, valid_from=state.event_time)
    else:
        _employment(subj, state, raw, changed=True)
    return True


_STUDENT_OF = re.compile(r"^\s*(?:in|of|studying)\s+(?P<f>.+?)(?:\s+at\s+(?P<org>.+))?$", re.I | re.S)
_STUDENT_AT = re.compile(r"^\s*at\s+(?P<org>.+?)(?:\s+(?:studying|in)\s+(?P<f>.+))?$", re.I | re.S)
_ROLE_OF_AT = re.compile(r"^\s+of\s+(?P<field>[\w&' -]+?)\s+(?:at|for)\s+(?P<org>.+)$", re.I | re.S)
_OF_ORG = re.compile(r"^\s+of\s+(?P<org>.+)$", re.I | re.S)


def _h_role(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'I'm a nurse', 'I'm a software engineer at Google', 'I'm a PhD student in physics at MIT'."""
    found = _role(m.group("o"))
    if found is None:
        return False
    role, rest = found
    head = role.split()[-1].casefold()
    if head in _STUDENT_HEADS:
        _emit_role(subj, state, role)
        parts = _STUDENT_OF.match(rest) or _STUDENT_AT.match(rest)
        if parts and parts.group("f"):
            _emit_list(subj, state, parts.group("f"), "STUDIES", "{s} studies {o}", "Subject")
        if parts and parts.group("org"):
            _emit_org(subj, state, parts.group("org"), changed=False, student=True)
        return True
    of_at = _ROLE_OF_AT.match(rest)  # "VP of Engineering at Stripe"
    if of_at:
        role, org = f"{role} of {of_at.group('field').strip()}", of_at.group("org")
    else:
        at = _AT_ORG.match(rest) or (_OF_ORG.match(rest) if head in _EXEC_HEADS else None)
        org = at.group("org") if at else None
    _emit_role(subj, state, role)
    if org:
        _emit_org(subj, state, org, changed=False)
    return True
