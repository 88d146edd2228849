"""The extraction prompt: instructions, the output schema, and slim context from the user's graph.

Slim context (ids, names, summaries, predicates of the most similar existing entities and facts) lets
the model point at what it already knows ("updates": a fact id, an entity ref equal to an existing id)
instead of minting duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from engram_api.models import SELF_REF, EntityRecord, Envelope, Extraction, FactRecord

__all__ = ["SlimContext", "build_messages"]

_SYSTEM = f"""You extract long-term memory from one chat message as a knowledge graph.
Return ONLY a JSON object matching this JSON schema:
{json.dumps(Extraction.model_json_schema(), separators=(",", ":"))}
Rules:
- The person whose memory this is is the subject "{SELF_REF}"; do not list them as an entity.
- One entity per real-world thing, with a short label (Person, Place, Organization, Pet, Food, Activity,
  Language, Skill, Role, Product, Event, Concept, Thing) and aliases it is also called.
- Facts are subject-predicate-object; predicate in UPPER_SNAKE_CASE (LIVES_IN, WORKS_AT, HAS_BROTHER, LIKES);
  "statement" restates the fact as a short sentence about "User"; single_valued=true when a new value
  replaces the old one (where someone lives, works, their job title, spouse, age).
- memory_type: semantic (stable facts), episodic (events at a time), procedural (how the user does things).
- importance 0..1; valid_from only when the text says when it became true (ISO 8601 with timezone).
- If an entity is already known (see context), use its id as the entity ref; if a fact restates or
  replaces a known fact, set "updates" to that fact's id.
- Nothing worth remembering: return {{"entities": [], "facts": []}}.
"""


class SlimContext(BaseModel):
    entities: list[dict[str, str]]
    facts: list[dict[str, str]]

    @classmethod
    def from_records(cls, entities: Sequence[EntityRecord], facts: Sequence[FactRecord]) -> SlimContext:
        return cls(
            entities=[{"id": e.id, "name": e.name, "label": e.label, "summary": e.summary[:120]} for e in entities],
            facts=[{"id": f.id, "predicate": f.predicate, "statement": f.statement[:160]} for f in facts],
        )


def build_messages(envelope: Envelope, context: SlimContext, now: datetime | None = None) -> list[dict[str, str]]:
    when = (now or envelope.timestamp).isoformat()
    conversation = "\n".join(f"{m.role}: {m.content}" for m in envelope.messages)
    user = f"Message time: {when}\nKnown context: {context.model_dump_json()}\nConversation:\n{conversation}"
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]
