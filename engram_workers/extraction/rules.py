"""Offline, deterministic fact extraction: regex rules over first-person English.

This is the fallback when no LLM is configured, so the whole pipeline runs without a network. It
favours precision over recall: a rule fires only on a clause that opens with a known subject ("I",
"my brother Alex", "he", or the subject of the clause before) followed by a known verb phrase. That is
why questions ("where do I live?"), requests to the assistant ("play some jazz") and hypotheticals
("if I lived in Paris") yield nothing instead of a wrong memory.

Per message: normalize (NFKC, quotes, contractions) -> sentences (questions dropped) -> clauses (a
conjunction or comma splits only when what follows can stand on its own, so "English and Spanish"
stays one list while "Austin and work at Dell" becomes two clauses) -> subject -> the first entry of
``_RULES`` whose pattern matches the clause and whose handler accepts it.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from engram_api.models import SELF_REF, ExtractedEntity, ExtractedFact, Extraction, MemoryType
from engram_api.naming import SINGLE_VALUED, normalize_name, sanitize_label, sanitize_predicate

__all__ = ["extract_rules"]

logger = logging.getLogger(__name__)

# Personal facts sit in the human-sized part of a message; bounding the input bounds the regex work.
_MAX_TEXT = 20_000
# A clause longer than this is a paste (code, logs), not a statement about oneself.
_MAX_CLAUSE = 400
_MAX_ITEMS = 100  # Extraction holds at most 100 entities and 100 facts
_MAX_LIST = 10
_MAX_NAME_WORDS = 6
_MAX_NAME_CHARS = 80


def _set(words: str) -> frozenset[str]:
    return frozenset(w.strip() for w in words.split("|") if w.strip())


def _map(spec: str) -> dict[str, str]:
    """'bro=brother|brother' -> {'bro': 'brother', 'brother': 'brother'}."""
    pairs = (item.split("=", 1) if "=" in item else (item, item) for item in spec.split("|") if item)
    return {key: value for key, value in pairs}


def _alt(words: Iterable[str]) -> str:
    """Regex alternation, longest first so "guinea pig" wins over "pig"; inner spaces match any run."""
    return "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True))


# ------------------------------------------------------------------------------------------ lexicons

_LANGUAGES = _set(
    "english|spanish|french|german|italian|portuguese|dutch|russian|polish|ukrainian|czech|slovak|"
    "greek|turkish|arabic|hebrew|persian|farsi|hindi|urdu|bengali|punjabi|tamil|telugu|marathi|"
    "gujarati|kannada|malayalam|chinese|mandarin|cantonese|japanese|korean|vietnamese|thai|"
    "indonesian|malay|tagalog|filipino|swahili|swedish|norwegian|danish|finnish|icelandic|hungarian|"
    "romanian|bulgarian|serbian|croatian|bosnian|slovenian|albanian|latvian|lithuanian|estonian|"
    "latin|esperanto|catalan|basque|galician|irish|welsh|gaelic|yiddish|amharic|somali|yoruba|igbo|"
    "hausa|zulu|xhosa|afrikaans|nepali|sinhala|burmese|khmer|lao|mongolian|georgian|armenian|"
    "azerbaijani|kazakh|uzbek|pashto|kurdish|sign language|asl|bsl"
)
_FOODS = _set(
    "pizza|sushi|pasta|burger|burgers|taco|tacos|burrito|burritos|ramen|pho|curry|chocolate|ice cream|"
    "cheese|bread|steak|chicken|fish|salmon|tuna|rice|noodles|salad|soup|fries|cake|cookies|pie|"
    "donuts|bacon|eggs|egg|avocado|mango|apples|bananas|strawberries|peanuts|peanut|nuts|tree nuts|"
    "shellfish|shrimp|lobster|crab|gluten|dairy|soy|wheat|sesame|cilantro|garlic|onions|mushrooms|"
    "olives|tomatoes|spicy food|bbq|barbecue|dumplings|kimchi|falafel|hummus|sandwiches|bagels|"
    "pancakes|waffles|popcorn|candy|dessert|desserts|fruit|vegetables|veggies|broccoli|spinach|kale|"
    "tofu|lasagna|spaghetti|mac and cheese|fish and chips|seafood|meat|pork|beef|lamb|oysters|"
    "chips|pretzels|cereal|oatmeal|yogurt|honey|pickles|peppers|corn|beans|lentils|paella|risotto"
)
_DRINKS = _set(
    "coffee|tea|green tea|beer|wine|red wine|white wine|whiskey|whisky|vodka|juice|soda|water|milk|"
    "latte|lattes|espresso|cappuccino|matcha|kombucha|cocktails|smoothies|lemonade|coke|sake|cider|"
    "rum|gin|tequila|bourbon|champagne|hot chocolate"
)
_ACTIVITIES = _set(
    "tennis|soccer|football|basketball|baseball|golf|hockey|volleyball|cricket|rugby|chess|poker|"
    "yoga|pilates|running|hiking|swimming|cycling|biking|climbing|bouldering|skiing|snowboarding|"
    "surfing|skateboarding|boxing|karate|judo|jiu jitsu|fencing|badminton|ping pong|table tennis|"
    "squash|bowling|darts|pool|billiards|video games|board games|games|cards|frisbee|ultimate frisbee|"
    "lacrosse|softball|handball|crossfit|dancing|gardening|cooking|baking|reading|writing|painting|"
    "drawing|photography|fishing|hunting|camping|traveling|travelling|knitting|sewing|crocheting|"
    "meditation|gaming|singing|jogging|rowing|kayaking|sailing|diving|scuba diving|pickleball|"
    "guitar|piano|violin|drums|bass|cello|flute|saxophone|trumpet|ukulele|harp|clarinet|keyboard|"
    "banjo|harmonica|trombone|viola|mahjong|dnd|dungeons and dragons|minecraft|fortnite"
)
_ANIMALS = _set("dogs|cats|horses|birds|animals|rabbits|bunnies|puppies|kittens|snakes|spiders|bees|pets")
_MEDIA = _set(
    "movies|films|books|music|podcasts|anime|manga|tv|television|documentaries|jazz|rock|hip hop|rap|"
    "classical music|pop music|k-pop|kpop|country music|metal|novels|comics|sci-fi|science fiction|"
    "fantasy|horror|romance|thrillers|poetry|opera|musicals|theater|theatre|reality tv|sitcoms"
)
_SUBJECTS = _set(
    "math|maths|mathematics|physics|chemistry|biology|history|geography|economics|psychology|"
    "philosophy|computer science|engineering|medicine|law|literature|english literature|art|"
    "art history|sociology|political science|politics|statistics|linguistics|architecture|nursing|"
    "business|finance|accounting|marketing|music theory|data science|machine learning|ai|"
    "artificial intelligence|astronomy|anthropology|neuroscience|education|journalism|design|"
    "graphic design|mechanical engineering|electrical engineering|civil engineering|biochemistry|"
    "genetics|ecology|pharmacy|dentistry|veterinary medicine|international relations|theology|"
    "computer engineering|software engineering|information technology|cybersecurity"
)
_MEDIA_SUFFIXES = ("movies", "films", "books", "music", "shows", "novels", "podcasts", "series", "songs")
_FOOD_SUFFIXES = (" food", " cuisine", " dishes")

_ROLE_HEADS = _set(
    "engineer|developer|programmer|coder|designer|architect|manager|director|executive|administrator|"
    "admin|analyst|consultant|scientist|researcher|professor|lecturer|teacher|tutor|instructor|"
    "educator|principal|coach|trainer|nurse|doctor|physician|surgeon|dentist|pharmacist|therapist|"
    "counselor|counsellor|paramedic|midwife|vet|veterinarian|lawyer|attorney|paralegal|judge|"
    "accountant|auditor|banker|trader|broker|economist|actuary|realtor|agent|recruiter|marketer|"
    "salesperson|salesman|saleswoman|rep|representative|cashier|clerk|receptionist|secretary|"
    "assistant|coordinator|specialist|technician|mechanic|electrician|plumber|carpenter|welder|"
    "builder|contractor|laborer|labourer|farmer|gardener|landscaper|chef|cook|baker|barista|"
    "bartender|waiter|waitress|server|butcher|pilot|driver|chauffeur|courier|firefighter|officer|"
    "cop|policeman|policewoman|detective|soldier|sailor|marine|writer|author|journalist|reporter|"
    "editor|copywriter|poet|novelist|blogger|artist|painter|illustrator|animator|photographer|"
    "filmmaker|producer|actor|actress|musician|singer|songwriter|composer|dancer|dj|streamer|"
    "youtuber|influencer|founder|cofounder|co-founder|ceo|cto|cfo|coo|cmo|cio|vp|president|"
    "chairman|chairwoman|owner|entrepreneur|freelancer|intern|apprentice|librarian|translator|"
    "interpreter|caregiver|nanny|babysitter|housekeeper|janitor|cleaner|guard|lifeguard|miner|"
    "fisherman|pastor|priest|rabbi|imam|minister|lead|supervisor|foreman|strategist|statistician|"
    "mathematician|physicist|chemist|biologist|geologist|astronomer|tester|sysadmin|pm|sre|swe|"
    "homemaker|retiree|head|student|undergrad|undergraduate|postdoc|freshman|sophomore"
)
_ROLE_SUFFIX = re.compile(r"[a-z]{3,}(?:ologist|ician|iatrist|ographer)")
_STUDENT_HEADS = _set("student|undergrad|undergraduate|postdoc|freshman|sophomore")
# Heads whose "of X" names the organization ("the CEO of Acme"); for a "teacher of English" it does not.
_EXEC_HEADS = _set(
    "ceo|cto|cfo|coo|cmo|cio|vp|president|chairman|chairwoman|founder|cofounder|co-founder|owner|"
    "director|head|manager|principal"
)
# How a lowercase word is written inside a job title.
_TITLE_WORDS = _map(
    "ceo=CEO|cto=CTO|cfo=CFO|coo=COO|cmo=CMO|cio=CIO|vp=VP|dj=DJ|pm=PM|sre=SRE|swe=SWE|qa=QA|ui=UI|ux=UX|hr=HR|"
    "it=IT|phd=PhD|md=MD|rn=RN|ai=AI|ml=ML"
)
_ROLE_STOP = _set(
    "of|and|or|but|who|that|which|in|at|for|with|to|from|my|your|his|her|their|our|it|this|these|those|not"
)
# "a good cook", "an aspiring writer", "a former teacher": a judgement or a wish, not the current job.
_ROLE_DISQUALIFIERS = _set(
    "good|great|bad|terrible|decent|amazing|excellent|awful|big|huge|little|pretty|really|very|total|"
    "fast|slow|quick|natural|aspiring|wannabe|would-be|former|retired|ex|amateur|hobby|hobbyist|future|"
    "born|lousy|horrible|better|best|worst"
)

# word as written -> canonical relation (the predicate is HAS_<CANONICAL>)
_RELATIONS = _map(
    "brother|bro=brother|sister|sis=sister|mother|mom=mother|mum=mother|mommy=mother|mama=mother|father|"
    "dad=father|daddy=father|papa=father|wife|husband|hubby=husband|spouse|partner|boyfriend|girlfriend|"
    "fiance|fiancé=fiance|fiancee=fiance|fiancée=fiance|son|daughter|kid=child|child|friend|bestie=friend|"
    "roommate|flatmate=roommate|cousin|aunt|uncle|niece|nephew|grandmother|grandma=grandmother|"
    "granny=grandmother|grandfather|grandpa=grandfather|boss|coworker|co-worker=coworker|colleague=coworker|"
    "neighbor|neighbour=neighbor|twin"
)
# Only relations a person normally has one of get a "user's <relation>" alias: consolidation resolves
# entities by alias too, so a shared "user's brother" alias would merge two different brothers.
_UNIQUE_RELATIONS = _set("mother|father|wife|husband|spouse|partner|boyfriend|girlfriend|fiance|boss")
_RELATION_PLURALS = _map(
    "brothers=brother|sisters=sister|sons=son|daughters=daughter|kids=kid|children=child|friends=friend|"
    "cousins=cousin|aunts=aunt|uncles=uncle|nieces=niece|nephews=nephew|roommates=roommate|"
    "coworkers=coworker|colleagues=colleague"
)
# pet word as written -> the species a summary reports
_PETS = _map(
    "dog|cat|puppy|kitten|rabbit|bunny|hamster|guinea pig|parrot|bird|fish|goldfish|turtle|tortoise|snake|"
    "lizard|gecko|horse|pony|ferret|rat|mouse|chinchilla|hedgehog|cockatiel|budgie|parakeet|pig|goat|"
    "golden retriever=dog|labrador=dog|lab=dog|beagle=dog|poodle=dog|husky=dog|corgi=dog|pug=dog|"
    "terrier=dog|bulldog=dog|chihuahua=dog|dachshund=dog|german shepherd=dog|border collie=dog|collie=dog|"
    "shih tzu=dog|labradoodle=dog|goldendoodle=dog|retriever=dog|greyhound=dog|rottweiler=dog|"
    "doberman=dog|dalmatian=dog|maine coon=cat|siamese=cat|ragdoll=cat|tabby=cat|sphynx=cat"
)
_PET_PLURALS = _map(
    "dogs=dog|cats=cat|puppies=puppy|kittens=kitten|rabbits=rabbit|bunnies=bunny|hamsters=hamster|"
    "guinea pigs=guinea pig|parrots=parrot|birds=bird|turtles=turtle|snakes=snake|lizards=lizard|"
    "horses=horse|ferrets=ferret|rats=rat|mice=mouse|goats=goat|pigs=pig"
)
_KIN_MODS = (
    r"(?:(?:older|younger|little|big|baby|twin|eldest|oldest|youngest|best|good|close|childhood|dear|new|old)"
    r"\s+){0,2}"
)
_PET_MODS = r"(?:(?:little|new|old|big|baby|sweet|rescue|senior)\s+){0,2}"

# Nouns after "live in" / "went to" that are housing, errands or states, not places ("the store").
_GENERIC_PLACES = _set(
    "bed|sleep|work|school|class|church|gym|office|store|shop|mall|library|hospital|doctor|dentist|"
    "airport|station|city|town|village|countryside|suburbs|suburb|mountains|lake|river|woods|forest|"
    "zoo|museum|bar|pub|restaurant|cafe|movies|cinema|theater|theatre|party|concert|game|beach|park|"
    "college|university|home|house|apartment|flat|dorm|van|car|area|neighborhood|neighbourhood|"
    "downtown|uptown|country|state|place|there|here|abroad|overseas|hotel|shelter|basement|building|"
    "studio|condo|cabin|farm|campus|same place|middle of nowhere|world|bathroom|kitchen|shower|"
    "meeting|hurry|trouble|love|charge|pain|shape|town center|city center|capital|north|south|east|west"
)
_GENERIC_ORGS = _set("home|night|nights|weekends|the moment|moment|myself|all|least|times|it|work|school")
_CLUBS = _set("gym|club|team|class|group|church|band|choir|league|community|union|society|army|navy")
_BAD_FIRST = _set(
    "it|its|it's|that|this|these|those|them|they|there|here|him|her|his|hers|me|myself|yourself|you|"
    "your|yours|we|us|our|ours|my|mine|their|theirs|what|which|who|whom|whose|when|where|why|how|"
    "something|anything|everything|nothing|someone|anyone|everyone|somebody|anybody|nobody|not|no|"
    "to|with|from|at|in|on|for|of|about|by|into|onto|if|so|very|too|all|both|each|every|any|much|"
    "many|more|most|lot|lots|bit|being|one|ones|same|other|another|whatever|whoever|such|way|like|as|"
    "just|really|also|still|and|or|but|because|um|uh|the|a|an|than|then|doing|going|having|getting|"
    "out|up|down|over|off|around|back|away|i"
)
_BAD_WHOLE = _set(
    "stuff|things|thing|people|life|day|days|time|times|today|tonight|now|home|hard|late|early|abroad|"
    "online|remotely|alone|together|well|fine|good|great|bad|best|most|least|less|more|enough|fun|it|"
    "them|you|lot|lots|everything|nothing|anything|something|yes|no|ok|okay|sure|food|things like that"
)
_NOT_NAME = (
    _BAD_FIRST
    | _set(
        "is|was|are|were|be|been|am|has|have|had|do|does|did|will|would|can|could|should|shall|may|might|"
        "must|named|called|nor|now|lives|works|likes|loves|hates|plays|speaks|studies|got|gets|went|goes|"
        "says|said|told|thinks|wants|needs|moved|started|joined|always|usually|never|often|sometimes|"
        "today|yesterday|tomorrow|again|recently|currently|finally|actually|even|while|since|lol|haha|ok|"
        "okay|please|thanks|yes|who's|whose|maybe|later|asap|soon|back"
    )
    | frozenset(_RELATIONS)
    | frozenset(_PETS)
)
_SMALL_WORDS = _set("of|the|and|de|da|del|della|di|du|la|le|los|las|von|van|der|den|y|e|upon|on|at|in|for")
_PROPER_LABELS = _set("Person|Place|Organization|Pet|Language")
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_NUMBERS = {"a": 1, "an": 1} | {
    w: n for n, w in enumerate(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"))
}

# Identity, home, work, family and health matter most; what one likes or did once matters less.
_IMPORTANCE = {
    **dict.fromkeys(("NAME",), 0.9),
    **dict.fromkeys(("LIVES_IN", "WORKS_AT", "MARRIED_TO", "ALLERGIC_TO"), 0.85),
    **dict.fromkeys(("WORKS_AS", "HAS_WIFE", "HAS_HUSBAND", "HAS_SPOUSE", "HAS_PARTNER"), 0.8),
    **dict.fromkeys(
        ("FROM", "AGE", "BIRTHDAY", "DIET", "STUDIES_AT", "RELATIONSHIP_STATUS", "NATIVE_LANGUAGE", "ENGAGED_TO"),
        0.75,
    ),
    **dict.fromkeys(("BORN_IN", "GREW_UP_IN", "STUDIES", "GRADUATED_FROM", "HAS_PET", "SPEAKS", "BIRTH_YEAR"), 0.7),
    **dict.fromkeys(("VISITED", "HAS_HABIT", "DRIVES", "MEMBER_OF"), 0.55),
}
_IMPORTANCE_DEFAULT = 0.6  # preferences, hobbies, history
_IMPORTANCE_FAMILY = 0.75  # HAS_<relation> not listed above
_FAMILY_PREDICATES = frozenset(f"HAS_{c.upper()}" for c in _RELATIONS.values())
_IMPORTANCE_FLOOR = 0.5


# ------------------------------------------------------------------------------------------- context


class _Obj(NamedTuple):
    """A parsed object: the entity to create and how a statement quotes it."""

    name: str
    label: str
    phrase: str  # "the Bay Area", "a hospital", "hiking in the mountains"
    summary: str = ""
    aliases: tuple[str, ...] = ()


@dataclass
class _Subject:
    """Who a clause is about. Relatives and pets met in passing get an entity only once a fact needs one."""

    name: str  # how statements refer to it: "User", "Alex", "User's brother"
    ref: str | None = None
    intro: _Intro | None = None

    @property
    def is_user(self) -> bool:
        return self.ref == SELF_REF


class _Intro(NamedTuple):
    """The user->relative (or pet) fact that introduces a subject, plus its entity."""

    predicate: str
    statement: str
    entity: _Obj
    valid_from: datetime | None = None


_USER_NAME = "User"


@dataclass
class _Ctx:
    event_time: datetime
    cased: bool  # whether the writer capitalizes proper nouns (see _is_cased)
    entities: list[ExtractedEntity] = field(default_factory=list)
    facts: list[ExtractedFact] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)  # normalized name -> ref
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    last_animate: _Subject | None = None  # what "he"/"she"/"who" refers to
    routine: bool = False  # the clause describes a routine: its facts must not retire standing ones

    def user(self) -> _Subject:
        return _Subject(_USER_NAME, SELF_REF)

    def entity(self, obj: _Obj) -> str | None:
        key = normalize_name(obj.name) or obj.name.casefold()
        if key in self.refs:
            return self.refs[key]
        if len(self.entities) >= _MAX_ITEMS:
            return None
        ref = f"e{len(self.entities) + 1}"
        aliases = [a for a in dict.fromkeys(obj.aliases) if a.casefold() != obj.name.casefold()][:20]
        self.entities.append(
            ExtractedEntity(ref=ref, name=obj.name[:200], label=obj.label, aliases=aliases, summary=obj.summary)
        )
        self.refs[key] = ref
        if obj.label in ("Person", "Pet"):
            self.last_animate = _Subject(obj.name, ref)
        return ref

    def subject_ref(self, subject: _Subject) -> str | None:
        if subject.ref is None and subject.intro is not None:
            intro = subject.intro
            ref = self.entity(intro.entity)
            if ref is not None:
                self._add(self.user(), intro.predicate, intro.statement, ref, "semantic", intro.valid_from)
                subject.ref = ref
                self.last_animate = subject
        return subject.ref

    def emit(
        self,
        subject: _Subject,
        predicate: str,
        statement: str,
        obj: _Obj | None = None,
        *,
        memory_type: MemoryType = "semantic",
        valid_from: datetime | None = None,
    ) -> None:
        """Add one fact, creating its subject (a relative met in passing) and object entities as needed."""
        if (self.routine and predicate in SINGLE_VALUED) or len(self.facts) >= _MAX_ITEMS:
            return
        if self.subject_ref(subject) is None:
            return
        object_ref = self.entity(obj) if obj is not None else None
        if obj is None or object_ref is not None:
            self._add(subject, predicate, statement, object_ref, memory_type, valid_from)

    def _add(
        self,
        subject: _Subject,
        predicate: str,
        statement: str,
        object_ref: str | None,
        memory_type: MemoryType,
        valid_from: datetime | None,
    ) -> None:
        if len(self.facts) >= _MAX_ITEMS or subject.ref is None:
            return
        text = " ".join(statement.split())[:1000]
        # Attribute facts (no object) differ only by their statement.
        key = (subject.ref, predicate, object_ref or text.casefold())
        if key in self.seen:
            return
        self.seen.add(key)
        importance = _IMPORTANCE.get(
            predicate, _IMPORTANCE_FAMILY if predicate in _FAMILY_PREDICATES else _IMPORTANCE_DEFAULT
        )
        if not subject.is_user:
            # Facts about people around the user matter less than facts about the user.
            importance = max(_IMPORTANCE_FLOOR, importance - 0.1)
        self.facts.append(
            ExtractedFact(
                subject=subject.ref,
                predicate=predicate,
                object=object_ref,
                statement=text,
                memory_type=memory_type,
                importance=round(importance, 2),
                valid_from=valid_from,
                single_valued=predicate in SINGLE_VALUED,
            )
        )


# -------------------------------------------------------------------------------------- text helpers

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


# ------------------------------------------------------------------------------------ object parsers


def _place(raw: str, ctx: _Ctx) -> _Obj | None:
    """A place name; "a small town in Texas" falls through to "Texas"."""
    for candidate in re.split(r"\s+in\s+", _cut(raw)):
        article, core = _split_article(_soft(candidate))
        if article in ("a", "an") or not _valid(core):
            continue
        if core.casefold() in _GENERIC_PLACES or core.split()[0].casefold() in _GENERIC_PLACES:
            continue
        if ctx.cased and not (core[0].isupper() or core[0].isdigit()):
            continue  # a cased writer capitalizes places: "the city" is no place name
        name = _display(core, "Place", article)
        return _Obj(name, "Place", f"the {name}" if article == "the" else name)
    return None


def _org(raw: str, ctx: _Ctx) -> _Obj | None:
    """An employer or school: "Google", "the University of Texas", "a hospital"."""
    article, core = _split_article(_soft(_cut(raw)))
    if not _valid(core) or core.casefold() in _GENERIC_ORGS:
        return None
    name = _display(core, "Organization", article)
    return _Obj(name, "Organization", f"{article} {name}" if article else name)


def _take_name(text: str, ctx: _Ctx) -> tuple[str, str] | None:
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
        if not capital and (ctx.cased or words or _starts_rule(text[tok.start() :])):
            break
        words.append(word)
        end = tok.start() + len(word)
        if raw != word or len(words) == 3 or not capital:
            break
    if not words:
        return None
    name = " ".join(words)
    return (_titlecase(name) if name.islower() else name), text[end:]


def _person(raw: str, ctx: _Ctx) -> _Obj | None:
    taken = _take_name(raw.strip(), ctx)
    return _Obj(taken[0], "Person", taken[0]) if taken else None


def _things(raw: str, ctx: _Ctx, default_label: str, *, single: bool = False) -> list[_Obj]:
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


# --------------------------------------------------------------------------------------- time phrases

_WHEN = re.compile(
    rf"\s+(?P<when>yesterday|today|tonight|this\s+(?:morning|afternoon|evening|week|weekend|month|year|"
    rf"summer|winter|spring|fall)|last\s+(?:night|week|weekend|month|year|summer|winter|spring|fall|"
    rf"autumn|christmas|{_WEEKDAYS})|the\s+day\s+before\s+yesterday|(?:\d+|a|an|one|two|three|four|five|"
    rf"six|seven|eight|nine|ten|a\s+few|a\s+couple\s+of)\s+(?:days?|weeks?|months?|years?)\s+ago|"
    rf"(?:back\s+)?in\s+(?:(?:19|20)\d\d|{_MONTHS})\b[^,;]*|on\s+(?:{_WEEKDAYS})|over\s+the\s+"
    rf"(?:weekend|holidays|summer))\b",
    re.I,
)
_DAY_OFFSETS = {
    **dict.fromkeys(("today", "tonight", "this morning", "this afternoon", "this evening"), 0),
    **dict.fromkeys(("yesterday", "last night"), 1),
    "the day before yesterday": 2,
}
_AGO = re.compile(r"(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten) (days?|weeks?) ago")


_DATE = re.compile(
    rf"(?:(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b\.?)"
    rf"(?:,?\s+(?:19|20)\d\d\b)?|(?:{_MONTHS})\s+(?:19|20)\d\d\b|\d{{1,4}}[/.-]\d{{1,2}}(?:[/.-]\d{{2,4}})?\b",
    re.I,
)


def _date(raw: str) -> str | None:
    """A calendar date at the head of ``raw``: "March 3rd, 1990", "3 March", "1990-03-03"."""
    m = _DATE.match(raw.strip())
    return m.group(0) if m else None


def _split_when(raw: str) -> tuple[str, str | None]:
    m = _WHEN.search(raw)
    return (raw[: m.start()], " ".join(m.group("when").split())) if m else (raw, None)


def _resolve_when(when: str, event_time: datetime) -> datetime | None:
    """Day-precise expressions only: "last summer" has no honest single date."""
    low = " ".join(when.casefold().split())
    if low in _DAY_OFFSETS:
        return event_time - timedelta(days=_DAY_OFFSETS[low])
    m = _AGO.fullmatch(low)
    if m:
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBERS[m.group(1)]
        return event_time - timedelta(days=n * (7 if m.group(2).startswith("week") else 1))
    return None


# ------------------------------------------------------------------------------------------ handlers
# A handler gets the rule's match and the clause's subject, emits facts, and returns whether it took
# the clause (False lets later rules try: "I'm a morning person" is no job, maybe something else).

_Handler = Callable[[re.Match[str], _Subject, _Ctx], bool]


def _since(ctx: _Ctx, changed: bool) -> datetime | None:
    """valid_from: the message time for changes stated as just happening ("I moved", "I joined")."""
    return ctx.event_time if changed else None


def _simple(predicate: str, template: str, parse: Callable[[str, _Ctx], _Obj | None]) -> _Handler:
    """One object from group "o", one fact worded by ``template`` ({s} subject, {o} object)."""

    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        obj = parse(m.group("o"), ctx)
        if obj is not None:
            ctx.emit(subj, predicate, template.format(s=subj.name, o=obj.phrase), obj)
        return True

    return handle


def _emit_list(subj: _Subject, ctx: _Ctx, raw: str, predicate: str, template: str, default_label: str) -> None:
    """One fact per listed thing; ``template`` may use {s} subject, {p} its possessive, {o} the thing."""
    for obj in _things(raw, ctx, default_label, single=predicate in SINGLE_VALUED):
        ctx.emit(subj, predicate, template.format(s=subj.name, p=_possessive(subj.name), o=obj.phrase), obj)


def _listing(predicate: str, template: str, default_label: str) -> _Handler:
    """A list of things from group "o" ("I like hiking and jazz"), one fact each."""

    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        _emit_list(subj, ctx, m.group("o"), predicate, template, default_label)
        return True

    return handle


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


def _emit_role(subj: _Subject, ctx: _Ctx, role: str, *, changed: bool = False) -> None:
    obj = _Obj(_role_case(role), "Role", f"{_a(role)} {role}")
    verb = "is" if role.split()[-1].casefold() in _STUDENT_HEADS else "works as"
    ctx.emit(subj, "WORKS_AS", f"{subj.name} {verb} {obj.phrase}", obj, valid_from=_since(ctx, changed))


def _emit_org(subj: _Subject, ctx: _Ctx, raw: str, *, changed: bool, student: bool = False) -> None:
    org = _org(raw, ctx)
    if org is None:
        return
    predicate, verb = ("STUDIES_AT", "studies at") if student else ("WORKS_AT", "works at")
    ctx.emit(subj, predicate, f"{subj.name} {verb} {org.phrase}", org, valid_from=_since(ctx, changed))


_AS_ROLE = re.compile(r"\s+as\s+(?:a|an|the)\s+(?P<role>.+)$", re.I | re.S)
_AT_ORG = re.compile(r"^\s*,?\s*(?:at|for|with)\s+(?P<org>.+)$", re.I | re.S)


def _employment(subj: _Subject, ctx: _Ctx, raw: str, *, changed: bool) -> None:
    """'Google (as a software engineer)': WORKS_AT, plus WORKS_AS when a role is given."""
    as_role = _AS_ROLE.search(raw)
    _emit_org(subj, ctx, raw[: as_role.start()] if as_role else raw, changed=changed)
    role = _loose_role(as_role.group("role")) if as_role else None
    if role:
        _emit_role(subj, ctx, role[0], changed=changed)


def _work(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        _employment(subj, ctx, m.group("o"), changed=changed)
        return True

    return handle


def _role_then_org(subj: _Subject, ctx: _Ctx, raw: str, *, changed: bool) -> None:
    """'a nurse (at St. Mary's)' after "work as" or "a new job as"."""
    role = _loose_role(_split_article(raw.strip())[1])
    if role:
        _emit_role(subj, ctx, role[0], changed=changed)
        at = _AT_ORG.match(role[1])
        if at:
            _emit_org(subj, ctx, at.group("org"), changed=changed)


def _work_as(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    _role_then_org(subj, ctx, m.group("o"), changed=False)
    return True


def _h_new_job(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'a new job at X (as Y)' / 'a new job as Y (at X)'."""
    rest = m.group("o")
    if rest[:2].casefold() == "as":
        _role_then_org(subj, ctx, rest[2:], changed=True)
    else:
        _employment(subj, ctx, rest.split(None, 1)[1], changed=True)
    return True


def _h_joined(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'joined Google' is a job; 'joined a gym' or 'joined the choir' is a membership."""
    raw = m.group("o")
    as_role = _AS_ROLE.search(raw)
    article, core = _split_article(_soft(_cut(raw[: as_role.start()] if as_role else raw)))
    if not _valid(core):
        return True
    lowercase = not any(c.isupper() for c in core)
    if article in ("a", "an") or core.split()[-1].casefold() in _CLUBS or (ctx.cased and lowercase):
        phrase = f"{article} {core}" if article else core
        obj = _Obj(core, "Organization", phrase)
        ctx.emit(subj, "MEMBER_OF", f"{subj.name} joined {phrase}", obj, valid_from=ctx.event_time)
    else:
        _employment(subj, ctx, raw, changed=True)
    return True


_STUDENT_OF = re.compile(r"^\s*(?:in|of|studying)\s+(?P<f>.+?)(?:\s+at\s+(?P<org>.+))?$", re.I | re.S)
_STUDENT_AT = re.compile(r"^\s*at\s+(?P<org>.+?)(?:\s+(?:studying|in)\s+(?P<f>.+))?$", re.I | re.S)
_ROLE_OF_AT = re.compile(r"^\s+of\s+(?P<field>[\w&' -]+?)\s+(?:at|for)\s+(?P<org>.+)$", re.I | re.S)
_OF_ORG = re.compile(r"^\s+of\s+(?P<org>.+)$", re.I | re.S)


def _h_role(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'I'm a nurse', 'I'm a software engineer at Google', 'I'm a PhD student in physics at MIT'."""
    found = _role(m.group("o"))
    if found is None:
        return False
    role, rest = found
    head = role.split()[-1].casefold()
    if head in _STUDENT_HEADS:
        _emit_role(subj, ctx, role)
        parts = _STUDENT_OF.match(rest) or _STUDENT_AT.match(rest)
        if parts and parts.group("f"):
            _emit_list(subj, ctx, parts.group("f"), "STUDIES", "{s} studies {o}", "Subject")
        if parts and parts.group("org"):
            _emit_org(subj, ctx, parts.group("org"), changed=False, student=True)
        return True
    of_at = _ROLE_OF_AT.match(rest)  # "VP of Engineering at Stripe"
    if of_at:
        role, org = f"{role} of {of_at.group('field').strip()}", of_at.group("org")
    else:
        at = _AT_ORG.match(rest) or (_OF_ORG.match(rest) if head in _EXEC_HEADS else None)
        org = at.group("org") if at else None
    _emit_role(subj, ctx, role)
    if org:
        _emit_org(subj, ctx, org, changed=False)
    return True


def _h_married(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    person = _person(m.group("o"), ctx)
    if person is None:
        return True
    engaged = m.group("kind").casefold() == "engaged"
    if subj.is_user:
        person = person._replace(aliases=("user's fiance" if engaged else "user's spouse",))
    predicate, verb = ("ENGAGED_TO", "is engaged to") if engaged else ("MARRIED_TO", "is married to")
    changed = m.group("verb").casefold() == "got"
    ctx.emit(subj, predicate, f"{subj.name} {verb} {person.phrase}", person, valid_from=_since(ctx, changed))
    return True


def _h_status(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    status = " ".join(m.group("o").casefold().split())
    changed = m.group("verb").casefold() == "got"
    ctx.emit(subj, "RELATIONSHIP_STATUS", f"{subj.name} is {status}", valid_from=_since(ctx, changed))
    return True


def _h_diet(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    diet = "-".join(m.group("o").casefold().replace("-", " ").split())
    ctx.emit(subj, "DIET", f"{subj.name} follows {_a(diet)} {diet} diet")
    return True


def _age(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        years = int(m.group("n"))
        if 0 < years <= 120:
            ctx.emit(subj, "AGE", f"{subj.name} is {years} years old", valid_from=_since(ctx, changed))
        return True

    return handle


def _h_prefers(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    found = _things(m.group("o"), ctx, "Thing", single=True)
    if found:
        alt = _things(m.group("alt"), ctx, "Thing", single=True) if m.group("alt") else []
        over = f" over {alt[0].phrase}" if alt else ""
        ctx.emit(subj, "PREFERS", f"{subj.name} prefers {found[0].phrase}{over}", found[0])
    return True


_CATEGORY_LABELS = _map(
    "food=Food|dish=Food|meal=Food|snack=Food|dessert=Food|fruit=Food|cuisine=Food|drink=Drink|"
    "beverage=Drink|color=Concept|movie=Media|film=Media|book=Media|show=Media|tv show=Media|series=Media|"
    "song=Media|album=Media|band=Media|game=Media|artist=Person|singer=Person|author=Person|actor=Person|"
    "sport=Activity|activity=Activity|hobby=Hobby|city=Place|country=Place|place=Place|animal=Animal|"
    "subject=Subject|language=Language|team=Organization|restaurant=Organization|season=Concept|"
    "number=Concept|car=Vehicle|holiday=Event"
)


def _favorite(subj: _Subject, ctx: _Ctx, written_category: str, raw: str) -> None:
    """'my favorite food is sushi' -> FAVORITE_FOOD; a plural category is a list of likes."""
    written = " ".join(written_category.casefold().split())
    singular = " ".join(_singular(w) for w in written.split())
    category = singular.replace("colour", "color")
    label = _CATEGORY_LABELS.get(category) or sanitize_label(category)
    if singular != written:
        # "my favorite foods are pizza and sushi": several values, so not a single-valued slot.
        _emit_list(subj, ctx, raw, "LIKES", f"{{p}} favorite {written} include {{o}}", label)
    else:
        predicate = sanitize_predicate(f"FAVORITE_{category}")
        _emit_list(subj, ctx, raw, predicate, f"{{p}} favorite {written} is {{o}}", label)


def _h_favorite(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    _favorite(subj, ctx, m.group("cat"), m.group("o"))
    return True


def _h_reverse_favorite(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'Sushi is my favorite (food)': the object comes first."""
    raw = _decapitalize(m.group("o"))
    if m.group("cat"):
        _favorite(subj, ctx, m.group("cat"), raw)
    else:
        _emit_list(subj, ctx, raw, "LIKES", "{s} likes {o}", "Thing")
    return True


_BIRTHDAY_SHIFT = {"today": 0, "tomorrow": 1, "yesterday": -1}


def _h_birthday(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'my birthday is March 3rd' (or "today", resolved to the message's date)."""
    raw = _ARTICLE.sub("", m.group("o").strip())
    shift = _BIRTHDAY_SHIFT.get(_cut(raw).casefold())
    if shift is not None:
        day = ctx.event_time + timedelta(days=shift)
        date: str | None = f"{day:%B} {day.day}"
    else:
        date = _date(raw)
    if date is not None:  # "my birthday is soon" gives no date
        ctx.emit(subj, "BIRTHDAY", f"{_possessive(subj.name)} birthday is {date}")
    return True


def _h_name(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    taken = _take_name(m.group("o").strip(), ctx)
    if taken is not None:
        ctx.emit(subj, "NAME", f"{_possessive(subj.name)} name is {taken[0]}")
    return True


def _language(item: _Obj, ctx: _Ctx) -> _Obj | None:
    """Languages come from the lexicon, or are capitalized in a cased message ("Tagalog").

    ``item`` must come from ``_things`` with a common-noun label, so its name is still as written.
    """
    low = item.name.casefold()
    if low in _LANGUAGES or (ctx.cased and item.name[:1].isupper() and len(item.name.split()) <= 2):
        name = item.name.upper() if low in ("asl", "bsl") else _titlecase(item.name)
        return _Obj(name, "Language", name)
    return None


def _languages(predicate: str, template: str) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        for item in _things(m.group("o"), ctx, "Thing", single=predicate in SINGLE_VALUED):
            lang = _language(item, ctx)
            if lang is not None:
                statement = template.format(s=subj.name, p=_possessive(subj.name), o=lang.phrase)
                ctx.emit(subj, predicate, statement, lang)
        return True

    return handle


def _learning(changed: bool) -> _Handler:
    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        for item in _things(m.group("o"), ctx, "Skill"):
            obj = _language(item, ctx) if item.name.casefold() in _LANGUAGES else item
            if obj is not None:
                statement = f"{subj.name} is learning {obj.phrase}"
                ctx.emit(subj, "LEARNING", statement, obj, valid_from=_since(ctx, changed))
        return True

    return handle


_STUDY_AT = re.compile(r"(?:^|\s+)at\s+(?P<org>.+)$", re.I | re.S)


def _studies(past: bool) -> _Handler:
    """'study physics (at MIT)', 'study at MIT'; the past tense gives STUDIED / STUDIED_AT."""
    field_predicate, org_predicate = ("STUDIED", "STUDIED_AT") if past else ("STUDIES", "STUDIES_AT")
    verb = "studied" if past else "studies"

    def handle(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
        raw = m.group("o")
        at = _STUDY_AT.search(raw)
        subject_raw = raw[: at.start()] if at else raw
        if subject_raw.strip():
            _emit_list(subj, ctx, subject_raw, field_predicate, f"{{s}} {verb} {{o}}", "Subject")
        org = _org(at.group("org"), ctx) if at else None
        if org is not None:
            ctx.emit(subj, org_predicate, f"{subj.name} {verb} at {org.phrase}", org)
        return True

    return handle


_DEGREE_IN = re.compile(r"\s+with\s+(?:a|an|my)\s+(?:[\w']+\s+){0,2}?in\s+(?P<f>.+)$", re.I | re.S)
_YEAR = re.compile(r"\bin\s+((?:19|20)\d\d)\b")


def _h_graduated(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    raw = m.group("o")
    degree = _DEGREE_IN.search(raw)
    org = _org(raw[: degree.start()] if degree else raw, ctx)
    if org is not None:
        year = _YEAR.search(raw)
        when = f" in {year.group(1)}" if year else ""
        ctx.emit(subj, "GRADUATED_FROM", f"{subj.name} graduated from {org.phrase}{when}", org)
    if degree:
        _emit_list(subj, ctx, degree.group("f"), "STUDIED", "{s} studied {o}", "Subject")
    return True


def _introduce(mods: str, word: str, name: str | None, ctx: _Ctx, *, changed: bool = False) -> _Subject:
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
    return _Subject(display, intro=_Intro(predicate, statement, entity, _since(ctx, changed)))


_HAVE_KIN = re.compile(
    rf"^(?P<mods>{_KIN_MODS})(?P<word>{_alt([*_RELATIONS, *_RELATION_PLURALS])})(?![\w-])(?P<rest>.*)$",
    re.I | re.S,
)
_HAVE_PET = re.compile(
    rf"^(?P<mods>{_PET_MODS})(?P<word>{_alt([*_PETS, *_PET_PLURALS])})(?![\w-])(?P<rest>.*)$", re.I | re.S
)
_NAMED = re.compile(r"^\s*,?\s*(?:who\s+is\s+|whose\s+name\s+is\s+|that\s+is\s+)?(?:named|called)\s+", re.I)
_JOINER = re.compile(r"^\s*(?:,\s*)?(?:and\s+|&\s+|,\s*)", re.I)


def _names(text: str, ctx: _Ctx) -> tuple[list[str], str]:
    """'Max and Luna who ...' -> (['Max', 'Luna'], ' who ...')."""
    names: list[str] = []
    rest = text
    while len(names) < _MAX_LIST:
        joiner = _JOINER.match(rest) if names else None
        taken = _take_name(rest[joiner.end() :] if joiner else rest.lstrip(" ,"), ctx)
        if taken is None or (names and joiner is None):
            break
        names.append(taken[0])
        rest = taken[1]
    return names, rest


_NEXT_ITEM = re.compile(r"^\s*,?\s*(?:and\s+)?(?P<det>a|an|one|two|three|four|five|\d)\s+(?P<o>.+)$", re.I | re.S)


def _have_item(det: str, text: str, ctx: _Ctx, *, changed: bool) -> tuple[str, _Subject | None]:
    """One 'a brother named Alex' / 'two cats named Luna and Milo' -> (text after it, its one subject)."""
    found = _HAVE_KIN.match(text) or _HAVE_PET.match(text)
    if found is None:
        return text, None
    written = found.group("word").casefold()
    word = _RELATION_PLURALS.get(written) or _PET_PLURALS.get(written) or written
    mods = " ".join(found.group("mods").casefold().split())
    named = _NAMED.match(found.group("rest"))
    names, after = _names(found.group("rest")[named.end() :], ctx) if named else ([], found.group("rest"))
    count = int(det) if det.isdigit() else _NUMBERS.get(det.casefold(), 1)
    if not names and count > 1:
        predicate = "HAS_PET" if word in _PETS else sanitize_predicate(f"HAS_{_RELATIONS[word]}")
        kind = f"{mods} {written}".strip()
        ctx.emit(ctx.user(), predicate, f"User has {det.casefold()} {kind}", valid_from=_since(ctx, changed))
        return after, None
    named_or_not: list[str | None] = [*names] if names else [None]
    subjects = [_introduce(mods, word, name, ctx, changed=changed) for name in named_or_not]
    for subject in subjects:
        ctx.subject_ref(subject)
    return after, subjects[0] if len(subjects) == 1 else None


def _h_have(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'I have a brother named Alex (who ...)', 'I have two cats named Luna and Milo', 'I got a puppy'."""
    det, text = m.group("det"), m.group("o")
    if not subj.is_user or not (_HAVE_KIN.match(text) or _HAVE_PET.match(text)):
        return False
    changed = m.group("verb").casefold().split()[-1] in ("got", "adopted")
    after, last = "", None
    for _ in range(_MAX_LIST):  # "a sister named Mia and a brother named Sam"
        after, last = _have_item(det, text, ctx, changed=changed)
        following = _NEXT_ITEM.match(after)
        if following is None or after == text:
            break
        det, text = following.group("det"), following.group("o")
    if last is not None and after.strip():
        _clause(after, ctx, last)  # "... named Alex who works at Amazon"
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


def _h_plays(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    for obj in _things(m.group("o"), ctx, "Activity"):
        if ctx.cased and obj.name[:1].isupper() and obj.label == "Activity":
            obj = obj._replace(label="Media")  # a capitalized unknown thing one plays is a game title
        ctx.emit(subj, "PLAYS", f"{subj.name} plays {obj.phrase}", obj)
    return True


def _h_drives(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    core = _soft(_cut(m.group("o")))
    if _valid(core):
        article = m.group("det").casefold()
        obj = _Obj(core, "Vehicle", f"{_a(core) if article == 'my' else article} {core}")
        ctx.emit(subj, "DRIVES", f"{subj.name} drives {obj.phrase}", obj)
    return True


# -------------------------------------------------------------------------------------------- rules

# Adverbs that may sit between subject and verb ("I also just moved to ...") without changing the fact.
_ADV_WORDS = (
    r"just|recently|currently|also|still|now|actually|really|truly|totally|absolutely|definitely|"
    r"finally|officially|kind\s+of|kinda|sort\s+of|mainly|even|honestly|literally|already|happily|"
    r"proudly|both|originally|presently|newly|only|primarily"
)
_ADV = rf"(?:{_ADV_WORDS})"
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


def _h_reverse_kin(m: re.Match[str], subj: _Subject, ctx: _Ctx) -> bool:
    """'Alex is my brother'."""
    taken = _take_name(m.group("o").strip(), ctx)
    if taken is None or taken[1].strip():
        return False
    mods = " ".join(m.group("mods").casefold().split())
    ctx.subject_ref(_introduce(mods, m.group("word").casefold(), taken[0], ctx))
    return True


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

# ------------------------------------------------------------------------------------------ habits

_FREQ = (
    r"always|usually|often|normally|typically|generally|regularly|frequently|sometimes|occasionally|"
    r"never|rarely|seldom|hardly\s+ever|almost\s+always|almost\s+never"
)
_NEGATIVE_FREQ = re.compile(r"never|rarely|seldom|hardly\s+ever|almost\s+never", re.I)
_HABIT_LEAD = re.compile(rf"^(?P<aux>(?:am|is|are)\s+)?(?P<adv>{_FREQ})\s+(?P<body>\S.*)$", re.I | re.S)
_HABIT_TAIL = re.compile(
    rf"^(?P<body>.+?)\s+(?P<freq>(?:every|each)\s+(?:single\s+)?(?:day|morning|afternoon|evening|night|week|"
    rf"weekend|month|year|summer|winter|{_WEEKDAYS})|daily|weekly|nightly|monthly|on\s+weekends|"
    rf"on\s+(?:{_WEEKDAYS})s|most\s+(?:days|mornings|evenings|nights|weekends)|"
    rf"(?:once|twice|three\s+times|\d+\s+times)\s+a\s+(?:day|week|month|year))\b(?P<after>.*)$",
    re.I | re.S,
)
_PAST = _set(
    "was|were|had|did|been|went|got|said|made|thought|wanted|used|came|took|saw|knew|felt|became|left|"
    "ran|began|would|could|should"
)


def _present_verb(word: str) -> bool:
    low = word.casefold()
    if not low.isalpha() or low in _PAST or low in _BAD_FIRST:
        return False
    return not (low.endswith("ed") and not low.endswith("eed"))


def _habit(subj: _Subject, rest: str, ctx: _Ctx) -> tuple[str, bool] | None:
    """'I usually run before work' / 'I run every morning': a procedural HAS_HABIT fact.

    Returns the clause without its frequency words (so "I play tennis every Sunday" still gives
    PLAYS) and whether the frequency negates it ("I never eat meat" says nothing about liking meat).
    """
    lead = _HABIT_LEAD.match(rest)
    tail = None if lead else _HABIT_TAIL.match(rest)
    if lead:
        adv, body = " ".join(lead.group("adv").casefold().split()), lead.group("body")
        if lead.group("aux"):
            said, core = f"is {adv} {body}", f"{lead.group('aux')}{body}"
        else:
            verb, _, after = body.partition(" ")
            if not _present_verb(verb):
                return None
            said, core = f"{adv} {_third_person(verb) if subj.is_user else verb} {after}", body
        negative = bool(_NEGATIVE_FREQ.fullmatch(adv))
    elif tail:
        body = tail.group("body")
        verb, _, after = body.partition(" ")
        if not _present_verb(verb):
            return None
        verb = _third_person(verb) if subj.is_user else verb
        said, core, negative = f"{verb} {after} {tail.group('freq')}{tail.group('after')}", body, False
    else:
        return None
    said = _HARD_STOP.split(said, maxsplit=1)[0].strip(" ,")[:300]
    statement = f"{subj.name} {_about_user(said) if subj.is_user else said}"
    ctx.emit(subj, "HAS_HABIT", statement, memory_type="procedural")
    return core, negative


# ----------------------------------------------------------------------------------- clauses, subjects

_FILLERS = (
    r"and|but|so|also|plus|then|oh|well|actually|btw|by\s+the\s+way|fyi|anyway|anyways|honestly|"
    r"basically|now|yeah|yes|yep|no|hey|hi|hello|ok|okay|um|uh|lol|haha|just\s+so\s+you\s+know|fun\s+fact|"
    r"ps|p\.s\.|i\s+think(?:\s+that)?|i\s+guess|i\s+believe(?:\s+that)?|i\s+mean|i\s+feel\s+like|"
    r"i\s+would\s+say|i\s+should\s+mention(?:\s+that)?|i\s+forgot\s+to\s+mention(?:\s+that)?|"
    r"to\s+be\s+honest|tbh|as\s+you\s+know|you\s+know|remember(?:\s+that)?|note(?:\s+that)?|"
    r"for\s+the\s+record|for\s+context|in\s+fact|guess\s+what|thanks|thank\s+you|" + _ADV_WORDS
)
_LEAD = re.compile(rf"^[\s,:;.!'\"*-]*(?:(?:{_FILLERS})\b[\s,:;.!*-]*)*", re.I)
_LEAD_ADV = re.compile(rf"^(?:{_ADV}[\s,]+)+", re.I)
_SEP = re.compile(
    r"(\s*[,;]\s*(?:(?:and|but|so|plus|also|then)\s+)?|\s+(?:and|but|so|plus|also|then|while|whereas|because|"
    r"cause|since|though|although)\s+|\s+[-–—]+\s+)",
    re.I,
)
_MY_SELF = (
    r"my\s+(?=(?:all[- ]time\s+|absolute\s+|very\s+|main\s+)?(?:favou?rite|fave?|hobby|hobbies|pastimes?|"
    r"passions?|birthday|bday|b-day|date\s+of\s+birth|dob|(?:first\s+|full\s+|real\s+)?name|native|first\s+language|"
    r"mother\s+tongue)\b)"
)
_SELF = re.compile(r"^i(?:\s+(?P<rest>.*))?$", re.I | re.S)
_PRONOUN = re.compile(r"^(?:he|she|who)(?:\s+(?P<rest>.*))?$", re.I | re.S)
_KIN_SUBJECT = re.compile(
    rf"^my\s+(?P<mods>{_KIN_MODS})(?P<word>{_alt(_RELATIONS)})(?![\w-])(?P<after>.*)$", re.I | re.S
)
_PET_SUBJECT = re.compile(rf"^my\s+(?P<mods>{_PET_MODS})(?P<word>{_alt(_PETS)})(?![\w-])(?P<after>.*)$", re.I | re.S)
_MY_SELF_RE = re.compile(rf"^{_MY_SELF}", re.I)
_INTRO = re.compile(
    r"^\s*(?:'s\s+name\s+is|,?\s*(?:whose\s+name\s+is|who\s+is\s+(?:named|called)|is\s+(?:named|called)|named|"
    r"called)|,)?\s*",
    re.I,
)


def _past(pattern: re.Pattern[str], text: str) -> str:
    """``text`` after ``pattern``'s match at its start (these patterns may match the empty string)."""
    m = pattern.match(text)
    return text[m.end() :] if m else text


def _strip_lead(text: str) -> str:
    return _past(_LEAD, text).strip()


def _starts_rule(text: str) -> bool:
    """Whether ``text`` opens with a verb phrase some rule knows ("works at ...")."""
    text = _LEAD_ADV.sub("", text.strip())
    return bool(_HABIT_LEAD.match(text)) or any(rule.pattern.match(text) for rule in _RULES)


def _opens_clause(piece: str) -> bool:
    """Whether a piece after a comma or conjunction stands on its own (else it continues a list)."""
    text = _strip_lead(piece)
    if _SELF.match(text) or _PRONOUN.match(text) or _MY_SELF_RE.match(text):
        return True
    if _KIN_SUBJECT.match(text) or _PET_SUBJECT.match(text):
        return True
    return _starts_rule(text) or any(rule.pattern.match(text) for rule in _SELF_RULES)


def _clauses(sentence: str) -> list[str]:
    parts = _SEP.split(sentence)
    clauses = [parts[0]]
    for sep, piece in zip(parts[1::2], parts[2::2], strict=True):
        if _opens_clause(piece):
            clauses.append(piece)
        else:
            clauses[-1] += sep + piece
    return clauses


def _parse_subject(clause: str, ctx: _Ctx) -> tuple[_Subject, str] | None:
    """The clause's subject and the rest of it, or None when it opens with no known subject."""
    m = _SELF.match(clause)
    if m:
        return ctx.user(), m.group("rest") or ""
    m = _KIN_SUBJECT.match(clause) or _PET_SUBJECT.match(clause)
    if m:
        mods = " ".join(m.group("mods").casefold().split())
        after = m.group("after")
        taken = _take_name(_past(_INTRO, after), ctx)
        subject = _introduce(mods, m.group("word").casefold(), taken[0] if taken else None, ctx)
        if taken:
            ctx.subject_ref(subject)  # a named relative is worth remembering on its own
            return subject, taken[1]
        ctx.last_animate = subject
        return subject, after
    m = _PRONOUN.match(clause)
    if m:
        return (ctx.last_animate, m.group("rest") or "") if ctx.last_animate else None
    if _MY_SELF_RE.match(clause):
        return ctx.user(), clause
    return None


def _predicate(subj: _Subject, rest: str, ctx: _Ctx) -> None:
    rest = _LEAD_ADV.sub("", rest.strip(" ,"))
    habit = _habit(subj, rest, ctx)
    if habit is not None:
        core, negative = habit
        if negative:
            return
        rest = _LEAD_ADV.sub("", core)
    outer = ctx.routine
    ctx.routine = outer or habit is not None
    try:
        for rule in _RULES:
            m = rule.pattern.match(rest)
            if m is not None and rule.handler(m, subj, ctx):
                return
    finally:
        ctx.routine = outer


def _clause(clause: str, ctx: _Ctx, previous: _Subject | None) -> _Subject | None:
    """Extract from one clause; returns its subject, which a following subjectless clause inherits."""
    clause = _strip_lead(clause)
    if not clause or len(clause) > _MAX_CLAUSE:
        return previous
    parsed = _parse_subject(clause, ctx)
    if parsed is None:
        for rule in _SELF_RULES:
            m = rule.pattern.match(clause)
            if m is not None and rule.handler(m, ctx.user(), ctx):
                return ctx.user()
        if previous is None:
            return None  # "Play some jazz" is a request to the assistant, not a fact about the user
        parsed = previous, clause
    subject, rest = parsed
    _predicate(subject, rest, ctx)
    return subject


# ------------------------------------------------------------------------------------- sentences, entry

_QUOTES = str.maketrans({"’": "'", "‘": "'", "ʼ": "'", "`": "'", "“": '"', "”": '"'})
_CONTRACTIONS = (
    (re.compile(r"\bi\s*'\s*m\b|\bim\b", re.I), "I am"),
    (re.compile(r"\bi\s*'\s*ve\b|\bive\b", re.I), "I have"),
    (re.compile(r"\bi\s*'\s*d\b", re.I), "I would"),
    (re.compile(r"\bi\s*'\s*ll\b", re.I), "I will"),
    (re.compile(r"\bcan\s*'?\s*t\b|\bcannot\b", re.I), "can not"),
    (re.compile(r"\bwon'?t\b", re.I), "will not"),
    (re.compile(r"\b(do|does|did|is|was|are|were|have|has|had|could|should|would)n'?t\b", re.I), r"\1 not"),
    (re.compile(r"\b(he|she|who|that|it)'s\b", re.I), r"\1 is"),
    (re.compile(r"\b(you|we|they)'re\b", re.I), r"\1 are"),
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])\s+|[\r\n]+")
_TITLE_ABBREVIATION = re.compile(r"\b(?:st|dr|mr|mrs|ms|mt|ft|prof|jr|sr)\.$", re.I)
_WORD = re.compile(r"[^\W\d_][\w'-]*")


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    return text


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for part in _SENTENCE_BREAK.split(text):
        if out and _TITLE_ABBREVIATION.search(out[-1]) and part[:1].isupper():
            out[-1] += " " + part  # "St. Louis", "Dr. Smith"
        else:
            out.append(part)
    return [s.strip() for s in out if s.strip()]


def _is_cased(sentences: list[str]) -> bool:
    """Whether the writer capitalizes: any capital beyond sentence starts and the pronoun "I".

    A cased writer's lowercase words are common nouns ("the city"); an all-lowercase writer's may be
    names ("austin"), which rules then accept and title-case.
    """
    return any(w[0].isupper() and w != "I" for s in sentences for w in _WORD.findall(s)[1:])


def extract_rules(text: str, *, event_time: datetime) -> Extraction:
    """Entities and facts stated in ``text`` (first-person English), without an LLM.

    Never raises: nothing recognizable (or any input at all that trips a rule) gives an empty
    ``Extraction``. ``event_time`` dates facts stated as changes ("I moved to Austin").
    """
    if not isinstance(text, str) or not text.strip():
        return Extraction()
    try:
        return _extract(text, event_time)
    except Exception:  # the offline fallback must never fail a message; a rule bug is logged instead
        logger.exception("rule-based extraction failed; returning an empty extraction")
        return Extraction()


def _extract(text: str, event_time: datetime) -> Extraction:
    sentences = _sentences(_normalize(text[:_MAX_TEXT]))
    if len(text) > _MAX_TEXT:
        sentences = sentences[:-1]  # the cut left its last sentence unfinished ("I live in Aus")
    ctx = _Ctx(event_time=event_time, cased=_is_cased(sentences))
    for sentence in sentences:
        if sentence.rstrip(" \"')").endswith("?"):
            continue  # a question states nothing
        previous: _Subject | None = None
        for clause in _clauses(sentence.rstrip(" .!…\"')")):
            previous = _clause(clause, ctx, previous)
        if len(ctx.facts) >= _MAX_ITEMS:
            break
    used = {f.subject for f in ctx.facts} | {f.object for f in ctx.facts if f.object}
    return Extraction(entities=[e for e in ctx.entities if e.ref in used], facts=ctx.facts)
