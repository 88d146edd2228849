"""What the graph store holds and how a write changes it: records (``EpisodeRecord``, ``ChunkRecord``,
``EntityRecord``, ``FactRecord``, ``ClusterRecord``), an edit of one (``FactChange``, ``EntityChange``), the
``WritePlan`` one message's consolidation decides, and the rows the stores answer for the indexes
(``KeywordHit``, ``VectorItem``).

Invariants: every record carries its id, its owner and its timestamps; a store that already holds a plan's
episode applies nothing (``WritePlan`` is idempotent by (user_id, episode.id)); when a fact holds is
defined once, in ``storage.graph.validity`` (``FactRecord.current_at`` asks it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from engram_api.models.base import _Model, utcnow
from engram_api.models.messages import MemoryType, Usage

__all__ = [
    "ApplyOutcome",
    "ChunkRecord",
    "ClusterRecord",
    "EntityChange",
    "EntityRecord",
    "EpisodeRecord",
    "FactChange",
    "FactRecord",
    "KeywordHit",
    "Record",
    "StoredEpisode",
    "VectorItem",
    "WritePlan",
]


class Record(_Model):
    model_config = ConfigDict(extra="ignore")
    id: str
    user_id: str
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class EpisodeRecord(Record):
    """The raw message, kept as provenance; its id is the message id."""

    content: str
    role: str = "user"
    event_time: datetime
    metadata: dict[str, str | int | float | bool] = Field(default_factory=dict)


class ChunkRecord(Record):
    """One recallable piece of an episode: a whole short message, or a run of sentences of a long one.

    ``text`` is what was said; ``speaker`` is who said it (a name when the message carries one, else the
    role). ``fact_ids`` (filled on reads) are the facts extracted from the chunk's episode. ``token_states``:
    its own words' packed token states from its vector's pass (``storage.embedding.states``; base64 in
    JSON), set with ``embedding`` at apply and by the re-embedding pass, omitted on reads as it is."""

    model_config = ConfigDict(extra="ignore", ser_json_bytes="base64", val_json_bytes="base64")

    episode_id: str
    seq: int = Field(ge=0)
    text: str
    speaker: str
    role: str = "user"
    event_time: datetime
    embedding: list[float] | None = None
    token_states: bytes | None = None
    fact_ids: list[str] = Field(default_factory=list)

    @property
    def indexed_text(self) -> str:
        """What is embedded and keyword-indexed: the speaker's name travels with the words."""
        return self.text if self.speaker == self.role else f"{self.speaker}: {self.text}"

    @property
    def conversation_order(self) -> tuple[datetime, str, int]:
        """The sort key of the conversation's order (the stores' ORDER BY event_time, episode_id, seq)."""
        return (self.event_time, self.episode_id, self.seq)


class KeywordHit(_Model):
    """One BM25 hit of the user's keyword index (higher score = better match)."""

    node_id: str
    kind: Literal["episode", "fact"]
    score: float


class StoredEpisode(EpisodeRecord):
    """An episode as stored, with the facts and entities it is a source of (what export writes, import
    restores)."""

    fact_ids: list[str] = Field(default_factory=list)
    entity_ids: list[str] = Field(default_factory=list)


class EntityRecord(Record):
    name: str
    norm_name: str
    label: str = "Thing"
    aliases: list[str] = Field(default_factory=list)
    summary: str = ""
    embedding: list[float] | None = None


class FactRecord(Record):
    model_config = ConfigDict(extra="ignore", ser_json_bytes="base64", val_json_bytes="base64")

    subject_id: str
    subject_name: str = ""
    predicate: str
    object_id: str | None = None
    object_name: str | None = None
    statement: str
    memory_type: MemoryType = "semantic"
    importance: float = 0.5
    strength: float = 1.0
    single_valued: bool = False
    valid_from: datetime
    valid_until: datetime | None = None
    superseded_by: str | None = None
    archived: bool = False
    last_decay_at: datetime | None = None
    source_ids: list[str] = Field(default_factory=list)
    embedding: list[float] | None = None
    token_states: bytes | None = None  # its statement's packed token states (as ChunkRecord's), on writes only

    def current_at(self, at: datetime | None) -> bool:
        """Valid at ``at``; current (valid at now) when None: ``storage.graph.validity`` defines both."""
        # Imported here: the storage package imports this module first.
        from engram_api.storage.graph.validity import instant, valid_at

        return valid_at(self.valid_from, self.valid_until, self.archived, instant(at))


class FactChange(_Model):
    """An edit of an existing fact's validity (supersession)."""

    id: str
    valid_until: datetime | None
    superseded_by: str | None


class EntityChange(_Model):
    id: str
    add_aliases: list[str] = Field(default_factory=list)
    summary: str | None = None
    label: str | None = None


class WritePlan(_Model):
    """Everything one message changes, decided by consolidation and applied in ONE transaction.

    Idempotent by (user_id, episode.id): a store that already holds the episode applies nothing.
    """

    user_id: str
    episode: EpisodeRecord
    new_entities: list[EntityRecord] = Field(default_factory=list)
    entity_changes: list[EntityChange] = Field(default_factory=list)
    new_facts: list[FactRecord] = Field(default_factory=list)
    fact_changes: list[FactChange] = Field(default_factory=list)
    reinforced_fact_ids: list[str] = Field(default_factory=list)
    mentioned_entity_ids: list[str] = Field(default_factory=list, description="provenance links")
    chunks: list[ChunkRecord] = Field(default_factory=list, description="the episode's recallable pieces")
    chunk_context: Literal["none", "other_turn", "prev_turn", "dated"] | None = Field(
        None,
        description="what the chunks' vectors were made from beside their words (ENGRAM_CHUNK_EMBED_CONTEXT), "
        "recorded with each chunk; None: not known (a restore), so the re-embedding pass redoes them",
    )
    linked_fact_ids: list[str] = Field(
        default_factory=list, description="provenance links to stored facts without reinforcing them (restore)"
    )
    usage: Usage = Field(default_factory=Usage)


class ApplyOutcome(_Model):
    applied: bool
    version: int


class ClusterRecord(Record):
    label: str
    summary: str
    member_fact_ids: list[str] = Field(default_factory=list)
    member_entity_ids: list[str] = Field(default_factory=list)
    centroid: list[float] = Field(default_factory=list)
    signature: str = ""


class VectorItem(_Model):
    """One row of a user's vector index, as the graph store holds it (source of truth for rebuilds), with
    its record's packed token states when it has them (``storage.embedding.states``)."""

    node_id: str
    kind: Literal["fact", "entity", "episode"]
    embedding: list[float]
    states: bytes | None = None
