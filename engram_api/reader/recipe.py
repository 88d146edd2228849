"""The recall recipe: which channels recall asks, how deep, how they are fused. Data, not code paths.

Channels: ``fact_vector`` (the user's fact embeddings), ``episode_vector`` (the conversation's chunks),
``keyword`` (BM25 over chunks and fact statements) and ``graph`` (expansion from the entities the query
and the top hits mention). With ``fusion_mode`` "score" each channel adds ``weight`` times
a hit's score min-max normalized over the channel's list (cosine, ``hop_decay ** hops`` for the graph):
its best hit the whole weight, its worst listed hit nothing; the keyword channel adds ``weight`` times
the share of the query's words the hit holds times ``(1 - rank / k) ** 3`` (its rank in its table:
chunks, facts), never its BM25 score, which a held snapshot computes over the user's documents and the
store over every user's, so two readers of one memory fuse the same shares; with "rank" it adds
``weight / (rrf_k + rank + 1)`` (reciprocal-rank fusion). The ``fusion`` weight turns the sum into a
share of the final score next to the composite score (similarity, graph, strength, recency, importance;
learned weights apply there). A turn gets ``speaker_boost`` more when the query names its speaker, and
``when_boost`` more when the query asks when and the turn says when (``reader.cues``).
Hits bring their neighbours: a fact its source episode, an episode the facts extracted from it, and,
with ``window`` > 0, the turns around it by another speaker (the exchange it is part of: the question a
short answer answers); such an item gets ``link_share`` of its parent's fusion score. A fact ranks at
least with the best excerpt of its source message, and an excerpt whose extracted facts have all ended
keeps half its fusion score.
With ``fusion_mode`` "fitted" (the default) those channel shares, links and cues are computed as in
"score", and a hit's fusion score is then a linear model of them and of its cosine, its kind and the
share of the query's words it holds, with weights fitted on the dev conversations and shipped as data
(``reader.fitted``); the two rules above apply to the fitted score.
Items are returned best first by their final score; nothing reorders them after.

Also here, what bounds a recall's candidates: its ``TimeWindow``, and the keyword channel's search as the
recipe sets it (``keyword_hits``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engram_api.models import KeywordHit
from engram_api.storage.graph.episodes import keyword_terms
from engram_api.storage.graph.validity import overlaps
from engram_api.storage.snapshot.rows import AnyChunk, AnyFact

__all__ = ["CHANNELS", "DEFAULT_RECIPE", "RecallRecipe", "RetrievalChannel", "TimeWindow", "keyword_hits"]

RetrievalChannel = Literal["fact_vector", "episode_vector", "keyword", "graph"]
CHANNELS: tuple[RetrievalChannel, ...] = ("fact_vector", "episode_vector", "keyword", "graph")


class RecallRecipe(BaseModel):
    """The defaults were chosen on two LoCoMo dev conversations and confirmed on the three held aside
    (docs/benchmarks.md, "How the fusion was chosen")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channels: tuple[RetrievalChannel, ...] = Field(CHANNELS, min_length=1)
    k: dict[RetrievalChannel, int] = Field(
        default_factory=lambda: {"fact_vector": 30, "episode_vector": 40, "keyword": 40, "graph": 50},
        description="how many candidates each channel contributes",
    )
    weights: dict[RetrievalChannel, float] = Field(
        # BM25 carries names, places and dates where MiniLM is weak; fact vectors mostly re-find what the
        # episode vectors found.
        default_factory=lambda: {"fact_vector": 0.5, "episode_vector": 1.0, "keyword": 5.0, "graph": 0.5},
        description="each channel's weight in the fusion",
    )
    fusion_mode: Literal["fitted", "score", "rank"] = Field(
        "fitted",
        description="how a hit's fusion score is made: the fitted model of its channels' shares and cues "
        "(``reader.fitted``), the sum of its normalized channel scores, or of shares of its ranks (RRF)",
    )
    rrf_k: int = Field(1, ge=1, description="reciprocal-rank fusion constant (small: top ranks count most)")
    fusion: float = Field(1.0, ge=0, description="weight of the fusion score in the final score")
    speaker_boost: float = Field(0.25, ge=0, description="fusion added to a turn whose speaker the query names")
    when_boost: float = Field(0.5, ge=0, description="fusion added to a turn that says when, if the query asks when")
    link_share: float = Field(0.2, ge=0, le=1, description="a linked item's share of its parent's fusion score")
    links_from: int = Field(10, ge=0, le=100, description="how many top hits bring their linked items")
    window: int = Field(1, ge=0, le=5, description="neighbouring turns an episode hit brings on each side")

    def uses(self, channel: RetrievalChannel) -> bool:
        return channel in self.channels

    def with_channels(self, *channels: RetrievalChannel) -> RecallRecipe:
        return self.model_copy(update={"channels": tuple(channels)})


DEFAULT_RECIPE = RecallRecipe()


@dataclass(frozen=True, slots=True)
class TimeWindow:
    as_of: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def filtering(self) -> bool:
        return self.as_of is not None or self.since is not None or self.until is not None

    def chunk_ok(self, chunk: AnyChunk) -> bool:
        t = chunk.event_time
        return (
            (self.as_of is None or t <= self.as_of)
            and (self.since is None or t >= self.since)
            and (self.until is None or t < self.until)
        )

    def fact_ok(self, fact: AnyFact) -> bool:
        return fact.current_at(self.as_of) and overlaps(fact.valid_from, fact.valid_until, self.since, self.until)


def keyword_hits(
    search: Callable[..., list[KeywordHit]], query: str, recipe: RecallRecipe, window: TimeWindow
) -> list[KeywordHit]:
    """The keyword channel: BM25 over the user's chunks and fact statements inside the time window, by
    ``search`` (the store's ``GraphStore.keyword_search`` for the user, or a held ``UserSnapshot``'s)."""
    return search(
        keyword_terms(query),
        recipe.k.get("keyword", 40),
        as_of=window.as_of,
        since=window.since,
        until=window.until,
    )
