"""Data contracts shared by producer, workers, stores and reader (pydantic at every boundary).

Every contract is imported from here (``from engram_api.models import Envelope``); each lives in the module
of its boundary:
- ``base``: the id rules (``check_user_id``, ``UserId``, ...), the size limits and the base model;
- ``messages``: what a producer puts on the queue (``Envelope``) and gets back (``Receipt``), a message's
  state and stage results, dead letters, and the extraction schema: the one model an extractor (LLM or
  rules) must return (``Extraction``);
- ``records``: what the stores hold (``EntityRecord``, ``FactRecord``, ...) and the ``WritePlan`` that
  changes them. Every record carries its id, its owner and its timestamps;
- ``results``: the score vocabulary and what the reader returns (``RecallResult``, ...);
- ``admin``: what the management calls return (``GraphPage``, ``UserStats``, ``HealthReport``, ...).
"""

from __future__ import annotations

from engram_api.models.admin import (
    CheckResult,
    ForgetResult,
    GraphPage,
    HealthReport,
    ImportResult,
    UserStats,
)
from engram_api.models.base import (
    GLOBAL_SCOPE,
    HISTORY_LIMIT,
    HISTORY_MAX_LIMIT,
    MESSAGE_ID_RE,
    META_KEY_CHARS,
    META_KEYS,
    META_VALUE_CHARS,
    USER_ID_RE,
    MessageId,
    UserId,
    check_aware,
    check_message_id,
    check_user_id,
    utcnow,
)
from engram_api.models.messages import (
    SELF_REF,
    ChatMessage,
    DeadLetter,
    Envelope,
    ExtractedEntity,
    ExtractedFact,
    Extraction,
    MemoryType,
    MessageState,
    Receipt,
    StageOutcome,
    StageResult,
    Usage,
    WaitResult,
)
from engram_api.models.records import (
    ApplyOutcome,
    ChunkRecord,
    ClusterRecord,
    EntityChange,
    EntityRecord,
    EpisodeRecord,
    FactChange,
    FactRecord,
    KeywordHit,
    Record,
    StoredEpisode,
    VectorItem,
    WritePlan,
)
from engram_api.models.results import (
    SCORE_COMPONENTS,
    WEIGHT_FIELDS,
    Channel,
    ClusterHit,
    FeedbackRow,
    LearnedWeights,
    RecallItem,
    RecallResult,
    ScoreBreakdown,
    ScoreComponents,
    SearchResult,
    Weights,
)

__all__ = [
    "GLOBAL_SCOPE",
    "HISTORY_LIMIT",
    "HISTORY_MAX_LIMIT",
    "MESSAGE_ID_RE",
    "META_KEYS",
    "META_KEY_CHARS",
    "META_VALUE_CHARS",
    "SCORE_COMPONENTS",
    "SELF_REF",
    "USER_ID_RE",
    "WEIGHT_FIELDS",
    "ApplyOutcome",
    "Channel",
    "ChatMessage",
    "CheckResult",
    "ChunkRecord",
    "ClusterHit",
    "ClusterRecord",
    "DeadLetter",
    "EntityChange",
    "EntityRecord",
    "Envelope",
    "EpisodeRecord",
    "ExtractedEntity",
    "ExtractedFact",
    "Extraction",
    "FactChange",
    "FactRecord",
    "FeedbackRow",
    "ForgetResult",
    "GraphPage",
    "HealthReport",
    "ImportResult",
    "KeywordHit",
    "LearnedWeights",
    "MemoryType",
    "MessageId",
    "MessageState",
    "RecallItem",
    "RecallResult",
    "Receipt",
    "Record",
    "ScoreBreakdown",
    "ScoreComponents",
    "SearchResult",
    "StageOutcome",
    "StageResult",
    "StoredEpisode",
    "Usage",
    "UserId",
    "UserStats",
    "VectorItem",
    "WaitResult",
    "Weights",
    "WritePlan",
    "check_aware",
    "check_message_id",
    "check_user_id",
    "utcnow",
]
