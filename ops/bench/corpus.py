"""Synthetic chat messages with scripted extractions (2-3 facts each), for ingest, recall and the seeds.

Deterministic: message ``i`` of a corpus seed is always the same text with the same extraction, in the
shape the LLM stand-in returns (see tests/support/extractions.py). Texts are plain first-person chat, so
the same corpus can be fed to other memory systems through their own write paths.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.extractions import entity, fact

__all__ = ["QUERIES", "Message", "messages", "queries", "vocabulary"]

NAMES = [
    "Maria",
    "Alex",
    "Jordan",
    "Priya",
    "Wei",
    "Omar",
    "Lena",
    "Tomas",
    "Aisha",
    "Noah",
    "Sofia",
    "Mateo",
    "Hana",
    "Ravi",
    "Chloe",
    "Felix",
    "Nadia",
    "Ivan",
    "Zoe",
    "Kenji",
    "Amara",
    "Lucas",
    "Ingrid",
    "Diego",
    "Yara",
    "Malik",
    "Elena",
    "Sam",
    "Farah",
    "Oskar",
    "Leila",
    "Marco",
    "Talia",
    "Emil",
    "Rosa",
    "Theo",
    "Mina",
    "Hugo",
    "Anya",
    "Pablo",
]
CITIES = [
    "Austin",
    "Denver",
    "Tampa",
    "Boston",
    "Seattle",
    "Lisbon",
    "Berlin",
    "Osaka",
    "Toronto",
    "Chicago",
    "Madrid",
    "Dublin",
    "Oslo",
    "Prague",
    "Vienna",
    "Nairobi",
    "Lima",
    "Sydney",
    "Portland",
    "Atlanta",
    "Phoenix",
    "Kyoto",
    "Munich",
    "Quebec",
    "Bristol",
    "Porto",
    "Krakow",
    "Hanoi",
    "Cairo",
    "Reno",
]
ORGS = [
    "Amazon",
    "Netflix",
    "Stripe",
    "Spotify",
    "Airbnb",
    "Shopify",
    "Siemens",
    "Toyota",
    "Pfizer",
    "Adobe",
    "Oracle",
    "Intel",
    "Nvidia",
    "Atlassian",
    "Zendesk",
    "Dropbox",
    "Canva",
    "Figma",
    "Slack",
    "Twilio",
    "Datadog",
    "Unity",
    "Lyft",
    "Etsy",
    "Reddit",
    "Pinterest",
    "Mozilla",
    "Nike",
    "Lego",
    "Ikea",
]
ROLES = [
    "data engineer",
    "product manager",
    "nurse",
    "teacher",
    "architect",
    "chef",
    "designer",
    "accountant",
    "pilot",
    "pharmacist",
    "software developer",
    "marketing lead",
    "researcher",
    "sales manager",
    "lawyer",
]
ACTIVITIES = [
    "hiking",
    "chess",
    "salsa dancing",
    "rock climbing",
    "pottery",
    "sailing",
    "birdwatching",
    "yoga",
    "bouldering",
    "kayaking",
    "photography",
    "gardening",
    "skiing",
    "surfing",
    "running",
    "cycling",
    "knitting",
    "painting",
    "fishing",
    "tennis",
    "swimming",
    "camping",
    "woodworking",
    "baking",
    "archery",
    "golf",
    "judo",
    "fencing",
    "rowing",
    "snowboarding",
]
FOODS = [
    "ramen",
    "tacos",
    "sushi",
    "lasagna",
    "pho",
    "falafel",
    "dumplings",
    "paella",
    "curry",
    "pierogi",
    "bibimbap",
    "ceviche",
    "shakshuka",
    "risotto",
    "tamales",
    "biryani",
    "gyoza",
    "moussaka",
    "poutine",
    "empanadas",
]
SKILLS = [
    "Spanish",
    "Japanese",
    "piano",
    "guitar",
    "Rust",
    "calligraphy",
    "sign language",
    "French",
    "carpentry",
    "statistics",
    "German",
    "the violin",
    "watercolor",
    "Portuguese",
    "Mandarin",
    "public speaking",
    "welding",
    "Korean",
    "the cello",
    "Italian",
]
VEHICLES = ["bike", "train", "bus", "car", "scooter", "ferry", "motorcycle", "tram"]
RELATIVES = ["sister", "brother", "cousin", "aunt", "uncle", "neighbor", "colleague", "roommate"]

T0 = datetime(2024, 1, 1, 9, 0, tzinfo=UTC)
QUERIES = (
    "Where does {name} live?",
    "What does the user do for work?",
    "Which hobbies does {name} enjoy?",
    "What food does the user like?",
    "What is the user learning these days?",
    "Who is the user's {relative}?",
    "How does the user get to work?",
    "What places has the user visited, like {city}?",
    "Does the user know anyone who likes {activity}?",
    "Tell me about the user's job at {org}.",
)


@dataclass(frozen=True)
class Message:
    index: int
    text: str
    timestamp: datetime
    extraction: dict[str, Any]


def _friend(r: random.Random) -> tuple[str, dict[str, Any]]:
    name, city, act = r.choice(NAMES), r.choice(CITIES), r.choice(ACTIVITIES)
    return (
        f"My friend {name} lives in {city} and is really into {act}.",
        {
            "entities": [entity("e1", name, "Person"), entity("e2", city, "City"), entity("e3", act, "Activity")],
            "facts": [
                fact("user", "HAS_FRIEND", "e1", f"User has a friend named {name}", importance=0.6),
                fact("e1", "LIVES_IN", "e2", f"{name} lives in {city}", single_valued=True),
                fact("e1", "LIKES", "e3", f"{name} is really into {act}"),
            ],
        },
    )


def _job(r: random.Random) -> tuple[str, dict[str, Any]]:
    org, role, vehicle = r.choice(ORGS), r.choice(ROLES), r.choice(VEHICLES)
    return (
        f"I started working at {org} as a {role}, and I commute by {vehicle}.",
        {
            "entities": [entity("e1", org, "Company"), entity("e2", vehicle, "Vehicle")],
            "facts": [
                fact("user", "WORKS_AT", "e1", f"User works at {org}", single_valued=True, importance=0.8),
                fact("user", "HAS_ROLE", None, f"User works as a {role}", single_valued=True, importance=0.7),
                fact("user", "COMMUTES_BY", "e2", f"User commutes by {vehicle}"),
            ],
        },
    )


def _tastes(r: random.Random) -> tuple[str, dict[str, Any]]:
    food, skill = r.choice(FOODS), r.choice(SKILLS)
    return (
        f"I really love {food}, and lately I have been learning {skill}.",
        {
            "entities": [entity("e1", food, "Food"), entity("e2", skill, "Skill")],
            "facts": [
                fact("user", "LIKES", "e1", f"User loves {food}"),
                fact("user", "LEARNING", "e2", f"User is learning {skill}", importance=0.6),
            ],
        },
    )


def _trip(r: random.Random) -> tuple[str, dict[str, Any]]:
    city, relative, name = r.choice(CITIES), r.choice(RELATIVES), r.choice(NAMES)
    return (
        f"Last weekend I visited {city} with my {relative} {name}.",
        {
            "entities": [entity("e1", city, "City"), entity("e2", name, "Person", aliases=[f"my {relative}"])],
            "facts": [
                fact("user", "VISITED", "e1", f"User visited {city} with {name}", memory_type="episodic"),
                fact("user", f"HAS_{relative.upper()}", "e2", f"User's {relative} is {name}", importance=0.7),
            ],
        },
    )


_KINDS = (_friend, _job, _tastes, _trip)


def messages(seed: str, count: int, *, start: datetime = T0, step: timedelta = timedelta(hours=6)) -> Iterator[Message]:
    """``count`` messages of one stream (e.g. one user); same seed, same messages."""
    for i in range(count):
        r = random.Random(f"{seed}:{i}")
        text, extraction = _KINDS[i % len(_KINDS)](r)
        yield Message(index=i, text=text, timestamp=start + step * i, extraction=extraction)


def queries(seed: str, count: int) -> list[str]:
    """Distinct recall queries (distinct, so that no result cache answers them)."""
    r = random.Random(f"queries:{seed}")
    out: dict[str, None] = {}
    while len(out) < count:
        template = r.choice(QUERIES)
        query = template.format(
            name=r.choice(NAMES),
            relative=r.choice(RELATIVES),
            city=r.choice(CITIES),
            activity=r.choice(ACTIVITIES),
            org=r.choice(ORGS),
        )
        if query in out:
            query = f"{query} ({r.choice(ACTIVITIES)}, {r.choice(FOODS)})"
        out[query] = None
    return list(out)


def vocabulary() -> dict[str, tuple[str, ...]]:
    """Entity vocabularies by label, for bulk-loaded graphs built without messages."""
    return {
        "Person": tuple(NAMES),
        "City": tuple(CITIES),
        "Company": tuple(ORGS),
        "Activity": tuple(ACTIVITIES),
        "Food": tuple(FOODS),
        "Skill": tuple(SKILLS),
    }
