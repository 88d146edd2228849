"""LangChain with Engram (``pip install 'engram[langchain]'``): ``RunnableWithMessageHistory`` keeps each
session's transcript in an ``EngramChatMessageHistory`` (every exchange also goes to Engram), and an
``EngramRetriever`` fills the prompt with what earlier sessions left. The second session starts empty and
still knows where the user lives and works.

    CHAT_MODEL=gpt-4o-mini python examples/langchain_history.py   (with `engram up` running, or REDIS_URL set)
"""

from __future__ import annotations

from typing import Any

from _model import complete
from langchain_core.language_models import SimpleChatModel
from langchain_core.messages import BaseMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory

from engram_api import MemoryClient
from engram_integrations import ConversationMemory
from engram_integrations.langchain import EngramChatMessageHistory, EngramRetriever

USER = "ben"
SESSIONS = {
    "lc-1": ["Hi! I just moved to Austin for a new job.", "I work at Dell now, as a data engineer."],
    "lc-2": ["Where do I live these days, and who do I work for?"],
}
_ROLES = {"human": "user", "ai": "assistant", "system": "system"}


class LiteLLMChat(SimpleChatModel):
    """Any LangChain chat model does here (ChatOpenAI, ChatAnthropic...); this one calls litellm."""

    def _call(self, messages: list[BaseMessage], stop: list[str] | None = None, **kwargs: Any) -> str:
        return complete([{"role": _ROLES[m.type], "content": m.text} for m in messages])

    @property
    def _llm_type(self) -> str:
        return "litellm"


client = MemoryClient()
retriever = EngramRetriever(client=client, user_id=USER, k=5)
histories: dict[str, EngramChatMessageHistory] = {}


def history(session_id: str) -> EngramChatMessageHistory:
    if session_id not in histories:
        histories[session_id] = EngramChatMessageHistory(ConversationMemory(client, USER, session_id))
    return histories[session_id]


def remembered(inputs: dict[str, Any]) -> str:
    memory = "\n".join(doc.page_content for doc in retriever.invoke(inputs["input"]))
    print(f"[{inputs['session']}] memory: {memory!r}")
    return memory or "(nothing yet)"


prompt = ChatPromptTemplate.from_messages(
    [
        ("system", "You are a helpful assistant.\nWhat you remember about the user:\n{memory}"),
        MessagesPlaceholder("history"),
        ("human", "{input}"),
    ]
)
chain = RunnablePassthrough.assign(memory=remembered) | prompt | LiteLLMChat()
chat = RunnableWithMessageHistory(chain, history, input_messages_key="input", history_messages_key="history")

for session_id, said in SESSIONS.items():
    for text in said:
        reply = chat.invoke({"input": text, "session": session_id}, {"configurable": {"session_id": session_id}})
        print(f"[{session_id}] user: {text}\n[{session_id}] assistant: {reply.text}")
    history(session_id).memory.wait(timeout=240)  # only a demo waits: a chat app moves on
client.close()
