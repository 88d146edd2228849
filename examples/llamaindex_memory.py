"""LlamaIndex with Engram (``pip install 'engram[llamaindex]'``): a ``SimpleChatEngine`` whose memory is an
``EngramMemory``: each session's turns, plus a system message with what Engram remembers from earlier
sessions. The second session's engine starts empty and still knows where the user lives and works.

    CHAT_MODEL=gpt-4o-mini python examples/llamaindex_memory.py   (with `engram up` running, or REDIS_URL set)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _model import complete
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)

from engram_api import MemoryClient
from engram_integrations.llamaindex import EngramMemory

USER = "cleo"
SESSIONS = {
    "li-1": ["Hi! I just moved to Austin for a new job.", "I work at Dell now, as a data engineer."],
    "li-2": ["Where do I live these days, and who do I work for?"],
}


class LiteLLM(CustomLLM):
    """Any LlamaIndex LLM does here (OpenAI, Anthropic...); this one calls litellm."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        answer = complete([{"role": m.role.value, "content": m.content or ""} for m in messages])
        return ChatResponse(message=ChatMessage(role="assistant", content=answer))

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=complete([{"role": "user", "content": prompt}]))

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        yield self.complete(prompt)


with MemoryClient() as client:
    for session_id, said in SESSIONS.items():
        memory = EngramMemory.from_defaults(client, USER, session_id, max_tokens=300)
        engine = SimpleChatEngine.from_defaults(llm=LiteLLM(), memory=memory)
        for text in said:
            print(f"[{session_id}] memory: {memory.memory.context(text, 300)!r}")
            print(f"[{session_id}] user: {text}\n[{session_id}] assistant: {engine.chat(text).response}")
        memory.memory.wait(timeout=240)  # only a demo waits: a chat app moves on
