"""Engram's application-facing API: configuration, data contracts, errors, the producer and the reader.

from engram_api import MemoryClient
client = MemoryClient()
receipt = client.enqueue("alice", "I just moved to Austin")
client.wait(receipt)
client.recall("alice", "where does the user live?")
"""

from engram_api.client import AsyncMemoryClient, MemoryClient
from engram_api.errors import (
    BackPressureError,
    ConfigError,
    EngramError,
    InvalidInputError,
    LLMError,
    NotFoundError,
    StoreUnavailableError,
    WaitTimeoutError,
)
from engram_api.models import (
    ChatMessage,
    DeadLetter,
    EntityRecord,
    Extraction,
    FactRecord,
    ForgetResult,
    GraphPage,
    HealthReport,
    RecallItem,
    RecallResult,
    Receipt,
    SearchResult,
    UserStats,
    WaitResult,
)
from engram_api.settings import Settings, load_settings

__all__ = [
    "AsyncMemoryClient",
    "BackPressureError",
    "ChatMessage",
    "ConfigError",
    "DeadLetter",
    "EngramError",
    "EntityRecord",
    "Extraction",
    "FactRecord",
    "ForgetResult",
    "GraphPage",
    "HealthReport",
    "InvalidInputError",
    "LLMError",
    "MemoryClient",
    "NotFoundError",
    "RecallItem",
    "RecallResult",
    "Receipt",
    "SearchResult",
    "Settings",
    "StoreUnavailableError",
    "UserStats",
    "WaitResult",
    "WaitTimeoutError",
    "load_settings",
]
