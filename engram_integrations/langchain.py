"""LangChain: a chat message history backed by Engram, and a retriever over recall (``engram[langchain]``).

Invariants:
- ``EngramChatMessageHistory.messages`` is this session's transcript; ``add_messages`` enqueues the
  messages it is given as ONE Engram message (``ConversationMemory.add``), so ``RunnableWithMessageHistory``
  (which adds a human message and the model's answer together) writes one message per exchange.
- Only human, AI and system messages are remembered (Engram's ``user``, ``assistant`` and ``system`` turns);
  another kind is an ``InvalidInputError`` naming it, and nothing is enqueued.
- ``clear`` forgets this session's messages in Engram, not only the transcript.
- ``EngramRetriever`` makes no LLM call: one ``recall``, each item a ``Document`` (its statement) whose
  metadata says what it is (id, kind, score, when it was said, whether it still holds).
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from engram_api import MemoryClient
from engram_api.errors import InvalidInputError
from engram_integrations.conversation import ConversationMemory

__all__ = ["EngramChatMessageHistory", "EngramRetriever"]

_ROLES: dict[str, type[BaseMessage]] = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
_BY_TYPE = {"human": "user", "ai": "assistant", "system": "system"}


class EngramChatMessageHistory(BaseChatMessageHistory):
    """One session's chat history; every exchange also goes to Engram as long-term memory."""

    def __init__(self, memory: ConversationMemory) -> None:
        self.memory = memory

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [_ROLES[turn["role"]](content=turn["content"]) for turn in self.memory.turns]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        turns = []
        for i, message in enumerate(messages):
            role = _BY_TYPE.get(message.type)
            if role is None:
                raise InvalidInputError(f"messages[{i}]", f"a {message.type!r} message is not remembered")
            turns.append({"role": role, "content": message.text})
        self.memory.add(turns)

    def clear(self) -> None:
        self.memory.forget()


class EngramRetriever(BaseRetriever):
    """The user's memories that bear on the query (``MemoryClient.recall``), best first."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: MemoryClient
    user_id: str
    k: int = 5

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        result = self.client.recall(self.user_id, query, self.k)
        return [
            Document(
                page_content=item.statement,
                metadata={
                    "id": item.id,
                    "kind": item.kind,
                    "score": item.score,
                    "event_time": item.event_time.isoformat(),
                    "current": item.current,
                },
            )
            for item in result.items
        ]
