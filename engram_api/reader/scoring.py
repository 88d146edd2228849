"""Recall scoring: the composite score of one candidate (reciprocal-rank fusion is in ``fusion``).

composite = alpha*similarity + beta*hop_decay**hops + gamma*strength + recency_w*recency + importance_w*importance
where recency = 2 ** (-age_days / half_life). Weights come from settings or, once the maintenance job has
learned them from feedback, from the store (per user, else global).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from engram_api.models import GLOBAL_SCOPE, LearnedWeights, ScoreBreakdown
from engram_api.settings import Settings
from engram_api.storage.base import GraphStore

__all__ = ["Components", "WeightSource", "Weights", "effective_weights", "score"]


WeightSource = Literal["configured", "learned:user", "learned:global"]


class Weights(BaseModel):
    """The scoring weights: alpha*similarity + beta*graph + gamma*strength (+ recency, importance boosts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(ge=0)
    beta: float = Field(ge=0)
    gamma: float = Field(ge=0)
    recency_weight: float = Field(ge=0)
    importance_weight: float = Field(ge=0)

    @classmethod
    def from_settings(cls, settings: Settings) -> Weights:
        return cls(
            alpha=settings.alpha,
            beta=settings.beta,
            gamma=settings.gamma,
            recency_weight=settings.recency_weight,
            importance_weight=settings.importance_weight,
        )

    @classmethod
    def from_learned(cls, learned: LearnedWeights) -> Weights:
        return cls(
            alpha=learned.alpha,
            beta=learned.beta,
            gamma=learned.gamma,
            recency_weight=learned.recency_weight,
            importance_weight=learned.importance_weight,
        )

    def as_array(self) -> np.ndarray:
        """In feedback component order: similarity, graph, strength, recency, importance."""
        return np.array(
            [self.alpha, self.beta, self.gamma, self.recency_weight, self.importance_weight], dtype=np.float64
        )


def effective_weights(graph: GraphStore, settings: Settings, user_id: str) -> tuple[Weights, WeightSource]:
    """The user's learned weights, else the global ones, else the configured ones."""
    learned = graph.load_weights(user_id)
    if learned is not None:
        return Weights.from_learned(learned), "learned:user"
    learned = graph.load_weights(GLOBAL_SCOPE)
    if learned is not None:
        return Weights.from_learned(learned), "learned:global"
    return Weights.from_settings(settings), "configured"


@dataclass(frozen=True, slots=True)
class Components:
    """The raw score components of one candidate (also what feedback stores for weight learning)."""

    similarity: float
    graph: float
    strength: float
    recency: float
    importance: float


def components(
    *,
    similarity: float,
    hops: int | None,
    strength: float,
    importance: float,
    valid_from: datetime,
    now: datetime,
    settings: Settings,
) -> Components:
    age_days = max(0.0, (now - valid_from).total_seconds() / 86400)
    return Components(
        similarity=max(0.0, similarity),
        graph=0.0 if hops is None else settings.hop_decay**hops,
        strength=strength,
        recency=math.pow(2.0, -age_days / settings.recency_half_life_days),
        importance=importance,
    )


def score(c: Components, w: Weights, rrf_score: float) -> ScoreBreakdown:
    total = (
        w.alpha * c.similarity
        + w.beta * c.graph
        + w.gamma * c.strength
        + w.recency_weight * c.recency
        + w.importance_weight * c.importance
    )
    return ScoreBreakdown(
        similarity=c.similarity,
        graph=c.graph,
        strength=c.strength,
        recency=c.recency,
        importance=c.importance,
        rrf=rrf_score,
        total=total,
    )
