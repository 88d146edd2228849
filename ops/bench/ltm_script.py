"""Scripted extractions for the user messages of engram-ltm's sample_20 cases: what a good LLM would
return, written by hand once so that the "scripted" rows of the quality benchmark are deterministic.

Each entry: message text -> facts as (subject, PREDICATE, object name or None, object label, statement,
replaces). The subject is "user" or the name of an entity listed as an object in the same message.
Messages not listed here extract nothing (small talk, requests).

``replaces`` says the fact takes the place of the subject's earlier value of that predicate. Engram ignores a
model's ``single_valued`` flag (docs/extraction.md): a predicate on ``naming.SINGLE_VALUED`` supersedes by
itself, and for any other a model that follows the prompt names the earlier fact's handle in ``updates``. The
script does the same: it reads the ``F<n> [PREDICATE]`` lines of the prompt's known context.
"""

from __future__ import annotations

import re
from typing import Any

from engram_api.naming import SINGLE_VALUED
from tests.support.extractions import entity, fact

_KNOWN_FACT = re.compile(r"^(F\d+) \[([A-Z_]+)\]", re.MULTILINE)

FactRow = tuple[str, str, str | None, str, str, bool]

SCRIPT: dict[str, list[FactRow]] = {
    "I live in Tampa, Florida with my family.": [("user", "LIVES_IN", "Tampa", "City", "User lives in Tampa, Florida", True)],
    "I've been thinking about moving to Texas for a while now.": [("user", "CONSIDERING_MOVE_TO", "Texas", "Place", "User is thinking about moving to Texas", False)],
    "I just moved to Austin last week. The city is absolutely amazing!": [("user", "LIVES_IN", "Austin", "City", "User lives in Austin", True)],
    "I work at Google as a software engineer on the search team.": [
        ("user", "WORKS_AT", "Google", "Organization", "User works at Google", True),
        ("user", "HAS_ROLE", None, "Role", "User is a software engineer on the search team", True)],
    "I got a compelling job offer from Netflix and I'm seriously considering it.": [("user", "HAS_OFFER_FROM", "Netflix", "Organization", "User has a job offer from Netflix", False)],
    "I accepted the Netflix offer and started there this Monday. Loving it so far.": [("user", "WORKS_AT", "Netflix", "Organization", "User works at Netflix", True)],
    "I've been dating my girlfriend Sarah for three years now.": [("user", "RELATIONSHIP_STATUS", None, "Status", "User is dating Sarah", True)],
    "I proposed to Sarah last night at dinner and she said yes!": [("user", "RELATIONSHIP_STATUS", None, "Status", "User is engaged to Sarah", True)],
    "Sarah and I just got married last weekend. We are officially husband and wife now.": [("user", "RELATIONSHIP_STATUS", None, "Status", "User is married to Sarah", True)],
    "I run every morning for fitness. Usually five miles before work.": [("user", "EXERCISES_BY", "running", "Activity", "User goes running every morning for fitness", True)],
    "I hurt my knee and the doctor said I need to stop running for several months.": [("user", "HAS_INJURY", "knee injury", "Condition", "User hurt their knee", False)],
    "I switched to cycling after the knee injury. Honestly I enjoy it more than running.": [("user", "EXERCISES_BY", "cycling", "Activity", "User does cycling for fitness", True)],
    "I am majoring in computer science at USF.": [("user", "STUDIES", "computer science", "Field", "User majors in computer science at USF", True)],
    "I have decided to switch my major to data science. It aligns better with my career goals.": [("user", "STUDIES", "data science", "Field", "User majors in data science", True)],
    "I just got a golden retriever puppy named Max. He is so energetic and adorable!": [("user", "HAS_PET", "Max", "Pet", "User has a golden retriever puppy named Max", False)],
    "I grew up in Chicago but moved to Florida for college and never looked back.": [
        ("user", "BORN_IN", "Chicago", "City", "User grew up in Chicago", True),
        ("user", "LIVES_IN", "Florida", "Place", "User lives in Florida", True)],
    "Italian food is my absolute favorite. I could eat pasta and pizza every single day.": [("user", "FAVORITE_CUISINE", "Italian food", "Food", "User's favorite cuisine is Italian food", True)],
    "I mainly code in Python. I use it for all my machine learning projects at work.": [("user", "PRIMARY_LANGUAGE", "Python", "Language", "User mainly codes in Python", True)],
    "Dune by Frank Herbert is my all-time favorite novel. I have read it four times.": [("user", "FAVORITE_BOOK", "Dune", "Book", "User's favorite book is Dune by Frank Herbert", True)],
    "My brother Alex is also in the tech industry. He has always been great with computers.": [("user", "HAS_BROTHER", "Alex", "Person", "User's brother is Alex, who works in tech", False)],
    "Alex got a job offer from Amazon and accepted it. He starts next month.": [("Alex", "HAS_OFFER_FROM", "Amazon", "Organization", "Alex accepted a job offer from Amazon", False)],
    "Alex started at Amazon this week. He is working on the logistics engineering team.": [("Alex", "WORKS_AT", "Amazon", "Organization", "Alex works at Amazon on the logistics engineering team", True)],
    "I have started learning Spanish. Using Duolingo and attending weekly classes.": [("user", "LEARNING", "Spanish", "Language", "User is learning Spanish", False)],
    "My Spanish is improving a lot. I can hold basic conversations now.": [("user", "SPANISH_LEVEL", None, "Skill", "User can hold basic conversations in Spanish", True)],
    "I just passed my Spanish intermediate level exam. So proud of this achievement!": [("user", "SPANISH_LEVEL", None, "Skill", "User passed the Spanish intermediate exam", True)],
    "I just signed a lease on a new two-bedroom apartment near campus.": [("user", "LIVES_IN", "apartment near campus", "Place", "User leased a two-bedroom apartment near campus", True)],
    "I am looking for a roommate to help split the rent on my new apartment.": [("user", "LOOKING_FOR", None, "Goal", "User is looking for a roommate", False)],
    "My friend Jordan moved in last weekend as my roommate. We get along great.": [("user", "HAS_ROOMMATE", "Jordan", "Person", "User's roommate is their friend Jordan", True)],
    "I have been working on a startup idea in the edtech space for several months.": [("user", "WORKS_ON", "startup", "Organization", "User is working on an edtech startup", False)],
    "We launched our MVP and got our first fifty paying customers this week.": [("user", "STARTUP_STATUS", None, "Status", "User's startup launched its MVP with fifty paying customers", True)],
    "We just closed our seed round and raised five hundred thousand dollars from angel investors.": [("user", "STARTUP_STATUS", None, "Status", "User's startup raised seed funding of $500,000", True)],
    "I am planning a trip to Japan next spring. I have wanted to go for years.": [("user", "TRIP_TO", "Japan", "Country", "User is planning a trip to Japan", False)],
    "I am in Japan right now! Tokyo is absolutely amazing and the food is incredible.": [("user", "VISITED", "Japan", "Country", "User is visiting Japan and finds Tokyo amazing", False)],
    "Just got back from Japan. It was the best trip of my life. I loved every single moment there.": [("user", "OPINION_OF_TRIP", "Japan", "Country", "User loved the Japan trip, the best of their life", True)],
    "I had a great weekend hiking with my family in the mountains.": [("user", "LIKES", "hiking", "Activity", "User went hiking in the mountains with family", False)],
    "I work as a software engineer at a tech company in San Francisco.": [("user", "HAS_ROLE", None, "Role", "User is a software engineer at a tech company in San Francisco", True)],
    "I spent Sunday morning at the park reading and then had brunch with friends.": [("user", "LIKES", "reading", "Activity", "User spent Sunday reading at the park and had brunch with friends", False)],
    "I live in Austin. The neighborhood is very walkable and I love it.": [("user", "LIVES_IN", "Austin", "City", "User lives in Austin, in a walkable neighborhood", True)],
}  # fmt: skip

# The superseded value of each knowledge-update case: it must not be in the context (our annotation).
STALE = {"ku_001": "Tampa", "ku_002": "Google", "ku_003": "dating", "ku_004": "running", "ku_005": "computer science"}


def extraction_for(text: str, prompt: str = "") -> dict[str, Any]:
    """The scripted answer to ``text``; ``prompt`` (the user part Engram sent) supplies the handles of the
    known facts a replacing fact ``updates``."""
    rows = SCRIPT.get(text, [])
    names = {obj: label for _, _, obj, label, _, _ in rows if obj}
    refs = {name: f"e{i}" for i, name in enumerate(names, start=1)}
    known = {predicate: handle for handle, predicate in _KNOWN_FACT.findall(prompt)}
    facts = []
    for subject, predicate, obj, _, statement, replaces in rows:
        row = fact(refs.get(subject, subject), predicate, refs.get(obj) if obj else None, statement)
        if replaces and predicate not in SINGLE_VALUED and predicate in known:
            row["updates"] = known[predicate]
        facts.append(row)
    return {"entities": [entity(refs[name], name, label) for name, label in names.items()], "facts": facts}
