"""Rule family "relatives and pets": introducing them ("my brother Alex", "I have two cats").

A relative or pet met in passing is only a ``_Subject`` with an ``_Intro``; it gets an entity (and the
user->relative fact) once a fact about it is emitted, so a bare mention stores nothing.
"""

from __future__ import annotations

import re

from engram_api.naming import sanitize_predicate
from engram_workers.extraction.rules.handlers import _since
from engram_workers.extraction.rules.lexicon import (
    _KIN_MODS,
    _MAX_LIST,
    _NUMBERS,
    _PET_MODS,
    _PET_PLURALS,
    _PETS,
    _RELATION_PLURALS,
    _RELATIONS,
    _UNIQUE_RELATIONS,
    _alt,
)
from engram_workers.extraction.rules.objects import _take_name
from engram_workers.extraction.rules.state import _Intro, _MessageState, _Obj, _Subject
from engram_workers.extraction.rules.text import _a


def _introduce(mods: str, word: str, name: str | None, state: _MessageState, *, changed: bool = False) -> _Subject:
    """A relative or pet ("my older brother Alex"): the subject, with its HAS_* fact held until needed."""
    written = f"{mods} {word}".strip()
    if word in _RELATIONS:
        canonical = _RELATIONS[word]
        predicate, label, summary = sanitize_predicate(f"HAS_{canonical}"), "Person", f"User's {written}"
        aliases: tuple[str, ...] = (f"user's {canonical}",) if canonical in _UNIQUE_RELATIONS else ()
    else:
        species = _PETS[word]
        predicate, label, aliases = "HAS_PET", "Pet", ()
        summary = word if species == word else f"{word} ({species})"
    # Unnamed, "my mom" and "my mother" are one entity across messages: name it by the canonical word.
    display = name or f"User's {f'{mods} ' if mods else ''}{_RELATIONS.get(word, word)}"
    statement = f"User has {_a(written)} {written}" + (f" named {name}" if name else "")
    entity = _Obj(display, label, display, summary=summary, aliases=aliases)
    return _Subject(display, intro=_Intro(predicate, statement, entity, _since(state, changed)))


_HAVE_KIN = re.compile(
    rf"^(?P<mods>{_KIN_MODS})(?P<word>{_alt([*_RELATIONS, *_RELATION_PLURALS])})(?![\w-])(?P<rest>.*)$",
    re.I | re.S,
)
_HAVE_PET = re.compile(
    rf"^(?P<mods>{_PET_MODS})(?P<word>{_alt([*_PETS, *_PET_PLURALS])})(?![\w-])(?P<rest>.*)$", re.I | re.S
)
_NAMED = re.compile(r"^\s*,?\s*(?:who\s+is\s+|whose\s+name\s+is\s+|that\s+is\s+)?(?:named|called)\s+", re.I)
_JOINER = re.compile(r"^\s*(?:,\s*)?(?:and\s+|&\s+|,\s*)", re.I)


def _names(text: str, state: _MessageState) -> tuple[list[str], str]:
    """'Max and Luna who ...' -> (['Max', 'Luna'], ' who ...')."""
    names: list[str] = []
    rest = text
    while len(names) < _MAX_LIST:
        joiner = _JOINER.match(rest) if names else None
        taken = _take_name(rest[joiner.end() :] if joiner else rest.lstrip(" ,"), state)
        if taken is None or (names and joiner is None):
            break
        names.append(taken[0])
        rest = taken[1]
    return names, rest


_NEXT_ITEM = re.compile(r"^\s*,?\s*(?:and\s+)?(?P<det>a|an|one|two|three|four|five|\d)\s+(?P<o>.+)$", re.I | re.S)


def _have_item(det: str, text: str, state: _MessageState, *, changed: bool) -> tuple[str, _Subject | None]:
    """One 'a brother named Alex' / 'two cats named Luna and Milo' -> (text after it, its one subject)."""
    found = _HAVE_KIN.match(text) or _HAVE_PET.match(text)
    if found is None:
        return text, None
    written = found.group("word").casefold()
    word = _RELATION_PLURALS.get(written) or _PET_PLURALS.get(written) or written
    mods = " ".join(found.group("mods").casefold().split())
    named = _NAMED.match(found.group("rest"))
    names, after = _names(found.group("rest")[named.end() :], state) if named else ([], found.group("rest"))
    count = int(det) if det.isdigit() else _NUMBERS.get(det.casefold(), 1)
    if not names and count > 1:
        predicate = "HAS_PET" if word in _PETS else sanitize_predicate(f"HAS_{_RELATIONS[word]}")
        kind = f"{mods} {written}".strip()
        state.emit(state.user(), predicate, f"User has {det.casefold()} {kind}", valid_from=_since(state, changed))
        return after, None
    named_or_not: list[str | None] = [*names] if names else [None]
    subjects = [_introduce(mods, word, name, state, changed=changed) for name in named_or_not]
    for subject in subjects:
        state.subject_ref(subject)
    return after, subjects[0] if len(subjects) == 1 else None


def _h_have(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'I have a brother named Alex (who ...)', 'I have two cats named Luna and Milo', 'I got a puppy'."""
    det, text = m.group("det"), m.group("o")
    if not subj.is_user or not (_HAVE_KIN.match(text) or _HAVE_PET.match(text)):
        return False
    changed = m.group("verb").casefold().split()[-1] in ("got", "adopted")
    after, last = "", None
    for _ in range(_MAX_LIST):  # "a sister named Mia and a brother named Sam"
        after, last = _have_item(det, text, state, changed=changed)
        following = _NEXT_ITEM.match(after)
        if following is None or after == text:
            break
        det, text = following.group("det"), following.group("o")
    if last is not None and after.strip():
        state.grammar.clause(after, state, last)  # "... named Alex who works at Amazon"
    return True


def _h_reverse_kin(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'Alex is my brother'."""
    taken = _take_name(m.group("o").strip(), state)
    if taken is None or taken[1].strip():
        return False
    mods = " ".join(m.group("mods").casefold().split())
    state.subject_ref(_introduce(mods, m.group("word").casefold(), taken[0], state))
    return True
