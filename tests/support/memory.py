"""Build a user's memory in the test process through the apply stage's own planner (no workers needed)."""

from __future__ import annotations

from datetime import datetime

from engram_api import MemoryClient
from engram_api.models import Usage
from engram_api.producer import build_envelope
from engram_workers.consolidation import plan_message
from engram_workers.extraction.rules import extract_rules


def apply_in_process(client: MemoryClient, user: str, message_id: str, text: str, when: datetime) -> None:
    """What the apply stage does for one message: plan it against the store (offline rules), write it,
    move the user's FAISS index along."""
    reader = client.reader
    envelope = build_envelope(client.settings, user, text, message_id=message_id, timestamp=when)
    before = client.graph.user_version(user)
    planned = plan_message(
        envelope=envelope, extraction=extract_rules(text, event_time=when),
        usage=Usage(prompt_tokens=100, completion_tokens=20, cost_usd=0.0005, llm_calls=1),
        graph=client.graph, embedder=reader.embedder, index=reader.keeper.current(user, before),
    )  # fmt: skip
    outcome = client.graph.apply(planned.plan)
    reader.keeper.advance(user, from_version=before, to_version=outcome.version, upserts=planned.upserts)
