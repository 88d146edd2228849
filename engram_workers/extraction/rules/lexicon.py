"""Limits and word lists the rules share: languages, foods, roles, relations, pets, importance.

Pure data plus three builders (``_set``, ``_map``, ``_alt``); nothing here depends on another rule module,
and the size limits at the top are what bounds every later step's work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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


# Adverbs that may sit between subject and verb ("I also just moved to ...") without changing the fact.
_ADV_WORDS = (
    r"just|recently|currently|also|still|now|actually|really|truly|totally|absolutely|definitely|"
    r"finally|officially|kind\s+of|kinda|sort\s+of|mainly|even|honestly|literally|already|happily|"
    r"proudly|both|originally|presently|newly|only|primarily"
)
_ADV = rf"(?:{_ADV_WORDS})"
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
