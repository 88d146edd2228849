"""LlamaIndex: a chat memory backed by Engram (``engram[llamaindex]``), for chat engines and agents.

Invariants:
- ``get(input)`` is what the LLM sees: a system message with Engram's ``get_context`` for ``input`` (what
  earlier sessions left, extracted and ranked; left out when there is nothing), then this session's turns.
  Without ``input`` (chat engines put the user's message first, then call ``get()``) the query is the
  session's last user turn. It makes no LLM call.
- ``put`` enqueues each message as one Engram message (``ConversationMemory.add``; the session's previous
  turns go along as context for the extractor). User, assistant and system messages only; another role is
  an ``InvalidInputError`` and nothing is enqueued.
- ``reset`` forgets this session's messages in Engram; ``set`` is a reset followed by a ``put`` of each
  message, so the session is exactly those messages.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import ConfigDict
from llama_index.core.memory.types import BaseMemory

from engram_api import MemoryClient
from engram_api.errors import InvalidInputError
from engram_integrations.conversation import ConversationMemory

__all__ = ["EngramMemory"]

_ROLES = {MessageRole.USER: "user", MessageRole.ASSISTANT: "assistant", MessageRole.SYSTEM: "system"}
CONTEXT_HEADER = "What you remember about the user from earlier conversations:"


class EngramMemory(BaseMemory):
    """One session's turns plus Engram's long-term memory of the user."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: ConversationMemory
    max_tokens: int = 800  # the context block's budget

    @classmethod
    def class_name(cls) -> str:
        return "EngramMemory"

    @classmethod
    def from_defaults(  # type: ignore[override]
        cls, client: MemoryClient, user_id: str, session_id: str, *, max_tokens: int = 800, **kwargs: Any
    ) -> EngramMemory:
        return cls(memory=ConversationMemory(client, user_id, session_id, **kwargs), max_tokens=max_tokens)

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        query = input or next((t["content"] for t in reversed(self.memory.turns) if t["role"] == "user"), "")
        context = self.memory.context(query, self.max_tokens) if query else ""
        head = [ChatMessage(role=MessageRole.SYSTEM, content=f"{CONTEXT_HEADER}\n{context}")] if context else []
        return head + self.get_all()

    def get_all(self) -> list[ChatMessage]:
        return [ChatMessage(role=MessageRole(turn["role"]), content=turn["content"]) for turn in self.memory.turns]

    def put(self, message: ChatMessage) -> None:
        role = _ROLES.get(message.role)
        if role is None:
            raise InvalidInputError("message.role", f"a {message.role.value!r} message is not remembered")
        self.memory.add([{"role": role, "content": message.content or ""}])

    def set(self, messages: list[ChatMessage]) -> None:
        self.reset()
        for message in messages:
            self.put(message)

    def reset(self) -> None:
        self.memory.forget()
