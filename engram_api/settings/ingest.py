"""The write path's settings: LLM call discipline, input limits, delivery, worker processes.

The LLM limits are fleet-wide (their state lives in Redis); the input caps bound what one enqueue may carry
(``MAX_BATCH_CAP`` and ``MAX_TURNS_CAP`` bound the settings themselves and the gateway's request models).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

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


class IngestSettings(BaseModel):
    """The ingest sections of ``Settings``: from ``enqueue`` through extract and apply."""

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
        "prev_turn (the turn right before), dated (its date), none (the words alone); chunks stored under another "
        "value are re-embedded by the `reembed` maintenance job",
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

    @field_validator("llm_extra_params")
    @classmethod
    def _not_ours(cls, v: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(v) & _LLM_PARAMS_OURS)
        if taken:
            raise ValueError(f"sets {', '.join(taken)}, which Engram sets itself (the other settings say how)")
        return v
