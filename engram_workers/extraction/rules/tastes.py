"""Rule family "tastes": preferences, favorites, sports and instruments played, what one drives."""

from __future__ import annotations

import re

from engram_api.naming import sanitize_label, sanitize_predicate
from engram_workers.extraction.rules.handlers import _emit_list
from engram_workers.extraction.rules.lexicon import _map
from engram_workers.extraction.rules.objects import _things
from engram_workers.extraction.rules.state import _MessageState, _Obj, _Subject
from engram_workers.extraction.rules.text import _a, _cut, _decapitalize, _singular, _soft, _valid


def _h_prefers(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    found = _things(m.group("o"), state, "Thing", single=True)
    if found:
        alt = _things(m.group("alt"), state, "Thing", single=True) if m.group("alt") else []
        over = f" over {alt[0].phrase}" if alt else ""
        state.emit(subj, "PREFERS", f"{subj.name} prefers {found[0].phrase}{over}", found[0])
    return True


_CATEGORY_LABELS = _map(
    "food=Food|dish=Food|meal=Food|snack=Food|dessert=Food|fruit=Food|cuisine=Food|drink=Drink|"
    "beverage=Drink|color=Concept|movie=Media|film=Media|book=Media|show=Media|tv show=Media|series=Media|"
    "song=Media|album=Media|band=Media|game=Media|artist=Person|singer=Person|author=Person|actor=Person|"
    "sport=Activity|activity=Activity|hobby=Hobby|city=Place|country=Place|place=Place|animal=Animal|"
    "subject=Subject|language=Language|team=Organization|restaurant=Organization|season=Concept|"
    "number=Concept|car=Vehicle|holiday=Event"
)


def _favorite(subj: _Subject, state: _MessageState, written_category: str, raw: str) -> None:
    """'my favorite food is sushi' -> FAVORITE_FOOD; a plural category is a list of likes."""
    written = " ".join(written_category.casefold().split())
    singular = " ".join(_singular(w) for w in written.split())
    category = singular.replace("colour", "color")
    label = _CATEGORY_LABELS.get(category) or sanitize_label(category)
    if singular != written:
        # "my favorite foods are pizza and sushi": several values, so not a single-valued slot.
        _emit_list(subj, state, raw, "LIKES", f"{{p}} favorite {written} include {{o}}", label)
    else:
        predicate = sanitize_predicate(f"FAVORITE_{category}")
        _emit_list(subj, state, raw, predicate, f"{{p}} favorite {written} is {{o}}", label)


def _h_favorite(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    _favorite(subj, state, m.group("cat"), m.group("o"))
    return True


def _h_reverse_favorite(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    """'Sushi is my favorite (food)': the object comes first."""
    raw = _decapitalize(m.group("o"))
    if m.group("cat"):
        _favorite(subj, state, m.group("cat"), raw)
    else:
        _emit_list(subj, state, raw, "LIKES", "{s} likes {o}", "Thing")
    return True


def _h_plays(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    for obj in _things(m.group("o"), state, "Activity"):
        if state.cased and obj.name[:1].isupper() and obj.label == "Activity":
            obj = obj._replace(label="Media")  # a capitalized unknown thing one plays is a game title
        state.emit(subj, "PLAYS", f"{subj.name} plays {obj.phrase}", obj)
    return True


def _h_drives(m: re.Match[str], subj: _Subject, state: _MessageState) -> bool:
    core = _soft(_cut(m.group("o")))
    if _valid(core):
        article = m.group("det").casefold()
        obj = _Obj(core, "Vehicle", f"{_a(core) if article == 'my' else article} {core}")
        state.emit(subj, "DRIVES", f"{subj.name} drives {obj.phrase}", obj)
    return True
