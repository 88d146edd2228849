"""The read side's settings: recall scoring, graph expansion, Neo4j's pool, FAISS indexes, snapshots, caches.

Recall scores alpha*similarity + beta*hop_decay**hops + gamma*strength (+ boosts); the weight-learning job
may replace the weights. The Neo4j pool settings sit here, after the graph expansion's timeout, because
that is their place in docs/configuration.md and .env.example; every process's driver reads them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class RecallSettings(BaseModel):
    """The recall section of ``Settings``."""

    # --- recall scoring: alpha*similarity + beta*hop_decay**hops + gamma*strength (+ boosts) ---
    alpha: float = Field(0.6, description="recall weight of vector similarity")
    beta: float = Field(0.25, description="recall weight of graph proximity (hop_decay ** hops)")
    gamma: float = Field(0.15, description="recall weight of memory strength")
    recency_weight: float = Field(0.1, description="recall boost for recent facts")
    importance_weight: float = Field(0.1, description="recall boost for important facts")
    hop_decay: float = Field(0.5, gt=0, le=1, description="graph score factor per hop")
    max_hops: int = Field(2, ge=0, le=4, description="graph expansion depth in recall")
    graph_facts_per_seed: int = Field(
        25, ge=1, le=1000, description="graph expansion: facts one seed entity contributes at most (its nearest)"
    )
    neo4j_query_timeout_s: float = Field(
        10.0, gt=0, description="Neo4j: transaction timeout of recall's graph expansion (runaway traversals end)"
    )
    neo4j_max_pool_size: int = Field(100, ge=1, description="Neo4j: connections one process keeps at most")
    neo4j_pool_acquisition_timeout_s: float = Field(
        60.0, gt=0, description="Neo4j: how long a query waits for a free pooled connection before failing"
    )
    neo4j_connection_lifetime_s: float = Field(
        3600.0,
        gt=0,
        description="Neo4j: a pooled connection older than this is closed (set below any proxy's idle cut)",
    )
    index_cache_users: int = Field(
        256, ge=1, description="per-process LRU of users' loaded FAISS indexes (older ones are reloaded from disk)"
    )
    index_flat_max: int = Field(
        20_000,
        ge=1,
        description="vectors of one kind up to which a user's FAISS index is exact (flat); above it IVF-SQ8 "
        "with exact re-rank (recall@10 >= 0.98 of flat), chosen at rebuild and compaction",
    )
    index_log_compact_bytes: int = Field(
        1 << 20,
        ge=0,
        description="a user's FAISS delta log is compacted into its index file once it passes this size "
        "and index_log_compact_ratio of the file",
    )
    index_log_compact_ratio: float = Field(
        0.25,
        ge=0,
        description="delta log size, as a fraction of the index file, past which it is compacted (with "
        "index_log_compact_bytes: the rewrite cost per write stays independent of the user's size)",
    )
    index_sweep_interval_s: float = Field(
        60.0,
        gt=0,
        description="how often each worker and reader process deletes the local FAISS files of users erased "
        "(forget_user) on any host, and their texts in its encoder cache, read from Redis's erasure tombstones; "
        "also once at start",
    )
    rrf_k: int = Field(
        1, ge=1, description='reciprocal-rank fusion constant of recall\'s channels (a recipe with fusion_mode "rank")'
    )
    recall_window: int = Field(
        1,
        ge=0,
        le=5,
        description="neighbouring conversation turns an episode hit brings along, on each side "
        "(another speaker's: the exchange it is part of)",
    )
    recency_half_life_days: float = Field(30.0, gt=0, description="age at which the recency boost halves")
    cache_ttl_s: float = Field(30.0, ge=0, description="reader result cache lifetime (also invalidated by writes)")
    snapshot_max_records: int = Field(
        150_000,
        ge=0,
        description="a reader holds a user of at most this many facts + chunks whole in memory (~0.9 KB a fact, "
        "~1.4 KB a chunk; a whole load briefly holds ~2 KB a record more), "
        "kept current by reading only what each write changed, so recall's graph step and keyword search make "
        "no store round trip (0: never)",
    )
    snapshot_budget_records: int = Field(
        200_000,
        ge=0,
        description="the facts + chunks of all the snapshots one reader holds (~180-280 MB at the default), least "
        "recently used dropped first",
    )
    snapshot_fold_deadline_s: float = Field(
        1.0,
        gt=0,
        description="after another host's forget, the longest a reader's fold of its held snapshot waits for the "
        "process's recalls to pause: the forgotten texts leave the reader's memory within this plus one fold "
        "(~5-25 ms at 10K facts) after the catch-up or refresh that saw the forget",
    )
    broad_min_score: float = Field(0.45, description="search(auto): below this, fall back to facts")

    @property
    def neo4j_pool(self) -> dict[str, float]:
        """The Neo4j driver's pool options (``Neo4jConnection``)."""
        return {
            "max_connection_pool_size": self.neo4j_max_pool_size,
            "connection_acquisition_timeout": self.neo4j_pool_acquisition_timeout_s,
            "max_connection_lifetime": self.neo4j_connection_lifetime_s,
        }
