"""Recall scoring: the composite score of one candidate, and a channel's scores normalized for the fusion
(which ``fusion`` does): by score (``normalized``), or for the keyword channel by rank (``by_rank``).

composite = alpha*similarity + beta*hop_decay**hops + gamma*strength + recency_w*recency + importance_w*importance
where recency = 2 ** (-age_days / half_life) and strength is a fact's effective strength at the recall's
instant (``fact_strength``: the stored one faded by ``decay_per_day`` since it was set, as the decay job
used to store it daily). Weights come from settings or, once the maintenance job has
learned them from feedback, from the store (per user, else global). The components and the weights
are the models of ``engram_api.models`` (``ScoreComponents``, ``Weights``): one vocabulary everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from engram_api.models import GLOBAL_SCOPE, Weights
from engram_api.settings import Settings
from engram_api.storage.graph.contract import GraphStore
from engram_api.storage.graph.fading import Fading
from engram_api.storage.snapshot.rows import AnyFact

if TYPE_CHECKING:  # items imports this module
    from engram_api.reader.items import Candidate, Row

__all__ = [
    "EPISODE_IMPORTANCE",
    "EPISODE_STRENGTH",
    "ComponentValues",
    "Scoring",
    "WeightSource",
    "Weights",
    "by_rank",
    "effective_weights",
    "fact_strength",
    "normalized",
    "word_share",
]


WeightSource = Literal["configured", "learned:user", "learned:global"]


def effective_weights(graph: GraphStore, settings: Settings, user_id: str) -> tuple[Weights, WeightSource]:
    """The user's learned weights, else the global ones, else the configured ones."""
    learned = graph.load_weights(user_id)
    if learned is not None:
        return Weights.of(learned), "learned:user"
    learned = graph.load_weights(GLOBAL_SCOPE)
    if learned is not None:
        return Weights.of(learned), "learned:global"
    return Weights.from_settings(settings), "configured"


# One candidate's components in ``SCORE_COMPONENTS`` order: a recall scores ~100 candidates and builds
# the breakdown model (``ScoreBreakdown``) only for the k it returns.
ComponentValues = tuple[float, float, float, float, float]

EPISODE_STRENGTH = 1.0  # episodes do not decay: what was said stays said
EPISODE_IMPORTANCE = 0.5


@dataclass(frozen=True, slots=True)
class Scoring:
    """What a recall's composite score reads of the settings, taken once a recall: a recall scores ~100
    candidates, and looking the settings and the decay policy up per candidate was a measurable share of
    its CPU. ``rows`` scores them all."""

    now: datetime
    fading: Fading
    hop_decay: float
    half_life_days: float

    @staticmethod
    def of(settings: Settings, now: datetime) -> Scoring:
        fading = Fading.of(settings.decay_per_day, settings.archive_threshold)
        return Scoring(now, fading, settings.hop_decay, settings.recency_half_life_days)

    def strength(self, fact: AnyFact) -> float:
        """``fact``'s effective strength at ``now`` (``fact_strength``)."""
        return self.fading.strength_at(fact.strength, fact.last_decay_at or fact.created_at, self.now)

    def rows(
        self,
        cands: Mapping[str, Candidate],
        sims: Mapping[str, float],
        hops: Mapping[str, int],
        weights: Sequence[float],
        *,
        fusion: float,
        unit: float,
    ) -> list[Row]:
        """Every candidate's row: its composite score (``weights`` times ``components``, summed in
        ``SCORE_COMPONENTS`` order) plus ``fusion`` times its fusion score over ``unit``, in ``cands``'
        order. ``components`` and ``strength`` inlined in one loop, each float operation in the same order,
        so the totals are the same to the bit: a recall scores ~100 candidates, and a call per component
        and per candidate was most of this step's CPU."""
        w0, w1, w2, w3, w4 = weights
        now, half_life, strength_at = self.now, self.half_life_days, self.fading.strength_at
        # ``hop_decay ** hops`` once per distinct hop count (a few a recall), the same power each time.
        graph: dict[int | None, float] = {h: self.hop_decay**h for h in set(hops.values())}
        graph[None] = 0.0
        pow2, sim_of, hops_of, out = math.pow, sims.get, hops.get, []
        for node_id, cand in cands.items():
            fact = cand.fact
            if fact is not None:
                strength = strength_at(fact.strength, fact.last_decay_at or fact.created_at, now)
                importance, at = fact.importance, fact.valid_from
            else:
                strength, importance, at = EPISODE_STRENGTH, EPISODE_IMPORTANCE, cand.chunk.event_time  # type: ignore[union-attr]
            # ``x if x > 0.0 else 0.0`` is ``max(0.0, x)`` (0.0 for -0.0 and NaN alike) without the call.
            sim = sim_of(node_id, 0.0)
            age_days = (now - at).total_seconds() / 86400
            comp = (
                sim if sim > 0.0 else 0.0,
                graph[hops_of(node_id)],
                strength,
                pow2(2.0, -(age_days if age_days > 0.0 else 0.0) / half_life),
                importance,
            )
            total = w0 * comp[0] + w1 * comp[1] + w2 * comp[2] + w3 * comp[3] + w4 * comp[4]
            out.append((total + fusion * cand.fusion / unit, node_id, cand, comp))
        return out


def fact_strength(fact: AnyFact, at: datetime, settings: Settings) -> float:
    """``fact``'s effective strength at ``at`` (``storage.graph.fading``): what the old daily decay job
    would have stored had it run at ``at``; never above the stored strength (an ``as_of`` before it was set)."""
    return Scoring.of(settings, at).strength(fact)


def normalized(scores: Sequence[float], *, cut: bool) -> list[float]:
    """A channel's scores min-max normalized: its best hit 1, and 0 at the floor of what it could list.
    A list ``cut`` at the channel's k has that floor at its worst hit; a shorter list holds everything
    the channel found, so its floor is a non-match's score, 0 (two graph hits are not best and worst but
    best and second). One hit alone, or all equal, is 1 each. Cosine and hop scores are on no common
    scale, and how far a hit is from the channel's best says more than its rank does (the keyword
    channel is the exception: ``by_rank``)."""
    if not scores:
        return []
    best, worst = max(scores), min(scores)
    floor = worst if cut else min(0.0, worst)
    if best <= floor:
        return [1.0] * len(scores)
    return [(s - floor) / (best - floor) for s in scores]


_RANK_POWER = 3  # chosen on the LoCoMo dev conversations (docs/benchmarks.md)


def by_rank(count: int, k: int) -> list[float]:
    """Shares of a ranked list of ``count`` hits cut at ``k``: ``(1 - rank / k) ** 3``, the best
    hit 1 and the (k+1)th, the first the channel could not list, 0. For the keyword channel: its BM25 is
    computed over the user's documents by a held snapshot and over every user's rows by the store's
    full-text index, so the scores' gaps depend on which index answers, and only the order is theirs."""
    n = max(k, count, 1)
    return [(1.0 - rank / n) ** _RANK_POWER for rank in range(count)]


def word_share(query_terms: frozenset[str], text: str, terms: Mapping[str, frozenset[str]]) -> float:
    """The share of ``query_terms`` (stemmed, as ``keywords.stems`` gives them) that ``text`` holds; 1 for
    none. ``terms``: the recall's memo of texts' terms, the user's (``keywords.TextTerms``, ``reader.terms``)."""
    if not query_terms:
        return 1.0
    return len(query_terms & terms[text]) / len(query_terms)
