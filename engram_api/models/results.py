"""What a recall answers and the vocabulary it scores in: the five score components
(``ScoreComponents``, ``SCORE_COMPONENTS``) that results, feedback rows and weight learning all embed, the
weights over them (``Weights``, ``LearnedWeights``), and the results themselves (``RecallResult`` of
``RecallItem``, ``SearchResult`` of ``ClusterHit``).

Invariants: ``SCORE_COMPONENTS`` and ``WEIGHT_FIELDS`` are the fields of their models in declaration
order, the one order every score vector is read in; a weight is never negative.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from engram_api.models.base import _Model, utcnow
from engram_api.models.messages import MemoryType

if TYPE_CHECKING:
    from engram_api.settings import Settings

__all__ = [
    "SCORE_COMPONENTS",
    "WEIGHT_FIELDS",
    "Channel",
    "ClusterHit",
    "FeedbackRow",
    "LearnedWeights",
    "RecallItem",
    "RecallResult",
    "ScoreBreakdown",
    "ScoreComponents",
    "SearchResult",
    "Weights",
]

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
        " records, late (the second look's late interaction, when it ran), fusion; cache alone for a cached result",
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
