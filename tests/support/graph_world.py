"""A bigger graph to compare whole answers on, for the graph-step and snapshot contract suites: a hub, a
dozen entities, random facts, a superseded single-valued slot and an archived fact (``build_world``);
the recall windows they are read through (``WINDOWS``); and ``said``, one message stored with its chunks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engram_api.models import ChatMessage, EntityRecord, Envelope, FactRecord
from engram_api.storage import GraphStore
from engram_api.storage.graph.episodes import chunk_envelope
from engram_api.storage.graph.fading import Fading
from tests.support.factories import at, make_entity, make_fact, plan, supersede, vec

FAR = 10_000
WINDOWS: list[dict[str, datetime | None]] = [
    {},
    {"as_of": at(25)},
    {"as_of": at(27)},
    {"as_of": at(29), "since": at(26)},
    {"since": at(27)},
    {"until": at(26)},
    {"since": at(25), "until": at(27)},
]


@dataclass
class World:
    entities: list[EntityRecord]
    facts: list[FactRecord]
    hub: str
    superseded: list[str]  # the old values of a single-valued slot, oldest first
    archived: str


def build_world(store: GraphStore, user: str, seed: int = 7) -> World:
    """A hub (the user's own node), 11 entities, 30 random facts with tied importances, a single-valued
    slot superseded twice, and a fact archived by decay."""
    store.fading = Fading(0.5, 0.01)
    rng = random.Random(seed)
    hub = make_entity(user, "Me")
    others = [make_entity(user, f"E{i}") for i in range(11)]
    entities = [hub, *others]
    facts = []
    for i in range(30):
        subject = hub if rng.random() < 0.3 else rng.choice(others)
        obj = rng.choice([None, *(e for e in entities if e.id != subject.id)])
        facts.append(
            make_fact(
                user,
                subject,
                f"REL{i}",
                obj,
                importance=rng.choice((0.2, 0.5, 0.5, 0.9)),
                valid_from=at(24 + rng.randint(0, 5)),
            )
        )
    store.apply(plan(user, "m1", at(24), entities=entities, facts=facts))
    city = [make_fact(user, others[0], "LIVES_IN", others[i], valid_from=at(22 + 2 * i), single_valued=True) for i in (1, 2, 3)]  # fmt: skip
    store.apply(plan(user, "m2", at(24), facts=[city[0]]))
    store.apply(plan(user, "m3", at(26), facts=[city[1]], fact_changes=[supersede(city[0], city[1])]))
    store.apply(plan(user, "m4", at(28), facts=[city[2]], fact_changes=[supersede(city[1], city[2])]))
    old = make_fact(user, others[4], "USED_TO", others[5], valid_from=at(0))
    store.apply(plan(user, "m5", at(0), facts=[old]))
    assert store.decay(user, now=at(30), batch=100)[1] == 1
    return World(entities, [*facts, *city, old], hub.id, [city[0].id, city[1].id], old.id)


def said(store: GraphStore, user: str, mid: str, texts: list[str], when: datetime, **planned: Any) -> list[str]:
    """One message of ``texts`` (a chunk each) applied with ``planned`` (entities, facts); its chunk ids."""
    envelope = Envelope(user_id=user, message_id=mid, messages=[ChatMessage(content=t) for t in texts], timestamp=when)
    chunks = [c.model_copy(update={"embedding": vec(c.id)}) for c in chunk_envelope(envelope)]
    store.apply(plan(user, mid, when, **planned).model_copy(update={"chunks": chunks}))
    return [c.id for c in chunks]
