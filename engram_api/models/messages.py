"""A message's contracts on its way through the pipeline: what a producer puts on the queue
(``Envelope``) and gets back (``Receipt``), where it stands (``MessageState``), how a stage run ended
(``StageOutcome``, ``StageResult``), a dead letter, what the model calls cost (``Usage``), and the
extraction schema: the one model an extractor (LLM or rules) must return (``Extraction``).

Invariants: an envelope carries everything the workers need and nothing more, and its optional fields
default so that envelopes queued by older producers still load; model output is untrusted, so every
string and list of the extraction schema has a bound and unknown keys are ignored, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engram_api.models.base import MessageId, UserId, _Model, utcnow

__all__ = [
    "SELF_REF",
    "ChatMessage",
    "DeadLetter",
    "Envelope",
    "ExtractedEntity",
    "ExtractedFact",
    "Extraction",
    "MemoryType",
    "MessageState",
    "Receipt",
    "StageOutcome",
    "StageResult",
    "Usage",
    "WaitResult",
]

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
