"""A fitted fusion: a recall candidate's fusion score as a linear model of its features, the weights data.

With ``fusion_mode`` "fitted" (``reader.recipe``) a candidate's fusion score is not the sum of what each
channel added but ``sum(weight[f] * feature[f])`` over the features below, with the weights read from
``fitted_fusion.json`` beside this module (fitted offline on the LoCoMo dev conversations by pairwise
logistic regression, evidence turns against the rest; how and what it gave: docs/benchmarks.md, "How the
fusion was chosen"). The channels still run as the recipe says; the model only weighs what they found.

Features of one candidate (each the same whichever index answered: no BM25 score is among them):
- ``keyword``, ``episode_vector``, ``fact_vector``, ``graph``: the channel's share for the hit (what the
  channel added over its recipe weight: rank and word share for the keyword channel, normalized cosine or
  hop score for the others), 0 when the channel did not list it;
- ``source``, ``extracted``, ``window``: the fusion score of the hit that brought it as a linked item (a
  fact's source excerpt, an excerpt's extracted fact, a neighbouring turn), over the recipe's link share;
- ``similarity``: the query's cosine with the candidate's own vector;
- ``fact``: 1 for a fact, 0 for an excerpt;
- ``speaker``, ``when``: the query cues (``reader.cues``): the recipe's ``speaker_boost`` when the query
  names the turn's speaker, its ``when_boost`` when the query asks when and the turn says when, else 0 (so
  the recipe turns a cue off or scales it as in score fusion);
- ``word_share``: the share of the query's stemmed words the candidate's text holds.

Invariants: the weights are loaded once and validated (every feature named, finite); a missing or bad
file is an error at first use naming the file, never a silent fall-back; scoring is a pure function of the
features, so a snapshot reader and a store reader give the same scores.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import cache
from operator import mul
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engram_api.errors import ConfigError
from engram_api.reader.cues import QueryCues
from engram_api.reader.items import Candidate
from engram_api.reader.recipe import RecallRecipe
from engram_api.reader.scoring import word_share

__all__ = ["FEATURES", "FittedFusion", "fitted_fusion", "fitted_scores"]

FEATURES: tuple[str, ...] = (
    "keyword",
    "episode_vector",
    "fact_vector",
    "graph",
    "source",
    "extracted",
    "window",
    "similarity",
    "fact",
    "speaker",
    "when",
    "word_share",
)
_FILE = Path(__file__).with_name("fitted_fusion.json")


class FittedFusion(BaseModel):
    """The fitted weights, one per feature, and where they came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: dict[str, float] = Field(description="a weight per feature of ``FEATURES``")
    fitted_on: str = Field(description="the questions the weights were fitted on, and how")

    @field_validator("weights")
    @classmethod
    def _every_feature(cls, weights: dict[str, float]) -> dict[str, float]:
        if set(weights) != set(FEATURES):
            missing, unknown = sorted(set(FEATURES) - set(weights)), sorted(set(weights) - set(FEATURES))
            raise ValueError(f"weights must name every feature: missing {missing}, unknown {unknown}")
        if not all(math.isfinite(w) for w in weights.values()):
            raise ValueError("weights must be finite")
        return weights

    def vector(self) -> tuple[float, ...]:
        """The weights in ``FEATURES`` order."""
        return tuple(self.weights[f] for f in FEATURES)


@cache
def fitted_fusion() -> FittedFusion:
    """The shipped weights (read once a process)."""
    try:
        return FittedFusion.model_validate(json.loads(_FILE.read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(_FILE.name, str(exc)) from exc


_CHANNELS = ("keyword", "episode_vector", "fact_vector", "graph")
_LINKS = ("source", "extracted", "window")


def features(
    cand: Candidate, similarity: float, cues: QueryCues, query_terms: frozenset[str], recipe: RecallRecipe
) -> tuple[float, ...]:
    """One candidate's features in ``FEATURES`` order (its ``parts`` as the recipe's channels gave them)."""
    parts = cand.parts
    shares = [parts.get(c, 0.0) / w if (w := recipe.weights.get(c, 0.0)) else 0.0 for c in _CHANNELS]
    link = recipe.link_share
    linked = [parts.get(c, 0.0) / link if link else 0.0 for c in _LINKS]
    chunk = cand.chunk
    text = cand.fact.statement if cand.fact is not None else chunk.indexed_text if chunk is not None else ""
    return (
        *shares,
        *linked,
        similarity,
        float(cand.fact is not None),
        recipe.speaker_boost * (chunk is not None and cues.names(chunk.speaker)),
        recipe.when_boost * (chunk is not None and cues.answers_when(chunk.text, chunk.event_time)),
        word_share(query_terms, text),
    )


def fitted_scores(
    cands: dict[str, Candidate],
    sims: dict[str, float],
    cues: QueryCues,
    query_terms: frozenset[str],
    recipe: RecallRecipe,
    replaced: Callable[[Candidate], bool],
) -> dict[str, float]:
    """Each candidate's fitted fusion score. As in score fusion, a fact scores at least as its source
    message's best excerpt, and an excerpt whose extracted facts have all ended (``replaced``) keeps half."""
    w = fitted_fusion().vector()
    scores = {
        node_id: sum(map(mul, w, features(cand, sims.get(node_id, 0.0), cues, query_terms, recipe)))
        for node_id, cand in cands.items()
    }
    best: dict[str, float] = {}
    for node_id, cand in cands.items():
        if cand.chunk is not None:
            if replaced(cand):
                scores[node_id] *= 0.5
            best[cand.chunk.episode_id] = max(best.get(cand.chunk.episode_id, 0.0), scores[node_id])
    for node_id, cand in cands.items():
        if cand.fact is not None:
            scores[node_id] = max([scores[node_id], *(best.get(e, 0.0) for e in cand.fact.source_ids)])
    return scores
