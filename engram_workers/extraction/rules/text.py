"""Text helpers: cutting an object phrase at its end, casing names, articles, verb forms, thing labels.

All pure string functions over bounded input (a clause is at most ``_MAX_CLAUSE`` characters).
"""

from __future__ import annotations

import re

from engram_workers.extraction.rules.lexicon import (
    _ACTIVITIES,
    _ANIMALS,
    _BAD_FIRST,
    _BAD_WHOLE,
    _DRINKS,
    _FOOD_SUFFIXES,
    _FOODS,
    _LANGUAGES,
    _MAX_NAME_CHARS,
    _MAX_NAME_WORDS,
    _MEDIA,
    _MEDIA_SUFFIXES,
    _PROPER_LABELS,
    _SMALL_WORDS,
    _SUBJECTS,
    _TITLE_WORDS,
    _map,
)

_TIME_WORDS = (
    r"now|right\s+now|currently|nowadays|these\s+days|anymore|any\s+more|too|as\s+well|a\s+lot|lots|"
    r"so\s+much|very\s+much|last|this|next|every|each|ever|yesterday|today|tonight|tomorrow|recently|"
    r"lately|again|already|ago|late|early|twice|once|often|sometimes|full[- ]time|part[- ]time|"
    r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|few|several|many|couple)\s+"
    r"(?:years?|months?|weeks?|days?|hours?|minutes?)"
)
_PREP_WORDS = r"for|with|as|after|before|in|at|on|near|by|from|to|about|into|during"
# Tail patterns are lowercase on purpose: in a cased message "The Last of Us" keeps its words.
_HARD_STOP = re.compile(r"[;:()\[\]{}\"!?…]|\s[-–—]+\s|\.(?=\s+[^A-Z]|$)")
_HARD_TAIL = re.compile(
    r"\s+(?:but|because|cause|since|when|whenever|while|where|who|whom|whose|which|that|until|till|"
    r"unless|if|so|though|although|whereas|more\s+than|better\s+than|less\s+than|rather\s+than|instead\s+of|"
    r"over)\b.*$",
    re.S,
)
_AND_TAIL = re.compile(r"\s*(?:,|\s(?:and|or|&|plus)\s).*$", re.S)
_TIME_TAIL = re.compile(rf"\s+(?:{_TIME_WORDS})\b.*$", re.S)
_SOFT_TAIL = re.compile(rf"\s+(?:{_PREP_WORDS}|{_TIME_WORDS})\b.*$", re.S)
_FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself|we|us|our|ours)\b", re.I)
_ARTICLE = re.compile(r"^(the|a|an)\s+", re.I)
_QUANTIFIER = re.compile(
    r"^(?:a\s+(?:little\s+bit\s+of|little|bit\s+of|lot\s+of)|some|basic|fluent|conversational|native|"
    r"decent|broken|all\s+(?:kinds|sorts|types)\s+of|lots\s+of|most|good|great|really\s+good|"
    r"especially|mostly|mainly|pretty\s+much)\s+",
    re.I,
)
_LIST_SPLIT = re.compile(r"\s*,\s*(?:(?:and|or)\s+)?|\s+(?:and|or|&|plus|as\s+well\s+as)\s+", re.I)
# Names with "and" inside, kept whole through the list split.
_COMPOUNDS = tuple(w for w in (*_FOODS, *_ACTIVITIES, "rock and roll", "r and b", "drum and bass") if " and " in w)
_NAME_WORD = re.compile(r"[^\W\d_][\w'.-]*")
_TO_VERB = re.compile(r"^to\s+([a-z]+)\b(.*)$", re.I | re.S)


def _cut(raw: str, *, lists: bool = False) -> str:
    """The object phrase at the head of ``raw``: up to punctuation or the start of another clause.

    With ``lists`` commas and "and" stay (the caller splits the list); otherwise they end the phrase.
    """
    text = _HARD_STOP.split(raw, maxsplit=1)[0]
    text = _HARD_TAIL.sub("", text)
    if not lists:
        text = _AND_TAIL.sub("", text)
    return text.strip(" \t'\",.")


def _soft(text: str) -> str:
    """Drop prepositional and time tails: "Google in Mountain View" -> "Google"."""
    return _SOFT_TAIL.sub("", text).strip(" \t'\",.")


def _split_article(text: str) -> tuple[str, str]:
    m = _ARTICLE.match(text)
    return (m.group(1).lower(), text[m.end() :]) if m else ("", text)


def _valid(name: str) -> bool:
    words = name.split()
    if not words or len(words) > _MAX_NAME_WORDS or len(name) > _MAX_NAME_CHARS:
        return False
    if not name[0].isalnum() or not any(c.isalpha() for c in name):
        return False  # "/usr/bin", "$$$": no name
    return words[0].casefold() not in _BAD_FIRST and " ".join(words).casefold() not in _BAD_WHOLE


def _titlecase(text: str) -> str:
    out = []
    for i, word in enumerate(text.split()):
        if i and word in _SMALL_WORDS:
            out.append(word)
        else:
            out.append("-".join(p[:1].upper() + p[1:] for p in word.split("-")))
    return " ".join(out)


def _role_case(text: str) -> str:
    words = []
    for word in text.split():
        if any(c.isupper() for c in word) or word in _SMALL_WORDS:
            words.append(word)
        elif word in _TITLE_WORDS:
            words.append(_TITLE_WORDS[word])
        else:
            words.append(word[:1].upper() + word[1:])
    return " ".join(words)


def _display(name: str, label: str, article: str) -> str:
    """Entity name as stored: proper nouns title-cased when written all lowercase, else as written."""
    if label == "Role":
        return _role_case(name)
    if any(c.isupper() for c in name):
        return name
    if label in _PROPER_LABELS and article not in ("a", "an"):
        return _titlecase(name)
    return name


def _a(word: str) -> str:
    """The indefinite article for ``word``."""
    if not word:
        return "a"
    first = word.split()[0]
    if first.isupper() and len(first) > 1:
        return "an" if first[0] in "AEFHILMNORSX" else "a"
    low = first.casefold()
    if low.startswith(("uni", "use", "usu", "eu", "one")):
        return "a"
    if low.startswith(("hour", "honest", "heir")):
        return "an"
    return "an" if low[0] in "aeiou" else "a"


def _possessive(name: str) -> str:
    return f"{name}'" if name.endswith("s") and not name.endswith("'s") else f"{name}'s"


_IRREGULAR = _map("am=is|are=is|be=is|have=has|do=does|go=goes")


def _third_person(verb: str) -> str:
    """'drink' -> 'drinks', 'go' -> 'goes', 'study' -> 'studies', 'am' -> 'is'."""
    low = verb.casefold()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low in ("can", "will", "would", "could", "should", "must", "may", "might"):
        return verb
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


_PRONOUNS_3RD = (
    (re.compile(r"\bI\s+am\b"), "they are"),
    (re.compile(r"\bmyself\b", re.I), "themselves"),
    (re.compile(r"\bmine\b", re.I), "theirs"),
    (re.compile(r"\bmy\b", re.I), "their"),
    (re.compile(r"\bme\b", re.I), "them"),
    (re.compile(r"\bI\b"), "they"),
)


def _about_user(text: str) -> str:
    """'walk my dog' -> 'walk their dog': statements are about "User", never in the first person."""
    for pattern, replacement in _PRONOUNS_3RD:
        text = pattern.sub(replacement, text)
    return text


def _gerund(verb: str) -> str:
    """'hike' -> 'hiking', 'swim' -> 'swimming', 'read' -> 'reading'."""
    low = verb.casefold()
    if low.endswith("ie"):
        return low[:-2] + "ying"
    if low.endswith("e") and not low.endswith(("ee", "ye", "oe")) and len(low) > 2:
        return low[:-1] + "ing"
    if len(low) <= 4 and re.fullmatch(r"[^aeiou]*[aeiou][^aeiouwxy]", low):
        return low + low[-1] + "ing"
    return low + "ing"


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is", "series")):
        return word[:-1]
    return word


_LEXICONS = (
    (_LANGUAGES, "Language"),
    (_FOODS, "Food"),
    (_DRINKS, "Drink"),
    (_SUBJECTS, "Subject"),
    (_ACTIVITIES, "Activity"),
    (_ANIMALS, "Animal"),
    (_MEDIA, "Media"),
)


def _thing_label(name: str, default: str) -> str:
    low = " ".join(name.casefold().split())
    for lexicon, label in _LEXICONS:
        if low in lexicon or _singular(low) in lexicon:
            return label
    if low.endswith(_FOOD_SUFFIXES):
        return "Food"
    if low.endswith(_MEDIA_SUFFIXES):
        return "Media"
    words = low.split()
    if default == "Thing" and words and any(w.endswith("ing") and len(w) > 4 for w in (words[0], words[-1])):
        return "Activity"  # "hiking", "rock climbing": a gerund names an activity
    return default


def _decapitalize(text: str) -> str:
    """'Sushi is my favorite' starts a sentence: a known common noun loses its sentence-case capital."""
    word = text.strip()
    if word[:1].isupper() and word[1:].islower() and _thing_label(word, "") not in ("", "Language"):
        return word[:1].lower() + word[1:]
    return text
