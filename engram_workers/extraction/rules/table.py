"""The ordered rule table: each rule is a verb-phrase pattern and the handler that turns a match into facts.

Order matters: the first rule whose pattern matches and whose handler accepts takes the clause. The
patterns run only on a clause's text after its subject, which is at most ``_MAX_CLAUSE`` characters.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from engram_workers.extraction.rules.family import _h_have, _h_reverse_kin
from engram_workers.extraction.rules.handlers import _Handler, _listing, _simple
from engram_workers.extraction.rules.learning import _h_graduated, _languages, _learning, _studies
from engram_workers.extraction.rules.lexicon import _ADV, _KIN_MODS, _RELATIONS, _alt
from engram_workers.extraction.rules.objects import _org, _place
from engram_workers.extraction.rules.person import _age, _h_birthday, _h_diet, _h_married, _h_name, _h_status
from engram_workers.extraction.rules.places import _h_back_from, _h_born, _h_move, _visited
from engram_workers.extraction.rules.tastes import _h_drives, _h_favorite, _h_plays, _h_prefers, _h_reverse_favorite
from engram_workers.extraction.rules.work import _h_joined, _h_new_job, _h_role, _work, _work_as

_MACROS = {
    "%PROG": r"(?:am|is|are|have\s+been|has\s+been)",
    "%PERF": r"(?:have|has)",
    "%BE": r"(?:am|is|are)",
    "%A": rf"(?:{_ADV}\s+)*",
}


def _rx(pattern: str) -> re.Pattern[str]:
    for macro, expansion in _MACROS.items():
        pattern = pattern.replace(macro, expansion)
    return re.compile(pattern, re.I | re.S)


class _Rule(NamedTuple):
    pattern: re.Pattern[str]
    handler: _Handler


def _r(pattern: str, handler: _Handler) -> _Rule:
    return _Rule(_rx(pattern), handler)


_DIETS = (
    r"vegetarian|vegan|pescatarian|pescetarian|keto|paleo|gluten[- ]free|dairy[- ]free|kosher|halal|"
    r"carnivore|flexitarian|plant[- ]based"
)
_STATUS = r"single|married|divorced|engaged|widowed|separated|in\s+a\s+(?:committed\s+)?relationship"
_END = (
    r"(?=\s*(?:[,;]|$)|\s+(?:now|again|and|since|for|this\s+(?:year|week|month)|today|yesterday|last|recently|"
    r"(?:a|\d+|a\s+few|a\s+couple\s+of)\s+(?:days?|weeks?|months?|years?)\s+ago)\b)"
)

# Order matters: the first rule whose pattern matches and whose handler accepts takes the clause.
_RULES: tuple[_Rule, ...] = (
    # home
    _r(r"(?:%PERF\s+)?%A(?:moved|relocated)\s+(?:here\s+|over\s+)?from\s+(?P<a>.+?)\s+to\s+(?P<b>.+)", _h_move),
    _r(
        r"(?:%PERF\s+)?%A(?:moved|relocated)\s+(?:back\s+|over\s+|out\s+)?to\s+(?P<b>.+?)(?:\s+from\s+(?P<a>.+))?$",
        _h_move,
    ),
    _r(r"(?:%PERF\s+)?%A(?:moved|relocated)\s+(?:here\s+|over\s+|away\s+)?from\s+(?P<a>.+)", _h_move),
    _r(
        r"(?:lives?|%PROG\s+%Aliving|%PERF\s+%Alived|resides?|%BE\s+%A(?:based|located|settled))\s+%Ain\s+(?P<o>.+)",
        _simple("LIVES_IN", "{s} lives in {o}", _place),
    ),
    _r(r"(?:used\s+to\s+%Alive|lived)\s+in\s+(?P<o>.+)", _simple("LIVED_IN", "{s} used to live in {o}", _place)),
    _r(r"(?:%BE\s+%A|comes?\s+%A)from\s+(?P<o>.+)", _simple("FROM", "{s} is from {o}", _place)),
    _r(r"grew\s+up\s+in\s+(?P<o>.+)", _simple("GREW_UP_IN", "{s} grew up in {o}", _place)),
    _r(r"was\s+%Aborn\s+(?P<prep>in|on)\s+(?P<o>.+)", _h_born),
    # work
    _r(
        r"(?:works?|%PROG\s+%Aworking|%PERF\s+%Aworked)\s+%A(?:full[- ]time\s+|part[- ]time\s+)?as\s+(?P<o>.+)",
        _work_as,
    ),
    _r(
        r"(?:works?|%PROG\s+%Aworking|%PERF\s+%Aworked)\s+%A(?:remotely\s+|full[- ]time\s+|part[- ]time\s+)?"
        r"(?:at|for)\s+(?P<o>.+)",
        _work(False),
    ),
    _r(r"(?:started|began|start|%BE\s+%Astarting)\s+(?:working|to\s+work|work)\s+(?:at|for)\s+(?P<o>.+)", _work(True)),
    _r(
        r"(?:%PERF\s+)?%A(?:started|began|got|landed|accepted|took|found|%BE\s+%Astarting)\s+(?:a|an|the|my)\s+"
        r"(?:new\s+)?(?:full[- ]time\s+|part[- ]time\s+)?(?:job|position|role|gig|internship)\s+"
        r"(?P<o>(?:at|with|as)\s+.+)",
        _h_new_job,
    ),
    _r(
        r"%PERF\s+(?:a|an)\s+(?:new\s+)?(?:full[- ]time\s+|part[- ]time\s+)?(?:job|position|role|gig|internship)\s+"
        r"(?:at|with)\s+(?P<o>.+)",
        _work(False),
    ),
    _r(r"(?:got|was|been)\s+%Ahired\s+(?:at|by)\s+(?P<o>.+)", _work(True)),
    _r(r"(?:%PERF\s+)?%Ajoined\s+(?P<o>.+)", _h_joined),
    _r(
        r"(?:used\s+to\s+%Awork|worked)\s+(?:at|for)\s+(?P<o>.+)", _simple("WORKED_AT", "{s} used to work at {o}", _org)
    ),
    # relationships
    _r(r"(?P<verb>%BE|got|%PERF\s+been)\s+%A(?P<kind>married|engaged)\s+to\s+(?P<o>.+)", _h_married),
    _r(rf"(?P<verb>%BE|got)\s+%A(?P<o>{_STATUS}){_END}", _h_status),
    # health and diet
    _r(
        r"%BE\s+%A(?:(?:very|severely|deathly|highly|mildly|super)\s+)?allergic\s+to\s+(?P<o>.+)",
        _listing("ALLERGIC_TO", "{s} is allergic to {o}", "Thing"),
    ),
    _r(
        r"%PERF\s+(?:a|an)\s+(?:(?:severe|serious|bad|mild)\s+)?(?P<o>[\w -]{1,40}?)\s+allergy\b",
        _listing("ALLERGIC_TO", "{s} is allergic to {o}", "Thing"),
    ),
    _r(rf"%BE\s+%A(?:a\s+|an\s+)?(?:(?:strict|full|lifelong)\s+)?(?P<o>{_DIETS}){_END}", _h_diet),
    # age
    _r(rf"%BE\s+(?P<n>\d{{1,3}})(?:\s*(?:years?|yrs?|y\.?o\.?)(?:[\s-]*old)?)?{_END}", _age(False)),
    _r(r"(?:%PERF\s+)?%Aturned\s+(?P<n>\d{1,3})\b", _age(True)),
    # "a big fan of" before the job rule: a fan is no job
    _r(
        r"%BE\s+%A(?:a\s+)?(?:(?:big|huge|massive|great|lifelong|die[- ]hard)\s+)?fan\s+of\s+(?P<o>.+)",
        _listing("LIKES", "{s} likes {o}", "Thing"),
    ),
    _r(r"(?:%BE|%PERF\s+been)\s+%A(?:a|an|the)\s+(?P<o>.+)", _h_role),
    # preferences
    _r(
        r"(?:(?:do|does)\s+not\s+%A(?:like|enjoy|love|care\s+for)|hates?|dislikes?|can\s*not\s+stand|detests?|"
        r"despises?|loathes?|%BE\s+not\s+(?:into|(?:a\s+)?(?:big\s+|huge\s+)?fan\s+of))\s+(?P<o>.+)",
        _listing("DISLIKES", "{s} dislikes {o}", "Thing"),
    ),
    _r(
        r"(?:(?:do|does)\s+)?(?:likes?|loves?|enjoys?|adores?|%BE\s+%A(?:into|passionate\s+about|"
        r"obsessed\s+with|crazy\s+about))\s+(?P<o>.+)",
        _listing("LIKES", "{s} likes {o}", "Thing"),
    ),
    _r(
        r"(?:prefers?|would\s+rather\s+have)\s+(?P<o>.+?)(?:\s+(?:over|to|rather\s+than|instead\s+of)\s+(?P<alt>.+))?$",
        _h_prefers,
    ),
    # "my ..." statements about the user
    _r(
        r"my\s+(?:main\s+)?(?:hobby|hobbies|pastimes?|passions?)\s+(?:is|are|include|includes|would\s+be)\s+(?P<o>.+)",
        _listing("HAS_HOBBY", "{s} enjoys {o} as a hobby", "Hobby"),
    ),
    _r(
        r"my\s+(?:all[- ]time\s+|absolute\s+|very\s+)?(?:favou?rite|fave?)\s+(?P<cat>[a-z]+(?:[\s-][a-z]+)?)\s+"
        r"(?:is|are|has\s+to\s+be|would\s+be|must\s+be)\s+(?P<o>.+)",
        _h_favorite,
    ),
    _r(
        r"my\s+(?:birthday|bday|b-day|date\s+of\s+birth|dob)\s+is\s+(?:on\s+)?(?P<o>.+)",
        _h_birthday,
    ),
    _r(r"my\s+(?:first\s+|full\s+|real\s+)?name\s+is\s+(?P<o>.+)", _h_name),
    _r(r"(?:am|go)\s+(?:called|named|by)\s+(?P<o>.+)", _h_name),
    _r(
        r"my\s+(?:native|first|mother)\s+(?:language|tongue)\s+is\s+(?P<o>.+)",
        _languages("NATIVE_LANGUAGE", "{p} native language is {o}"),
    ),
    # languages and learning
    _r(
        r"(?:speaks?|can\s+%Aspeak|%BE\s+%A(?:fluent|native|conversational)\s+in)\s+(?P<o>.+)",
        _languages("SPEAKS", "{s} speaks {o}"),
    ),
    _r(r"(?:started|began|%BE\s+%Astarting)\s+learning\s+(?P<o>.+)", _learning(True)),
    _r(r"%PROG\s+%Alearning\s+(?P<o>.+)", _learning(False)),
    _r(r"%BE\s+%Ataking\s+(?P<o>.+?)\s+(?:lessons|classes)\b", _learning(False)),
    _r(
        r"(?:stud(?:y|ies)|%PROG\s+%Astudying|(?:%BE\s+%A)?majoring\s+in|majors?\s+in|%BE\s+%A(?:doing|pursuing|"
        r"getting|working\s+on)\s+(?:a|an|my)\s+(?:degree|phd|ph\.?d\.?|masters?|master's|bachelors?|bachelor's|"
        r"mba|ba|bs|ms|msc|bsc|doctorate)(?:\s+degree)?\s+in)\s+(?P<o>.+)",
        _studies(False),
    ),
    _r(r"(?:studied|majored\s+in|used\s+to\s+study)\s+(?P<o>.+)", _studies(True)),
    _r(r"(?:%PERF\s+)?%Agraduated\s+from\s+(?P<o>.+)", _h_graduated),
    # relatives and pets: "I have a sister named Mia", "I just adopted a kitten"
    _r(
        r"(?P<verb>%PERF|got|adopted|%PERF\s+%A(?:got|adopted))\s+(?P<det>a|an|one|two|three|four|five|\d)\s+(?P<o>.+)",
        _h_have,
    ),
    # things one does
    _r(r"(?:plays?|%PROG\s+%Aplaying)\s+(?:the\s+)?(?P<o>.+)", _h_plays),
    _r(r"(?:drives?|%PROG\s+%Adriving)\s+(?P<det>a|an|the|my)\s+(?P<o>.+)", _h_drives),
    # trips
    _r(r"(?:%PERF\s+)?%Avisited\s+(?P<o>.+)", _visited(need_when=False)),
    _r(
        r"(?:went|traveled|travelled|flew|drove|(?:took|went\s+on)\s+(?:a\s+)?(?:trip|vacation|holiday))\s+to\s+(?P<o>.+)",
        _visited(need_when=False, school_hint=True),
    ),
    _r(r"%PERF\s+%Abeen\s+to\s+(?P<o>.+)", _visited(need_when=False)),
    _r(r"(?:was|were)\s+in\s+(?P<o>.+)", _visited(need_when=True)),
    _r(r"(?:(?:%PERF\s+)?%A(?:got|came)\s+back|(?:%PERF\s+)?%Areturned)\s+from\s+(?P<o>.+)", _h_back_from),
)


# Clauses about the user that do not open with "I" or "my".
_SELF_RULES: tuple[_Rule, ...] = (
    _r(r"(?:you\s+can\s+|please\s+|just\s+)?call\s+me\s+(?P<o>.+)", _h_name),
    _r(
        r"(?P<o>.+?)\s+(?:is|are)\s+%A(?:probably\s+)?my\s+(?:all[- ]time\s+|absolute\s+)?(?:favou?rite|fave?)"
        r"(?:\s+(?P<cat>[a-z]+(?:[\s-][a-z]+)?))?$",
        _h_reverse_favorite,
    ),
    _r(rf"(?P<o>.+?)\s+is\s+my\s+(?P<mods>{_KIN_MODS})(?P<word>{_alt(_RELATIONS)})$", _h_reverse_kin),
)
