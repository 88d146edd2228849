"""Recall scoring: reciprocal-rank fusion picks the candidates, the composite score orders them.

composite = alpha*similarity + beta*hop_decay**hops + gamma*strength + recency_w*recency + importance_w*importance
where recency = 2 ** (-age_days / half_life). Weights come from settings or, once the maintenance job has
learned them from feedback, from the store (per user, else global).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from engram_api.models import LearnedWeights, ScoreBreakdown
from engram_api.settings import Settings

__all__ = ["Components", "Weights", "rrf", "score"]


@dataclass(frozen=True, slots=True)
class Weights:
    alpha: float
    beta: float
    gamma: float
    recency_weight: float
    importance_weight: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Weights:
        return cls(settings.alpha, settings.beta, settings.gamma, settings.recency_weight, settings.importance_weight)

    @classmethod
    def from_learned(cls, learned: LearnedWeights) -> Weights:
        return cls(learned.alpha, learned.beta, learned.gamma, learned.recency_weight, learned.importance_weight)


@dataclass(frozen=True, slots=True)
class Components:
    """The raw score components of one candidate (also what feedback stores for weight learning)."""

    similarity: float
    graph: float
    strength: float
    recency: float
    importance: float


def rrf(rank: int | None, k: int) -> float:
    return 0.0 if rank is None else 1.0 / (k + rank + 1)


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
