"""Engram under the frameworks chat apps are built on (optional extras: ``engram[langchain]``,
``engram[llamaindex]``).

``ConversationMemory`` is the framework-free core: one conversation session's turns, each exchange enqueued
as one Engram message, and ``context`` for the prompt. The adapters wrap it and import their framework only
when imported themselves (this package imports neither):

- ``engram_integrations.langchain``: ``EngramChatMessageHistory`` (langchain-core's ``BaseChatMessageHistory``)
  and ``EngramRetriever`` (a ``BaseRetriever`` over recall);
- ``engram_integrations.llamaindex``: ``EngramMemory`` (llama-index-core's ``BaseMemory``).
"""

from engram_integrations.conversation import ConversationMemory

__all__ = ["ConversationMemory"]
