"""Scripted extraction answers for the LLM stand-in, chosen by the message text in the prompt."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any


def message_text(request: Mapping[str, Any]) -> str:
    """The conversation text Engram put into the prompt (after 'Conversation:'). Content given as parts
    (Anthropic's wire format: ``[{"type": "text", "text": ...}]``) is joined."""
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    if isinstance(user, list):
        user = "".join(str(part.get("text", "")) for part in user if isinstance(part, Mapping))
    convo = user.split("Conversation:\n", 1)[-1]
    return "\n".join(line.split(": ", 1)[-1] for line in convo.splitlines())


def fact(subject: str, predicate: str, obj: str | None, statement: str, **extra: Any) -> dict[str, Any]:
    return {"subject": subject, "predicate": predicate, "object": obj, "statement": statement, **extra}


def entity(ref: str, name: str, label: str = "Thing", **extra: Any) -> dict[str, Any]:
    return {"ref": ref, "name": name, "label": label, **extra}


def lives_in(city: str) -> dict[str, Any]:
    return {
        "entities": [entity("e1", city, "City")],
        "facts": [fact("user", "LIVES_IN", "e1", f"User lives in {city}", single_valued=True, importance=0.8)],
    }


def as_json(extraction: Mapping[str, Any]) -> str:
    return json.dumps(extraction)


Responder = Callable[[Mapping[str, Any]], Any]
