"""What the management calls answer: a page of a user's graph (``GraphPage``), a user's counts
(``UserStats``), what a forget removed (``ForgetResult``) or an import restored (``ImportResult``), and the
health report (``HealthReport`` of ``CheckResult``).

Invariant: these are answers only; nothing here is written to a store or put on the queue.
"""

from __future__ import annotations

from pydantic import Field

from engram_api.models.base import _Model
from engram_api.models.messages import Usage
from engram_api.models.records import EntityRecord, FactRecord

__all__ = ["CheckResult", "ForgetResult", "GraphPage", "HealthReport", "ImportResult", "UserStats"]


class GraphPage(_Model):
    user_id: str
    page: int
    page_size: int
    total_facts: int
    facts: list[FactRecord]
    entities: list[EntityRecord]


class UserStats(_Model):
    user_id: str
    entities: int = 0
    facts: int = 0
    current_facts: int = 0
    superseded_facts: int = 0
    archived_facts: int = 0
    episodes: int = 0
    episode_chunks: int = 0
    keyword_entries: int = Field(0, description="episode chunks and fact statements in the keyword index")
    clusters: int = 0
    version: int = 0
    usage: Usage = Field(default_factory=Usage)


class ForgetResult(_Model):
    user_id: str
    episodes: int = 0
    facts: int = 0
    entities: int = 0
    vectors: int = 0
    removed_fact_ids: list[str] = Field(default_factory=list)
    removed_entity_ids: list[str] = Field(default_factory=list)
    removed_chunk_ids: list[str] = Field(default_factory=list)


class ImportResult(_Model):
    """What ``engram import`` / ``MemoryClient.import_memory`` restored."""

    user_id: str
    episodes: int = Field(description="messages restored now")
    skipped: int = Field(description="messages already stored (a resumed import)")
    entities: int
    facts: int
    version: int


class CheckResult(_Model):
    ok: bool
    detail: str = ""
    latency_ms: float = 0.0


class HealthReport(_Model):
    ok: bool
    checks: dict[str, CheckResult]
