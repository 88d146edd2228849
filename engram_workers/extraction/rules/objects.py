"""Object parsers: a place, an organization, a person's name, a list of things, a job title.

Each returns None (or nothing) rather than a doubtful object, so a rule emits no fact instead of a wrong one.
"""

from __future__ import annotations

import re

from engram_workers.extraction.rules.lexicon import (
    _GENERIC_ORGS,
    _GENERIC_PLACES,
    _MAX_LIST,
    _NOT_NAME,
    _ROLE_DISQUALIFIERS,
    _ROLE_HEADS,
    _ROLE_STOP,
    _ROLE_SUFFIX,
)
from engram_workers.extraction.rules.state import _MessageState, _Obj
from engram_workers.extraction.rules.text import (
    _COMPOUNDS,
    _FIRST_PERSON,
    _LIST_SPLIT,
    _NAME_WORD,
    _QUANTIFIER,
    _TIME_TAIL,
    _TO_VERB,
    _cut,
    _display,
    _gerund,
    _soft,
    _split_article,
    _thing_label,
    _titlecase,
    _valid,
)


def _place(raw: str, state: _MessageState) -> _Obj | None:
    """A place name; "a small town in Texas" falls through to "Texas"."""
    for candidate in re.split(r"\s+in\s+", _cut(raw)):
        article, core = _split_article(_soft(candidate))
        if article in ("a", "an") or not _valid(core):
            continue
        if core.casefold() in _GENERIC_PLACES or core.split()[0].casefold() in _GENERIC_PLACES:
            continue
        if state.cased and not (core[0].isupper() or core[0].isdigit()):
            continue  # a cased writer capitalizes places: "the city" is no place name
        name = _display(core, "Place", article)
        return _Obj(name, "Place", f"the {name}" if article == "the" else name)
    return None


def _org(raw: str, state: _MessageState) -> _Obj | None:
    """An employer or school: "Google", "the University of Texas", "a hospital"."""
    article, core = _split_article(_soft(_cut(raw)))
    if not _valid(core) or core.casefold() in _GENERIC_ORGS:
        return None
    name = _display(core, "Organization", article)
    return _Obj(name, "Organization", f"{article} {name}" if article else name)


def _take_name(text: str, state: _MessageState) -> tuple[str, str] | None:
    """A person's or pet's name at the head of ``text`` -> (name, the text after it).

    Cased writers capitalize names, so up to three capitalized words are taken. In an all-lowercase
    message one word is taken, unless it is a function word or starts a verb phrase ("works at").
    """
    words: list[str] = []
    end = 0
    for tok in re.finditer(r"\S+", text):
        raw = tok.group()
        word = raw.rstrip(",.;:!")
        if word.endswith("'s"):  # "Alex's car": the name ends here
            word = word[:-2]
        if not _NAME_WORD.fullmatch(word) or word.casefold() in _NOT_NAME:
            break
        capital = word[0].isupper()
        if not capital and (state.cased or words or state.grammar.starts_rule(text[tok.start() :])):
            break
        words.append(word)
        end = tok.start() + len(word)
        if raw != word or len(words) == 3 or not capital:
            break
    if not words:
        return None
    name = " ".join(words)
    return (_titlecase(name) if name.islower() else name), text[end:]


def _person(raw: str, state: _MessageState) -> _Obj | None:
    taken = _take_name(raw.strip(), state)
    return _Obj(taken[0], "Person", taken[0]) if taken else None


def _things(raw: str, state: _MessageState, default_label: str, *, single: bool = False) -> list[_Obj]:
    """A list of common things ("hiking, sushi and jazz"); each item gets a label from the lexicons."""
    text = _cut(raw, lists=True)
    for compound in _COMPOUNDS:
        text = re.sub(re.escape(compound), compound.replace(" and ", "\x00"), text, flags=re.I)
    out: list[_Obj] = []
    for piece in _LIST_SPLIT.split(text)[:_MAX_LIST]:
        item = piece.replace("\x00", " and ").strip()
        to_verb = _TO_VERB.match(item)
        if to_verb and to_verb.group(1).casefold() not in _NOT_NAME:  # "like to hike" -> "hiking", not "to my"
            item = _gerund(to_verb.group(1)) + to_verb.group(2)
        while (quantifier := _QUANTIFIER.match(item)) is not None:
            item = item[quantifier.end() :]
        article, full = _split_article(item)
        full = _TIME_TAIL.sub("", full).strip(" \t'\",.")
        core = _soft(full)
        if not _valid(core):
            continue
        label = _thing_label(core, default_label)
        name = _display(core, label, article)
        # A statement keeps "hiking in the mountains", but not "cooking for my family".
        said = name + full[len(core) :] if full.startswith(core) and not _FIRST_PERSON.search(full) else name
        out.append(_Obj(name, label, f"{article} {said}" if article else said))
        if single:
            break
    return out


def _role(raw: str) -> tuple[str, str] | None:
    """'software engineer at Google' -> ('software engineer', ' at Google'); None when no job word."""
    for i, tok in enumerate(re.finditer(r"\S+", raw)):
        word = tok.group().rstrip(",.;:!")
        low = word.casefold()
        if i >= 5 or low in _ROLE_STOP or low in _ROLE_DISQUALIFIERS or not _NAME_WORD.fullmatch(word):
            return None
        if low in _ROLE_HEADS or _ROLE_SUFFIX.fullmatch(low):
            end = tok.start() + len(word)
            return raw[:end].strip(), raw[end:]
    return None


def _loose_role(raw: str) -> tuple[str, str] | None:
    """After "work as a" anything short is a role, job word or not ("work as a dog walker")."""
    found = _role(raw)
    if found:
        return found
    at = re.search(r"\s+(?:at|for|with)\s+", raw)
    head = _soft(_cut(raw[: at.start()] if at else raw))
    if not _valid(head) or len(head.split()) > 4:
        return None
    return head, raw[at.start() :] if at else ""
