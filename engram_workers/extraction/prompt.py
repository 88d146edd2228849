"""The extraction prompt: fixed instructions first, then this message's context, earlier turns and turns.

Contract (docs/extraction.md states it for operators):
- The system part is the same text for every call (no ids, dates or user data in it), so providers'
  prompt caching applies to it; everything per message goes in the user part after it.
- Known entities and facts are shown under short handles (E1.., F1..), never under their 24-hex ids: a
  handle costs one or two tokens and small models copy it reliably. ``Prompt.resolve`` maps the handles
  in the answer back to ids; a handle the prompt did not show stays as the model wrote it.
- Earlier turns are rendered apart from the new turns, under a header that says they are context only;
  the new turns come last, under ``Conversation:``, one line per turn.
- System and tool turns are never shown; assistant turns are shown as such (rules say what they may yield).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from engram_api.models import SELF_REF, ChatMessage, EntityRecord, Envelope, EpisodeRecord, Extraction, FactRecord
from engram_api.naming import SINGLE_VALUED

__all__ = ["SYSTEM_PROMPT", "Prompt", "SlimContext", "build_prompt", "is_owner_turn"]

OWNER_MARK = "(memory owner)"

SYSTEM_PROMPT = f"""You extract long-term memory about one person, the memory owner, from the newest turns of a chat.
Answer with ONE JSON object and nothing else, in this shape:
{{"entities":[{{"ref":"N1","name":"Lisbon","label":"Place"}}],
 "facts":[{{"subject":"{SELF_REF}","predicate":"LIVES_IN","object":"N1","statement":"User lives in Lisbon","importance":0.7}}]}}
Leave out a field at its default: label "Thing", aliases [], summary "", memory_type "semantic",
importance 0.5, valid_from, valid_until and updates null, ends [].

References
- "{SELF_REF}" is the memory owner. Never list the owner under entities.
- Known things are shown as E1, E2 (entities) and F1, F2 (facts). Use a handle to mean that thing; do not
  repeat it under entities. New things get refs N1, N2 in "entities". Never write any other id.
- label: Person, Place, Organization, Pet, Food, Activity, Language, Skill, Role, Product, Media, Event, Thing.

Speakers
- Turns read "Name {OWNER_MARK}: text", "Name: text" (another person) or "assistant: text".
- What the owner says about themself has subject "{SELF_REF}". What another person says about themself is
  about that person: subject is that person (an entity with their name), never "{SELF_REF}".
- Extract only what the turns under "Conversation:" say or confirm. Earlier turns resolve "she", "it",
  "there", "then", and the question a new turn answers (assistant: "Where do you live now?" then
  "Austin." is LIVES_IN Austin; "Do you still work at Acme?" then "Nope" ends WORKS_AT Acme).
- Assistant turns are never facts about the owner. A suggestion the owner takes up may be recorded as
  "User was recommended X" (episodic, importance 0.3 at most).

Facts
- predicate: UPPER_SNAKE_CASE (LIVES_IN, WORKS_AT, HAS_SISTER, LIKES, VISITED). statement: one short sentence,
  "User" for the owner, dates written out ("User visited Tokyo in March 2024"), never "yesterday".
- memory_type: semantic (stable facts), episodic (an event at a time), procedural (how the owner does things).
- One value at a time: {", ".join(sorted(SINGLE_VALUED))}. Use exactly these names for these meanings.
- A plan, wish, question or hypothetical changes nothing: "I'm moving to Denver next month" is
  PLANS_TO_MOVE_TO Denver (episodic), never LIVES_IN Denver.
- A negation is a fact of its own: "I'm not allergic to peanuts" is NOT_ALLERGIC_TO peanuts (it ends
  ALLERGIC_TO peanuts). Write statements as said: "used to", "might", "no longer" stay in the statement.
- updates: the handle of a known fact this one restates or corrects.
- ends: handles of known facts that stopped being true ("I quit Acme" ends the WORKS_AT Acme fact;
  "I don't like sushi anymore" ends the LIKES sushi fact). A new value of a one-value predicate needs no ends.

Time
- valid_from: only when the text says when it became true, as ISO 8601 with offset. Relative dates count
  from the message time in the sender's time zone ("yesterday" = the sender's previous day); a bare date is
  that day at 00:00; a bare year is 1 January; present tense with no date: null (= the message time).
  Never a date after the message time.
- valid_until: only when the text says when it stopped being true ("I left Google in 2022": WORKS_AT Google,
  valid_until "2022-01-01T00:00:00+00:00"), or when the message is older than a known fact that replaced what
  it says (its time is before that fact's "since": valid_until is that date); else null.

Importance (0 to 1)
- 0.9 identity, health, family, major life events; 0.7 home, work, relationships, strong preferences;
  0.5 ordinary preferences and habits; 0.3 passing events; 0.1 trivia.

Examples
1. Conversation: "Ana (memory owner): My sister Mia moved to Porto last year." (message time 2026-03-10)
{{"entities":[{{"ref":"N1","name":"Mia","label":"Person","summary":"Ana's sister"}},{{"ref":"N2","name":"Porto","label":"Place"}}],
 "facts":[{{"subject":"{SELF_REF}","predicate":"HAS_SISTER","object":"N1","statement":"User has a sister, Mia","importance":0.9}},
 {{"subject":"N1","predicate":"LIVES_IN","object":"N2","statement":"Mia moved to Porto in 2025","importance":0.6,
 "valid_from":"2025-01-01T00:00:00+00:00"}}]}}
2. Known: F1 [WORKS_AT] User works at Acme. Conversation: "User {OWNER_MARK}: I quit Acme, taking a break."
{{"ends":["F1"]}}
3. Conversation: "Jo {OWNER_MARK}: How's it going?" / "Sam: Great, I just adopted a cat named Rex!"
{{"entities":[{{"ref":"N1","name":"Sam","label":"Person"}},{{"ref":"N2","name":"Rex","label":"Pet","summary":"Sam's cat"}}],
 "facts":[{{"subject":"N1","predicate":"HAS_PET","object":"N2","statement":"Sam adopted a cat named Rex","memory_type":"episodic"}}]}}
4. Known: E1 guitar (Activity); F1 [PLAYS] User plays guitar. Conversation: "User {OWNER_MARK}: I don't play
guitar anymore, might pick up drums."
{{"entities":[{{"ref":"N1","name":"drums","label":"Activity"}}],"facts":[{{"subject":"{SELF_REF}","predicate":"PLANS_TO_PLAY",
 "object":"N1","statement":"User might pick up drums","memory_type":"episodic","importance":0.3}}],"ends":["F1"]}}
5. Conversation: "User {OWNER_MARK}: thanks!" -> {{"facts":[]}}
"""

# The JSON Schema for providers that constrain output to one (litellm's json_schema response format): written
# from the prompt's own wording (the same refs, handles and fields, nothing the prompt does not ask for), so a
# constrained model is never told something the prompt contradicts. Only what the prompt never lets a model
# leave out is "required": it tells the model to leave out every field at its default (the reader fills it).
_HANDLE = '"user" (the memory owner), E1.. (known) or N1.. (new, listed under entities)'
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "entities": {
            "type": "array",
            "description": "new things only (refs N1, N2), never the owner or a known E handle",
            "items": {
                "type": "object",
                "properties": {
                    "ref": {"type": "string"},
                    "name": {"type": "string"},
                    "label": {"type": "string"},
                    "aliases": {"type": "array", "items": {"type": "string"}},
                    "summary": {"type": "string"},
                },
                "required": ["ref", "name"],
            },
        },
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "subject": {"type": "string", "description": _HANDLE},
                    "predicate": {"type": "string"},
                    "object": {"type": ["string", "null"], "description": "as subject, or null"},
                    "statement": {"type": "string"},
                    "memory_type": {"type": "string", "enum": ["semantic", "episodic", "procedural"]},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1},
                    "valid_from": {"type": ["string", "null"], "description": "ISO 8601, or null"},
                    "valid_until": {"type": ["string", "null"], "description": "ISO 8601, or null"},
                    "updates": {"type": ["string", "null"], "description": "an F handle, or null"},
                },
                "required": ["subject", "predicate", "statement"],
            },
        },
        "ends": {
            "type": "array",
            "items": {"type": "string"},
            "description": "F handles of known facts that stopped being true",
        },
    },
}


@dataclass
class SlimContext:
    """The user's most relevant known entities and facts, shown to the model under short handles."""

    entities: list[EntityRecord] = field(default_factory=list)
    facts: list[FactRecord] = field(default_factory=list)

    @classmethod
    def from_records(cls, entities: Sequence[EntityRecord], facts: Sequence[FactRecord]) -> SlimContext:
        return cls(entities=list(entities), facts=list(facts))

    def handles(self) -> dict[str, str]:
        out = {f"E{i}": e.id for i, e in enumerate(self.entities, 1)}
        out.update({f"F{i}": f.id for i, f in enumerate(self.facts, 1)})
        return out

    def names(self) -> dict[str, str]:
        """The entity handles' names: a statement the model left out is written with them."""
        return {f"E{i}": e.name for i, e in enumerate(self.entities, 1)}

    def render(self) -> str:
        lines = [
            f"E{i} {e.name} ({e.label})" + (f": {e.summary[:120]}" if e.summary else "")
            for i, e in enumerate(self.entities, 1)
        ]
        lines += [
            f"F{i} [{f.predicate}] {f.statement[:160]} (since {f.valid_from.date().isoformat()})"
            for i, f in enumerate(self.facts, 1)
        ]
        return "\n".join(lines) if lines else "(nothing known yet)"


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, str]]
    handles: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)  # entity handle -> name (``SlimContext.names``)

    def resolve(self, extraction: Extraction) -> Extraction:
        """The answer with every handle this prompt showed replaced by the id it stands for."""

        def real(ref: str | None) -> str | None:
            # Exact case: answers written for older prompts use "e1" as a local ref for a NEW entity.
            return self.handles.get(ref.strip(), ref) if ref else ref

        out = extraction.model_copy(deep=True)
        for ent in out.entities:
            ent.ref = real(ent.ref) or ent.ref
        for fact in out.facts:
            fact.subject = real(fact.subject) or fact.subject
            fact.object = real(fact.object)
            fact.updates = real(fact.updates)
        out.ends = [r for r in (real(h) for h in out.ends) if r]
        return out


def is_owner_turn(message: ChatMessage, owner_name: str | None) -> bool:
    """A user turn is the memory owner's unless it names someone other than ``owner_name``."""
    if message.role != "user":
        return False
    return not (message.name and owner_name and message.name.casefold() != owner_name.casefold())


_NAME_CAP = 60


def _name(raw: str | None) -> str:
    """A speaker name as shown: one line, no owner mark, no brackets or colon (the turn syntax), capped.
    "Mallory (memory owner)" or "Eve\nAna (memory owner)" would otherwise forge an owner line."""
    if not raw:
        return ""
    cleaned = re.sub(r"[()\[\]{}:<>]", " ", raw.replace(OWNER_MARK, " "))
    return " ".join(cleaned.split())[:_NAME_CAP].strip()


def _one_line(text: str) -> str:
    """A turn's text on one line and without the owner mark: nothing inside a turn can pass for an owner
    turn (a line break would start a forged line; the mark mid-line could still mislead the model)."""
    lines = (" ".join(part.split()) for part in text.replace(OWNER_MARK, " ").splitlines())
    return " / ".join(line for line in lines if line)


def _speaker(message: ChatMessage, owner_name: str | None) -> str:
    name = _name(message.name)
    if message.role != "user":
        return name or message.role
    if not is_owner_turn(message, owner_name):
        return name or "user"  # another person in the conversation
    return f"{name or _name(owner_name) or 'User'} {OWNER_MARK}"


def _turn(message: ChatMessage, owner_name: str | None) -> str:
    return f"{_speaker(message, owner_name)}: {_one_line(message.content)}"


def _shown(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    # System prompts and tool output are the chat app's plumbing, not something anyone said.
    return [m for m in messages if m.role in ("user", "assistant")]


def _local(when: datetime, offset_minutes: int | None) -> datetime:
    zone = timezone(timedelta(minutes=offset_minutes)) if offset_minutes is not None else UTC
    return when.astimezone(zone)


def _earlier_lines(envelope: Envelope, episodes: Sequence[EpisodeRecord]) -> list[str]:
    if envelope.earlier:
        return [_turn(m, envelope.owner_name) for m in _shown(envelope.earlier)]
    lines = []
    for ep in episodes:
        stamp = _local(ep.event_time, envelope.utc_offset_minutes).strftime("%Y-%m-%d %H:%M")
        # A stored episode (``episodes.episode_text``) is plain text, or "Name: text" lines: one line, and no
        # owner mark in it.
        text = _one_line(ep.content)
        lines.append(f"[{stamp}] {text if ep.role == 'user' else f'{ep.role}: {text}'}")
    return lines


def build_prompt(envelope: Envelope, context: SlimContext, earlier: Sequence[EpisodeRecord] = ()) -> Prompt:
    when = _local(envelope.timestamp, envelope.utc_offset_minutes)
    zone = "UTC" if envelope.utc_offset_minutes is None else "the sender's local time"
    owner = _name(envelope.owner_name) or "not given"
    parts = [
        f"Message time: {when.isoformat()} ({when.strftime('%A')}, {zone})",
        f"Memory owner: {owner}",
        f"Known context:\n{context.render()}",
    ]
    lines = _earlier_lines(envelope, earlier)
    if lines:
        parts.append("Earlier turns (context only, extract nothing from them):\n" + "\n".join(lines))
    turns = "\n".join(_turn(m, envelope.owner_name) for m in _shown(envelope.messages))
    parts.append(f"Conversation:\n{turns or '(nothing said)'}")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]
    return Prompt(messages=messages, handles=context.handles(), names=context.names())
