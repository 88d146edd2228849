"""The recall recipe: which channels recall asks, how deep, how they are fused. Data, not code paths.

Channels: ``fact_vector`` (the user's fact embeddings), ``episode_vector`` (the conversation's chunks),
``keyword`` (BM25 over chunks and fact statements) and ``graph`` (expansion from the entities the query
and the top hits mention). With ``fusion_mode`` "score" (the default) each channel adds ``weight`` times
a hit's score min-max normalized over the channel's list (cosine, ``hop_decay ** hops`` for the graph):
its best hit the whole weight, its worst listed hit nothing; the keyword channel adds ``weight`` times
the share of the query's words the hit holds times ``(1 - rank / k) ** 3`` (its rank in its table:
chunks, facts; a turn's share leaves out the names of the speakers the query names, which the speaker cue
matches by who said it), never its BM25 score, which a held snapshot computes over the user's documents and the
store over every user's, so two readers of one memory fuse the same shares; with "rank" it adds
``weight / (rrf_k + rank + 1)`` (reciprocal-rank fusion). The ``fusion`` weight turns the sum into a
share of the final score next to the composite score (similarity, graph, strength, recency, importance;
learned weights apply there). A turn gets ``speaker_boost`` more when the query names its speaker,
``when_boost`` more when the query asks when and the turn says when, and ``period_boost`` more when the
query names a period (a month, a day, a year) and the turn was said in it or its words resolve into it
(``reader.cues``; 2.0, chosen on the dev conversations: 0.25-1.0 gained less, 3.0 and 5.0 the same).
A turn also gets ``session_boost`` times the share of the query's words that the keyword channel's hits
said on its day hold together (``reader.sessions``: a session that holds the query as a whole lifts the
turn whose own words miss it, "Austin." after "Where did you move?"; 1.0, chosen on the dev conversations:
0.5 gained less, 1.5 the same).
Hits bring their neighbours: a fact its source episode, an episode the facts extracted from it, and,
with ``window`` > 0, the turns around it by another speaker (the exchange it is part of: the question a
short answer answers); such an item gets ``link_share`` of its parent's fusion score. A fact ranks at
least with the best excerpt of its source message, and an excerpt whose extracted facts have all ended
keeps half its fusion score. Then the second look (``reader.rerank``, with a vector channel): each of the
top ``rerank_depth`` items gets a weight times its signal min-max normalized over them. With
``rerank_signal`` "similarity" the signal is the cosine and the weight ``rerank_similarity``
(1.5 over the top 40, chosen on the dev conversations: 1.0 and 2.0 gained about as much, a keyword weight of
3.5 or 2.5 with it less). With "late_interaction" (the default) it is MaxSim between the query's and the item's MiniLM
token states (``storage.embedding.states``: chunks' and fact statements'; when an item lacks states, the
cosine step for all of them), with the weight ``rerank_late`` times the spread of those items' totals (the
best minus the last: 1, so the best MaxSim can at most carry the last item level with the first). A fixed
weight (4.5, the median spread on the dev conversations with the whole recipe) overrode the first look
wherever the totals are smaller: with the fact and graph channels alone it put the multi-hop demo's answer,
the fact the graph reached (``tests/test_reader.py``, "what company does my brother work for?"), out of
the top 3 (docs/benchmarks/history.md, "Late interaction's weight in the fused totals' spread"). When
neither the query nor any of those items has states it is the similarity step. The default since the
spread's weight kept that answer; measured offline on the dev conversations only (0.836 / 0.597 against the
cosine step's 0.820 / 0.571), the held-aside fresh ingest still to run.
Items are returned best first by their final score (the step's share included); nothing reorders them after.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CHANNELS", "DEFAULT_RECIPE", "RecallRecipe", "RetrievalChannel"]

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
    fusion_mode: Literal["score", "rank"] = Field(
        "score", description="what a channel adds to a hit: its normalized score, or a share of its rank (RRF)"
    )
    rrf_k: int = Field(1, ge=1, description="reciprocal-rank fusion constant (small: top ranks count most)")
    fusion: float = Field(1.0, ge=0, description="weight of the fusion score in the final score")
    speaker_boost: float = Field(0.25, ge=0, description="fusion added to a turn whose speaker the query names")
    when_boost: float = Field(0.5, ge=0, description="fusion added to a turn that says when, if the query asks when")
    period_boost: float = Field(
        2.0,
        ge=0,
        description="fusion added to a turn said in the period the query names, or whose words resolve into it",
    )
    session_boost: float = Field(
        1.0,
        ge=0,
        description="fusion added to a turn, times the share of the query's words the keyword channel's hits "
        "said on its day hold together (reader.sessions)",
    )
    link_share: float = Field(0.2, ge=0, le=1, description="a linked item's share of its parent's fusion score")
    links_from: int = Field(10, ge=0, le=100, description="how many top hits bring their linked items")
    window: int = Field(1, ge=0, le=5, description="neighbouring turns an episode hit brings on each side")
    rerank_similarity: float = Field(
        1.5,
        ge=0,
        description="added to each of the top rerank_depth items, times its query similarity min-max normalized "
        "over them (with a vector channel; reader.rerank)",
    )
    rerank_depth: int = Field(40, ge=0, le=200, description="how many top items the similarity step re-scores")
    rerank_signal: Literal["late_interaction", "similarity"] = Field(
        "late_interaction",
        description="the second look's signal: MaxSim over MiniLM token states (the cosine step when one of "
        "them has none), or the query similarity (reader.rerank)",
    )
    rerank_late: float = Field(
        1.0,
        ge=0,
        description="times the spread of the top rerank_depth items' totals (the best minus the last), added to "
        "each of them times its late-interaction signal min-max normalized over them (rerank_signal "
        "late_interaction; reader.rerank)",
    )

    @property
    def late_interaction(self) -> bool:
        """Whether the second look asks for token states (the query's, the top items')."""
        return (
            self.rerank_signal == "late_interaction"
            and self.rerank_late > 0
            and self.rerank_depth > 0
            and (self.uses("episode_vector") or self.uses("fact_vector"))
        )

    def uses(self, channel: RetrievalChannel) -> bool:
        return channel in self.channels

    def with_channels(self, *channels: RetrievalChannel) -> RecallRecipe:
        return self.model_copy(update={"channels": tuple(channels)})


DEFAULT_RECIPE = RecallRecipe()
