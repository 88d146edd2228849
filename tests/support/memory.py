"""Build a user's memory in the test process through the apply stage's own write (no workers needed)."""

from __future__ import annotations

from datetime import datetime

from engram_api import MemoryClient
from engram_api.models import Usage
from engram_api.producer import build_envelope
from engram_api.storage.userwrite import UserWrite
from engram_workers.extraction.rules import extract_rules
from engram_workers.stages.apply import write_extraction


def apply_in_process(client: MemoryClient, user: str, message_id: str, text: str, when: datetime) -> None:
    """What the apply stage does for one message (offline rules): ``write_extraction`` inside the user's
    fenced ``UserWrite``, so the graph, the FAISS index and the published stamp move together."""
    reader = client.reader
    envelope = build_envelope(client.settings, user, text, message_id=message_id, timestamp=when)
    extraction = extract_rules(text, event_time=when)
    usage = Usage(prompt_tokens=100, completion_tokens=20, cost_usd=0.0005, llm_calls=1)

    def write(w: UserWrite) -> None:
        write_extraction(
            write=w, graph=client.graph, embedder=reader.embedder, middleware=(),
            envelope=envelope, extraction=extraction, usage=usage,
        )  # fmt: skip

    reader.writes.run(user, write, wait=30.0)
