"""The HTTP / MCP gateway's settings (`engram serve`): its keys, limits, MCP sessions, and cells.

A gateway key is configured as ``ApiKeySpec`` (only the SHA-256 of its secret); ``Scope`` is the vocabulary of
what a key may do, shared with the gateway's guard. ``cell_count`` and ``cell_index`` are set both or neither,
and the index is below the count (a stack is one cell of ``cell_count``; ``engram_api/cells.py`` routes).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

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


class GatewaySettings(BaseModel):
    """The gateway section of ``Settings``."""

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
