"""A chat loop with long-term memory and no framework: every exchange is enqueued (returns at once) and
``get_context`` puts what Engram remembers into the next prompt. The second session starts with an empty
transcript and still knows where the user lives and works.

    CHAT_MODEL=gpt-4o-mini python examples/chat_loop.py   (with `engram up` running, or REDIS_URL set)
"""

from __future__ import annotations

from _model import complete

from engram_api import MemoryClient
from engram_api.models import Receipt

USER = "ana"
SESSIONS = {
    "loop-1": ["Hi! I just moved to Austin for a new job.", "I work at Dell now, as a data engineer."],
    "loop-2": ["Where do I live these days, and who do I work for?"],
}


def chat(client: MemoryClient, session_id: str, said: list[str]) -> list[Receipt]:
    transcript: list[dict[str, str]] = []  # this session only: what came before is Engram's to remember
    receipts = []
    for n, text in enumerate(said):
        memory = client.get_context(USER, text, max_tokens=300)
        system = f"You are a helpful assistant.\nWhat you remember about the user:\n{memory or '(nothing yet)'}"
        reply = complete([{"role": "system", "content": system}, *transcript, {"role": "user", "content": text}])
        exchange = [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        receipts.append(
            client.enqueue(
                USER, exchange, message_id=f"{session_id}-{n}", metadata={"session": session_id},
                earlier=transcript[-6:] or None,  # context for the extractor, never extracted from
            )
        )  # fmt: skip
        transcript += exchange
        print(f"[{session_id}] memory: {memory!r}\n[{session_id}] user: {text}\n[{session_id}] assistant: {reply}")
    return receipts


with MemoryClient() as client:
    first = chat(client, "loop-1", SESSIONS["loop-1"])
    client.wait(first, timeout=240)  # only a demo waits: a chat app moves on, the workers catch up
    chat(client, "loop-2", SESSIONS["loop-2"])
