"""Data contracts shared by producer, workers, stores and reader (pydantic at every boundary).

Three families live here:
- wire models: what a producer puts on the queue (``Envelope``) and gets back (``Receipt``);
- the extraction schema: the one model an extractor (LLM or rules) must return (``Extraction``);
- records and results: what the stores hold (``EntityRecord``, ``FactRecord``, ...) and what the reader
  returns (``RecallResult``, ...). Every record carries its id, its owner and its timestamps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from engram_api.errors import InvalidInputError

if TYPE_CHECKING:
    from engram_api.settings import Settings

USER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")
MESSAGE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


# history() answers the latest HISTORY_LIMIT facts unless asked for more; at most HISTORY_MAX_LIMIT, so
# one call never materializes a long-lived subject's whole past.
HISTORY_LIMIT = 100
HISTORY_MAX_LIMIT = 1000

# What one enqueued message may carry besides its text: the producer checks these for Python callers, the
# gateway's request models declare them, so an oversized body fails validation after bounded work.
META_KEYS = 50
META_KEY_CHARS = 64
META_VALUE_CHARS = 1_000

# The scope name of fleet-wide learned weights; no user may be called this.
GLOBAL_SCOPE = "global"


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_user_id(value: object, field: str = "user_id") -> str:
    """Fail closed: a missing, empty or odd user id never reaches a store or a key."""
    if not isinstance(value, str):
        raise InvalidInputError(field, f"must be a string, got {type(value).__name__}")
    if not USER_ID_RE.fullmatch(value):
        raise InvalidInputError(
            field,
            "must be 1-128 characters of letters, digits, '_', '.', '@' or '-', starting with a "
            f"letter or digit (got {value[:40]!r})",
        )
    if value == GLOBAL_SCOPE:
        raise InvalidInputError(field, f"{GLOBAL_SCOPE!r} is reserved")
    return value


def check_message_id(value: object, field: str = "message_id") -> str:
    if not isinstance(value, str) or not MESSAGE_ID_RE.fullmatch(value):
        raise InvalidInputError(
            field, f"must be 1-128 characters of letters, digits, '_', '.', ':', '@' or '-' (got {str(value)[:40]!r})"
        )
    return value


def check_aware(value: datetime | None, field: str = "timestamp") -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(field, "must be timezone-aware (e.g. datetime.now(timezone.utc))")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInputError(field, "is out of range once converted to UTC") from None


UserId = Annotated[str, AfterValidator(check_user_id)]
MessageId = Annotated[str, AfterValidator(check_message_id)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


# ----------------------------------------------------------------------------------------------- wire


class ChatMessage(_Model):
    role: Literal["user", "assistant", "system", "tool"] = "user"
    content: str
    name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="the speaker's display name (a user turn whose name is not the envelope's owner_name "
        "is another person talking)",
    )


class Envelope(_Model):
    """One conversation message as it travels the queue; everything the workers need, nothing more."""

    user_id: UserId
    message_id: MessageId
    messages: list[ChatMessage]
    timestamp: datetime
    metadata: dict[str, str | int | float | bool] = Field(default_factory=dict)
    enqueued_at: datetime = Field(default_factory=utcnow)
    # Extraction context (all optional, so envelopes queued by older producers still load).
    owner_name: str | None = Field(None, min_length=1, max_length=100, description="the memory owner's name")
    earlier: list[ChatMessage] = Field(
        default_factory=list,
        max_length=20,
        description="earlier turns shown to the extractor to resolve references; never extracted from",
    )
    utc_offset_minutes: int | None = Field(
        None, ge=-840, le=840, description="the sender's UTC offset, so 'yesterday' is the sender's yesterday"
    )

    @property
    def text(self) -> str:
        return "\n".join(m.content for m in self.messages)


class Receipt(_Model):
    user_id: str
    message_id: str
    task_id: str
    duplicate: bool = False


class MessageState(StrEnum):
    QUEUED = "queued"
    EXTRACTED = "extracted"
    APPLIED = "applied"
    DEAD = "dead"


class StageOutcome(StrEnum):
    """How one run of a pipeline stage ended: the ``outcome`` label of ``engram_messages_total`` and of
    the stage's log line. Metrics count these values; the free text is in ``StageResult.detail``."""

    LLM = "llm"  # extract: the model's extraction stored and handed to apply
    RULES = "rules"  # extract: the offline rule extractor's, stored and handed over
    TRIVIAL = "trivial"  # extract: nothing worth remembering (no model call), handed over empty
    RE_HANDED = "re-handed"  # extract: an extraction was already stored, apply asked again
    WAITING = "waiting"  # extract: an earlier message of the user holds its turn; this one is sent again after it
    APPLIED = "applied"  # apply: written to the graph and the index
    SENT_BACK = "sent-back"  # apply: the stored extraction is gone, the message goes back to extract
    ALREADY = "already"  # the message was finished (applied or dead) before this run
    FORGOTTEN = "forgotten"  # forgotten meanwhile: this run wrote nothing
    DEAD_LETTERED = "dead-lettered"  # given up on: the dead letter holds the reason


@dataclass(frozen=True, slots=True)
class StageResult:
    """What a stage returns: the outcome, and a detail for people (facts kept, the dead letter's reason)."""

    outcome: StageOutcome
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.outcome.value}: {self.detail}" if self.detail else self.outcome.value


class WaitResult(_Model):
    applied: list[str] = Field(default_factory=list)
    dead_lettered: list[str] = Field(default_factory=list)
    pending: list[str] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.pending


class DeadLetter(_Model):
    user_id: str
    message_id: str
    stage: Literal["extract", "apply"]
    reason: str
    raw_llm: str | None = None
    attempts: int = 0
    failed_at: datetime = Field(default_factory=utcnow)
    envelope: Envelope | None = Field(None, description="kept so an operator can replay the message")


class Usage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    llm_calls: int = 0


# ------------------------------------------------------------------------------------ extraction schema

MemoryType = Literal["semantic", "episodic", "procedural"]
SELF_REF = "user"  # how an extractor refers to the person whose memory this is


class _ModelOutput(BaseModel):
    """Model answers may carry extra keys ("confidence", ...): ignored, never stored, never fatal."""

    model_config = ConfigDict(extra="ignore")


# Model output is untrusted: every string and list in it has a bound (refs and ids are short tokens).
_Ref = Annotated[str, Field(min_length=1, max_length=128)]
_Alias = Annotated[str, Field(max_length=200)]


class ExtractedEntity(_ModelOutput):
    ref: _Ref = Field(description="local reference used by facts, or the id of a context entity to update")
    name: str = Field(min_length=1, max_length=200)
    label: str = Field("Thing", max_length=100)
    aliases: list[_Alias] = Field(default_factory=list, max_length=20)
    summary: str = Field("", max_length=1000)


class ExtractedFact(_ModelOutput):
    subject: _Ref = Field(description="entity ref, or 'user' for the speaker")
    predicate: str = Field(min_length=1, max_length=100)
    object: _Ref | None = Field(None, description="entity ref, or None for an attribute-only fact")
    statement: str = Field(min_length=1, max_length=1000, description="the fact as a sentence")
    memory_type: MemoryType = "semantic"
    importance: float = Field(0.5, ge=0.0, le=1.0)
    valid_from: datetime | None = Field(None, description="when it became true, if the text says")
    valid_until: datetime | None = Field(None, description="when it stopped being true, if it has")
    single_valued: bool = Field(
        False, description="a new value replaces the old; honoured only for naming.SINGLE_VALUED predicates"
    )
    updates: _Ref | None = Field(None, description="id of a context fact this one restates or replaces")

    @field_validator("valid_from", "valid_until")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        # A model that writes "2024-01-05" means a date, not a local time somewhere: read it as UTC.
        if value is None:
            return None
        try:
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError:
            raise ValueError("the date is out of range") from None


class Extraction(_Model):
    """The one output schema of every extractor."""

    model_config = ConfigDict(extra="ignore")
    entities: list[ExtractedEntity] = Field(default_factory=list, max_length=100)
    facts: list[ExtractedFact] = Field(default_factory=list, max_length=100)
    ends: list[str] = Field(
        default_factory=list, max_length=50, description="ids of context facts that stopped being true"
    )


# -------------------------------------------------------------------------------------------- records


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
    role). ``fact_ids`` (filled on reads) are the facts extracted from the chunk's episode."""

    episode_id: str
    seq: int = Field(ge=0)
    text: str
    speaker: str
    role: str = "user"
    event_time: datetime
    embedding: list[float] | None = None
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


# -------------------------------------------------------------------------------------------- scoring


class ScoreComponents(_Model):
    """The five components of a recall score: the one vocabulary of scoring, results (``ScoreBreakdown``),
    feedback rows and weight learning, which all embed this model. ``SCORE_COMPONENTS`` is their order."""

    similarity: float = 0.0
    graph: float = 0.0
    strength: float = 0.0
    recency: float = 0.0
    importance: float = 0.0

    def values(self) -> list[float]:
        return [getattr(self, name) for name in SCORE_COMPONENTS]


SCORE_COMPONENTS: tuple[str, ...] = tuple(ScoreComponents.model_fields)


class Weights(_Model):
    """One non-negative weight per score component, declared in ``SCORE_COMPONENTS`` order (the names are
    the settings'): score = alpha*similarity + beta*graph + gamma*strength + the two boosts."""

    alpha: float = Field(ge=0, description="weight of similarity")
    beta: float = Field(ge=0, description="weight of graph proximity")
    gamma: float = Field(ge=0, description="weight of strength")
    recency_weight: float = Field(ge=0, description="weight of recency")
    importance_weight: float = Field(ge=0, description="weight of importance")

    @classmethod
    def from_settings(cls, settings: Settings) -> Weights:
        return cls(**{name: getattr(settings, name) for name in WEIGHT_FIELDS})

    @classmethod
    def of(cls, weights: Weights) -> Weights:
        """Just the weights of a subclass (e.g. ``LearnedWeights``)."""
        return cls(**{name: getattr(weights, name) for name in WEIGHT_FIELDS})

    def values(self) -> list[float]:
        """In ``SCORE_COMPONENTS`` order."""
        return [getattr(self, name) for name in WEIGHT_FIELDS]


WEIGHT_FIELDS: tuple[str, ...] = tuple(Weights.model_fields)


class LearnedWeights(Weights):
    scope: str = Field(description="'global' or a user id")
    samples: int
    quality: float = Field(description="held-out ranking AUC of the fitted model")
    fitted_at: datetime = Field(default_factory=utcnow)


class FeedbackRow(ScoreComponents):
    """The score components of one recalled item and whether the user found it useful."""

    user_id: str
    recall_id: str
    fact_id: str
    useful: bool
    created_at: datetime = Field(default_factory=utcnow)


class VectorItem(_Model):
    """One row of a user's vector index, as the graph store holds it (source of truth for rebuilds)."""

    node_id: str
    kind: Literal["fact", "entity", "episode"]
    embedding: list[float]


# -------------------------------------------------------------------------------------------- results


class ScoreBreakdown(ScoreComponents):
    rrf: float = 0.0
    total: float = 0.0


Channel = Literal["fact_vector", "episode_vector", "keyword", "graph", "source", "extracted", "window"]


class RecallItem(_Model):
    """One recalled memory. ``kind`` says what it is: an extracted ``fact`` (``statement`` is the fact,
    ``current`` says whether it still holds) or an ``episode`` excerpt (``statement`` is what ``speaker``
    said at ``event_time``; ``id`` is the chunk id, ``source_ids`` its message id). ``channels`` lists
    what found it: a retrieval channel, or ``source`` / ``extracted`` / ``window`` when it came along
    with a hit (a fact's source episode, an episode's facts, a neighbouring turn)."""

    id: str = Field(
        description="the fact or excerpt id: pass it to `feedback(useful_ids=...)` or `forget` "
        "(an excerpt's id forgets the message it comes from)"
    )
    kind: Literal["fact", "episode", "cluster"] = Field(default="fact", description="what the item is")
    statement: str = Field(description="the fact as a sentence, or the excerpt's words")
    memory_type: MemoryType
    subject: str = Field(description="subject entity name")
    predicate: str = Field(description="relation, e.g. LIVES_IN")
    object: str | None = Field(description="object entity name, if any")
    entities: list[str] = Field(description="names of the entities the fact mentions")
    valid_from: datetime
    valid_until: datetime | None = Field(description="None while the fact holds")
    event_time: datetime = Field(description="when it was said (the source message's time)")
    current: bool = Field(description="true when the fact holds now (or at `as_of`)")
    speaker: str | None = Field(default=None, description="who said an excerpt (None for facts)")
    source_ids: list[str] = Field(description="ids of the messages that stated it")
    channels: list[Channel] = Field(default_factory=list, description="what found it (see above)")
    path: Literal["vector", "graph", "both", "keyword", "linked"] = Field(description="how it was found")
    hops: int = Field(description="graph steps from a seed entity (0 = a fact on the seed itself)")
    score: float = Field(description="final score (higher is better)")
    breakdown: ScoreBreakdown = Field(description="the score's components")


class RecallResult(_Model):
    recall_id: str = Field(description="pass to `feedback`")
    user_id: str
    query: str
    as_of: datetime | None = Field(None, description="the time recalled at (None = now)")
    items: list[RecallItem] = Field(description="best first")
    weights: str = Field("configured", description="configured | learned:<scope>")
    cached: bool = Field(False, description="served from the reader's cache")
    timings_ms: dict[str, float] = Field(
        default_factory=dict,
        description="per step, in milliseconds: embed, catchup (the wait after embed for a catch-up of the"
        " reader's copies after a write, when one ran), index, faiss, keyword (the wait left after embed), graph,"
        " records, fusion; cache alone for a cached result",
    )


class ClusterHit(_Model):
    id: str
    label: str
    summary: str
    score: float
    member_fact_ids: list[str]


class SearchResult(_Model):
    user_id: str
    query: str
    level: Literal["broad", "detailed"]
    clusters: list[ClusterHit] = Field(default_factory=list)
    facts: list[RecallItem] = Field(default_factory=list)
    note: str = Field("", description="why the level differs from the one asked for, if it does")


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
