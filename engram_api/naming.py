"""Name normalization and sanitization: one home for how names, labels and predicates are cleaned.

Model output is untrusted: labels and predicates are reduced to a safe alphabet before they reach a
store (they are stored as property values, never spliced into a query), and labels are mapped onto a
fixed vocabulary so a hostile or chatty model cannot grow the schema (the bound is ``len(LABELS)``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = [
    "LABELS",
    "PREDICATE_SYNONYMS",
    "RELATIONS",
    "SELF_WORDS",
    "SINGLE_VALUED",
    "canonical_predicate",
    "is_single_valued",
    "negated_predicate",
    "normalize_name",
    "sanitize_label",
    "sanitize_predicate",
    "self_entity_id",
    "split_negation",
    "unnamed_relation",
]

LABELS: frozenset[str] = frozenset(
    {
        "Person",
        "Place",
        "Organization",
        "Pet",
        "Animal",
        "Food",
        "Drink",
        "Activity",
        "Hobby",
        "Language",
        "Skill",
        "Subject",
        "Product",
        "Object",
        "Event",
        "Concept",
        "Role",
        "Media",
        "Vehicle",
        "Project",
        "Thing",
    }
)
_LABEL_SYNONYMS = {
    "city": "Place",
    "country": "Place",
    "location": "Place",
    "state": "Place",
    "town": "Place",
    "company": "Organization",
    "employer": "Organization",
    "org": "Organization",
    "school": "Organization",
    "university": "Organization",
    "team": "Organization",
    "human": "Person",
    "user": "Person",
    "family": "Person",
    "relative": "Person",
    "friend": "Person",
    "dog": "Pet",
    "cat": "Pet",
    "sport": "Activity",
    "game": "Activity",
    "book": "Media",
    "movie": "Media",
    "film": "Media",
    "music": "Media",
    "show": "Media",
    "job": "Role",
    "occupation": "Role",
    "profession": "Role",
    "title": "Role",
    "car": "Vehicle",
    "dish": "Food",
    "cuisine": "Food",
    "tool": "Product",
    "course": "Subject",
    "field": "Subject",
}
# Predicates where a new value retires the old one (scoped to the same subject).
SINGLE_VALUED: frozenset[str] = frozenset(
    {
        "LIVES_IN",
        "WORKS_AT",
        "JOB_TITLE",
        "MARRIED_TO",
        "AGE",
        "NAME",
        "FAVORITE_COLOR",
        "FAVORITE_FOOD",
        "STUDIES_AT",
        "RELATIONSHIP_STATUS",
        "DRIVES",
        "BIRTHDAY",
        "PARTNER_OF",
    }
)
# Spellings models use for a single-valued slot: one slot per meaning, or "LIVES_IN then RESIDES_IN" would
# leave two current homes.
PREDICATE_SYNONYMS: dict[str, str] = {
    "RESIDES_IN": "LIVES_IN",
    "RESIDES_AT": "LIVES_IN",
    "LIVES_AT": "LIVES_IN",
    "HOME_IS": "LIVES_IN",
    "BASED_IN": "LIVES_IN",
    "CURRENTLY_LIVES_IN": "LIVES_IN",
    "EMPLOYED_AT": "WORKS_AT",
    "EMPLOYED_BY": "WORKS_AT",
    "WORKS_FOR": "WORKS_AT",
    "EMPLOYER": "WORKS_AT",
    "HAS_JOB_TITLE": "JOB_TITLE",
    "WORKS_AS": "JOB_TITLE",  # "works as a nurse" and "job title: nurse" are one slot, or both stay current
    "OCCUPATION": "JOB_TITLE",
    "PROFESSION": "JOB_TITLE",
    "HAS_SPOUSE": "MARRIED_TO",
    "SPOUSE": "MARRIED_TO",
    "SPOUSE_OF": "MARRIED_TO",
    "HAS_AGE": "AGE",
    "IS_AGED": "AGE",
    "ATTENDS": "STUDIES_AT",
    "ENROLLED_AT": "STUDIES_AT",
    "DATING": "PARTNER_OF",
    "IN_RELATIONSHIP_WITH": "PARTNER_OF",
}
# Words a model writes for the memory owner instead of "user" (normalized): they mean the self node, and
# they say nothing about the owner, so they are never stored as the owner's aliases.
SELF_WORDS = frozenset({"user", "the user", "me", "i", "myself", "owner", "memory owner", "the memory owner"})
_NON_WORD = re.compile(r"[^0-9a-z]+")
_PRED_BAD = re.compile(r"[^A-Z0-9]+")


def _ascii_fold(text: str) -> str:
    # NFKC folds look-alikes such as fullwidth letters; NFKD + ascii drops accents and the rest.
    text = unicodedata.normalize("NFKC", text)
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def normalize_name(name: str) -> str:
    """'  The  Café-Tampa! ' -> 'the cafe tampa': what exact-name entity matching compares."""
    folded = _ascii_fold(name).lower()
    return " ".join(_NON_WORD.sub(" ", folded).split())


def sanitize_label(label: str) -> str:
    """Map a model's label onto the fixed vocabulary (unknown -> 'Thing')."""
    words = normalize_name(label).split()
    if not words:
        return "Thing"
    pascal = "".join(w.capitalize() for w in words)
    if pascal in LABELS:
        return pascal
    for word in reversed(words):
        if word in _LABEL_SYNONYMS:
            return _LABEL_SYNONYMS[word]
        if word.capitalize() in LABELS:
            return word.capitalize()
    return "Thing"


def sanitize_predicate(predicate: str) -> str:
    """'works at' / 'worksAt' / '`X`]->(' -> 'WORKS_AT' / 'WORKS_AT' / 'X': UPPER_SNAKE, at most 40."""
    # Split camelCase only after a lower-case letter, so cleaning is idempotent ("OWNS_3D_PRINTER" stays).
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", _ascii_fold(predicate))
    cleaned = _PRED_BAD.sub("_", spaced.upper()).strip("_")
    return cleaned[:40].rstrip("_") or "RELATED_TO"


def canonical_predicate(predicate: str) -> str:
    """Sanitized, with the synonyms of single-valued slots folded in ("resides in" -> "LIVES_IN")."""
    clean = sanitize_predicate(predicate)
    return PREDICATE_SYNONYMS.get(clean, clean)


# Prefixes a model writes for "the opposite of P" (NOT_ALLERGIC_TO, DOES_NOT_LIKE, NO_LONGER_WORKS_AT).
_NEGATIONS = ("NOT_", "NO_LONGER_", "DOES_NOT_", "DOESNT_", "DO_NOT_", "DONT_", "IS_NOT_", "NEVER_")
_DO_NEGATIONS = ("DOES_NOT_", "DOESNT_", "DO_NOT_", "DONT_")
NEGATION_PREFIX = "NOT_"


def split_negation(predicate: str) -> tuple[str, bool]:
    """A canonical predicate's positive form and whether it was negated: 'NO_LONGER_WORKS_FOR' ->
    ('WORKS_AT', True), 'LIKES' -> ('LIKES', False). One spelling per negation (``negated_predicate``), so
    "not allergic" and "no longer allergic" land on one fact and close the same positive one."""
    for prefix in _NEGATIONS:
        if predicate.startswith(prefix) and len(predicate) > len(prefix):
            base = predicate[len(prefix) :]
            if prefix in _DO_NEGATIONS:
                base = _third_person(base)  # DOES_NOT_LIKE is the negation of LIKES
            return canonical_predicate(base), True
    return predicate, False


def _third_person(base: str) -> str:
    verb, _, rest = base.partition("_")
    if verb == "HAVE":
        verb = "HAS"
    elif verb.endswith(("SS", "SH", "CH", "X", "O")):
        verb += "ES"
    elif verb.endswith("Y") and len(verb) > 1 and verb[-2] not in "AEIOU":
        verb = verb[:-1] + "IES"
    elif not verb.endswith("S"):
        verb += "S"
    return "_".join(p for p in (verb, rest) if p)


def negated_predicate(positive: str) -> str:
    """The one stored spelling of "not ``positive``" (``NOT_`` + the canonical positive form)."""
    return (NEGATION_PREFIX + positive)[:40].rstrip("_")


# Words for the people in someone's life, as a regex alternation (the one list: stance cues and the naming
# of unnamed relatives both read it).
RELATIONS = (
    r"sister|brother|sibling|mother|mom|mum|father|dad|parents?|wife|husband|spouse|partner|girlfriend|boyfriend|"
    r"fianc[eé]e?|son|daughter|kids?|child|children|baby|aunt|uncle|cousin|niece|nephew|grand(?:mother|father|ma|"
    r"pa|parents?|son|daughter|child)|friend|best friend|roommate|flatmate|neighbou?r|boss|manager|colleague|"
    r"coworker|co-worker|teammate|mentor|ex|in-laws?|(?:mother|father|sister|brother)-in-law|family"
)
_UNNAMED = re.compile(
    rf"^(?:my|our|the|user(?:'s|’s|s')|his|her|their)\s+(?:(?:older|younger|little|big|elder|baby|twin|"
    rf"new|old)\s+)?({RELATIONS})$",
    re.IGNORECASE,
)


def unnamed_relation(name: str) -> str | None:
    """'my sister' / "User's older sister" / 'the boss' -> 'sister' / 'sister' / 'boss': the one name an
    unnamed person gets, so every mention lands on one entity; None when ``name`` is not such a phrase."""
    match = _UNNAMED.match(" ".join(name.split()))
    return match.group(1).lower() if match else None


def is_single_valued(predicate: str) -> bool:
    """Whether a new value of ``predicate`` (any spelling of a one-value slot) retires the old one."""
    return canonical_predicate(predicate) in SINGLE_VALUED


def self_entity_id(user_id: str) -> str:
    """The id of the node standing for the user themself (subject "user" in extractions)."""
    return "ent_" + hashlib.blake2b(f"{user_id}\x1fself".encode(), digest_size=12).hexdigest()
