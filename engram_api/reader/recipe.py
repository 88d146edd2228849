"""The recall recipe: which channels recall asks, how deep, how they are fused. Data, not code paths.

Channels: ``fact_vector`` (the user's fact embeddings), ``episode_vector`` (the conversation's chunks),
``keyword`` (BM25 over chunks and fact statements) and ``graph`` (expansion from the entities the query
and the top hits mention). Each channel's ranked list adds ``weight / (rrf_k + rank + 1)`` to a
candidate (reciprocal-rank fusion); the ``fusion`` weight turns that into a share of the final score next
to the composite score (similarity, graph, strength, recency, importance; learned weights apply there).
Hits bring their neighbours: a fact its source episode, an episode the facts extracted from it, and,
with ``window`` > 0, the turns around it; such an item gets ``link_share`` of its parent's fusion score.
With ``dedup``, an item that cites only messages better items already cite (a fact and the excerpt it
was extracted from) moves behind the items that bring a new message, so k items cover more of the
conversation; nothing is dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CHANNELS", "DEFAULT_RECIPE", "RecallRecipe", "RetrievalChannel"]

RetrievalChannel = Literal["fact_vector", "episode_vector", "keyword", "graph"]
CHANNELS: tuple[RetrievalChannel, ...] = ("fact_vector", "episode_vector", "keyword", "graph")


class RecallRecipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    channels: tuple[RetrievalChannel, ...] = Field(CHANNELS, min_length=1)
    k: dict[RetrievalChannel, int] = Field(
        default_factory=lambda: {"fact_vector": 30, "episode_vector": 40, "keyword": 40, "graph": 50},
        description="how many candidates each channel contributes",
    )
    weights: dict[RetrievalChannel, float] = Field(
        # BM25 carries names, places and dates where MiniLM is weak; fact vectors mostly re-find what the
        # episode vectors found. Chosen on LoCoMo dev conversations, confirmed on held-out ones
        # (docs/benchmarks/history.md, "Choosing the fusion").
        default_factory=lambda: {"fact_vector": 0.5, "episode_vector": 1.0, "keyword": 2.0, "graph": 0.5},
        description="each channel's weight in reciprocal-rank fusion",
    )
    rrf_k: int = Field(1, ge=1, description="reciprocal-rank fusion constant (small: top ranks count most)")
    fusion: float = Field(1.0, ge=0, description="weight of the normalized fusion score in the final score")
    link_share: float = Field(0.5, ge=0, le=1, description="a linked item's share of its parent's fusion score")
    links_from: int = Field(10, ge=0, le=100, description="how many top hits bring their linked items")
    window: int = Field(0, ge=0, le=5, description="neighbouring turns an episode hit brings on each side")
    dedup: bool = Field(
        True, description="an item citing only messages a better item already cites goes after the others"
    )

    def uses(self, channel: RetrievalChannel) -> bool:
        return channel in self.channels

    def with_channels(self, *channels: RetrievalChannel) -> RecallRecipe:
        return self.model_copy(update={"channels": tuple(channels)})


DEFAULT_RECIPE = RecallRecipe()
