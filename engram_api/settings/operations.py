"""Running the fleet: maintenance jobs and their Beat intervals, middleware hooks, observability.

Observability covers Flower, Celery task events, log format, the workers' metrics directory, traces and the
reader's metrics; each is off or local unless set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class OperationsSettings(BaseModel):
    """The maintenance, hooks and observability sections of ``Settings``."""

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
    reembed_interval_s: float = Field(
        3600,
        gt=0,
        description="Beat: re-embed the chunks whose vectors were made under another ENGRAM_CHUNK_EMBED_CONTEXT "
        "(one store read once none is left)",
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
