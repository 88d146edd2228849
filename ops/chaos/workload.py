"""The messages a chaos scenario sends and how they are sent: a workload whose every message leaves facts
no other message of its user leaves, scripted through the LLM stand-in, and a paced producer.

Invariants:

- a message applied twice shows up as a duplicate (its fact is new to its user), never as a reinforcement;
- nouns repeat within a user, so entity resolution runs under load;
- ``moves`` LIVES_IN messages per user are in event-time order, so the user's final chain must follow it
  whatever order the fleet applied them in (``Workload.order_violations``);
- every message's scripted extraction says what the graph must hold once it is applied: its episode, and
  each of its facts stored once and linked to that episode (``Workload.graph_mismatches``); a dead-lettered
  message left no episode.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from engram_api import MemoryClient
from engram_api.models import FactRecord, Receipt
from engram_testing import Reply
from tests.support.extractions import entity, fact, lives_in, message_text

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
# Verbs x nouns give statements far enough apart (cosine < 0.93) that consolidation keeps them as
# separate facts: a message applied twice then shows up as a duplicate instead of a reinforcement.
_VERBS = [
    ("COLLECTS", "collects", "collect"),
    ("REPAIRS", "repairs", "repair"),
    ("PAINTS", "paints", "paint"),
    ("STUDIES", "studies", "study"),
]
_NOUNS = ["vintage stamps", "old bicycles", "mountain landscapes", "jazz records", "sourdough bread",
          "chess openings", "tropical orchids", "pocket watches"]  # fmt: skip
_CITIES = ["Tampa", "Austin", "Denver", "Portland", "Chicago", "Boston", "Seattle", "Phoenix"]


@dataclass(frozen=True)
class Message:
    user_id: str
    message_id: str
    text: str
    timestamp: datetime
    city: str | None = None  # set for LIVES_IN moves

    def item(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "messages": self.text, "message_id": self.message_id,
                "timestamp": self.timestamp}  # fmt: skip


class Workload:
    """Messages for ``users`` users, ``per_user`` each, in event-time order per user.

    Every message yields facts no other message of its user yields (so a double apply is visible), nouns
    repeat across a user's messages (so entity resolution runs under load), and ``moves`` messages per
    user are single-valued LIVES_IN moves whose final chain must follow event time.
    """

    def __init__(self, tag: str, *, users: int, per_user: int, moves: int = 0) -> None:
        if per_user > len(_VERBS) * len(_NOUNS) + moves or moves > len(_CITIES):
            raise ValueError("per_user or moves too large for the statement vocabulary")
        self.messages: list[Message] = []
        self.extractions: dict[str, dict[str, Any]] = {}
        step = max(1, per_user // max(1, moves)) if moves else 0
        for u in range(users):
            user = f"chaos-{tag}-u{u:03d}"
            move_slots = {i * step for i in range(moves)}
            facts_done = 0
            for n in range(per_user):
                ts = T0 + timedelta(minutes=n)
                if n in move_slots:
                    city = _CITIES[len([m for m in move_slots if m < n])]
                    text = f"Update {n} from {user}. I moved to {city}."
                    self.extractions[text] = lives_in(city)
                    self.messages.append(Message(user, f"{user}-m{n:03d}", text, ts, city))
                    continue
                (predicate, verb, infinitive), noun = (
                    _VERBS[facts_done % len(_VERBS)],
                    _NOUNS[facts_done // len(_VERBS)],
                )
                facts_done += 1
                text = f"Update {n} from {user}. I {infinitive} {noun}."
                self.extractions[text] = {
                    "entities": [entity("e1", noun.title(), "Hobby")],
                    "facts": [fact("user", predicate, "e1", f"User {verb} {noun}")],
                }
                self.messages.append(Message(user, f"{user}-m{n:03d}", text, ts))

    @property
    def users(self) -> list[str]:
        return sorted({m.user_id for m in self.messages})

    def reply(self, request: dict[str, Any]) -> Reply | None:
        """The stand-in's scripted answer for one of our messages (None: not ours)."""
        extraction = self.extractions.get(message_text(request).strip())
        return Reply.json(extraction) if extraction is not None else None

    def order_violations(self, client: MemoryClient, applied: set[str]) -> list[str]:
        """Users whose LIVES_IN chain is not the applied moves in event-time order with only the last current."""
        bad = []
        for user in self.users:
            moves = sorted((m for m in self.messages if m.user_id == user and m.city), key=lambda m: m.timestamp)
            expected = [(m.city, m.timestamp, [m.message_id]) for m in moves if m.message_id in applied]
            chain = client.graph.history(user, "user", "LIVES_IN")
            got = [(f.object_name, f.valid_from, f.source_ids) for f in chain]
            linked = all(
                a.valid_until == b.valid_from and a.superseded_by == b.id for a, b in itertools.pairwise(chain)
            )
            if got != expected or not linked or (chain and chain[-1].valid_until is not None):
                bad.append(user)
        return bad

    def graph_mismatches(self, client: MemoryClient, applied: set[str], dead: set[str]) -> list[str]:
        """Messages of this workload the graph disagrees with, each with what is wrong: an applied message
        must have its episode, and each fact of its scripted extraction stored exactly once (one fact with
        that statement for the user) with the message among its sources and linked from its episode; a
        dead-lettered message must have no episode. Read through the store's public reads, per user."""
        problems = []
        by_user: dict[str, list[Message]] = defaultdict(list)
        for m in self.messages:
            by_user[m.user_id].append(m)
        for user, messages in by_user.items():
            episodes = {e.id: e for e in client.graph.episodes(user)}
            statements: dict[str, list[FactRecord]] = defaultdict(list)
            for f in all_facts(client, user):
                statements[f.statement].append(f)
            for m in messages:
                episode = episodes.get(m.message_id)
                if m.message_id in dead:
                    if episode is not None:
                        problems.append(f"{m.message_id}: dead-lettered, yet its episode is stored")
                    continue
                if m.message_id not in applied:
                    continue
                if episode is None:
                    problems.append(f"{m.message_id}: applied, no episode")
                    continue
                for wanted in self.extractions[m.text]["facts"]:
                    copies = statements.get(wanted["statement"], [])
                    stated = [f for f in copies if m.message_id in f.source_ids and f.id in episode.fact_ids]
                    if len(copies) != 1 or len(stated) != 1:
                        problems.append(
                            f"{m.message_id}: {wanted['statement']!r} stored {len(copies)}x, "
                            f"{len(stated)}x from this message"
                        )
        return problems


def all_facts(client: MemoryClient, user: str) -> list[FactRecord]:
    page, facts = 1, []
    while True:
        batch = client.graph.page(user, page, 1000)
        facts += batch.facts
        if len(facts) >= batch.total_facts or not batch.facts:
            return facts
        page += 1


def enqueue_paced(
    client: MemoryClient,
    messages: Sequence[Message],
    receipts: list[Receipt],
    *,
    seconds: float,
    on_error: Callable[[Message, Exception, int], float | None] | None = None,
) -> None:
    """Enqueue ``messages`` spread over ``seconds``, appending to ``receipts`` as they go (monitors read it).

    ``on_error(message, exc, attempt)`` returns a pause before retrying the same message, or None to raise.
    """
    gap = seconds / max(1, len(messages))
    start = time.monotonic()
    for i, message in enumerate(messages):
        attempt = 0
        while True:
            try:
                receipts.append(client.enqueue(**message.item()))
                break
            except Exception as exc:
                attempt += 1
                pause = on_error(message, exc, attempt) if on_error else None
                if pause is None:
                    raise
                time.sleep(pause)
        lag = start + (i + 1) * gap - time.monotonic()
        if lag > 0:
            time.sleep(lag)
