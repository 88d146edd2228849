"""OpenTelemetry traces: one trace follows a message from its enqueue through extract (the LLM call) and
apply, and the recall that finds its facts links to it.

Off by default (``ENGRAM_TRACING``). This module imports only the OpenTelemetry API; ``configure`` loads
the SDK, the OTLP exporter and the instrumentation packages (the ``engram[tracing]`` extra) when tracing
is on. How the pieces join:

- ``span(name)`` opens one of Engram's own spans: ``engram.enqueue`` (the producer), ``engram.extract`` /
  ``engram.apply`` (a stage task, with its outcome as ``engram.outcome``), ``engram.llm`` (one model
  call), ``engram.recall`` (the reader).
- The enqueue writes the current context (W3C ``traceparent``/``tracestate``) into the extract task's
  kombu headers (``carrier``, read by ``engram_api.ledger.wire.task_message``): Celery's instrumentation
  in the worker reads it from the request, so the worker's ``run/engram.extract`` span is a child of
  ``engram.enqueue``; the hand-over to apply is an ordinary Celery publish, which the instrumentation
  injects into the same way.
- A message that parks behind an earlier one of its user (``engram_api.ledger.turns``) keeps its extract
  span's context beside its parking (``keys.parked_traces``, in the same script; not ``TRACE_FIELD``,
  which names the extract span a recall links to, and is read by the script that picks the message to
  wake): the task that wakes it carries that context in its headers, so the woken ``run/engram.extract``
  is a child of the parked run's ``engram.extract`` (outcome ``waiting``), in the trace of its enqueue.
- Extract records its span's context on the message's status hash (``status_fields``, field
  ``TRACE_FIELD``), which lives ``status_ttl_s``; a recall adds a link to it for each message its result
  cites (``recalled``), so the recall, in its own trace, points at the trace of every message it found.
- The gateway's HTTP server spans (FastAPI's instrumentation) are parents of the enqueue and recall spans
  its routes run; a caller's own ``traceparent`` header continues the caller's trace.

Invariants:
- With tracing off nothing here loads the SDK or touches Redis: ``span`` yields a non-recording span,
  ``carrier`` and ``status_fields`` are empty, ``recalled`` returns at once.
- Spans carry ids (user, message, model), never message text or a query.
- ``configure`` is idempotent per process and keeps a tracer provider the application set itself.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from engram_api import keys
from engram_api.errors import ConfigError

if TYPE_CHECKING:
    import redis

    from engram_api.settings import Settings

__all__ = [
    "TRACE_FIELD",
    "carrier",
    "configure",
    "enabled",
    "flush",
    "message_ids",
    "recalled",
    "span",
    "status_fields",
    "traced",
    "traced_recall",
]

F = TypeVar("F", bound=Callable[..., Any])
Attributes = Mapping[str, str | int | float | bool]

TRACE_FIELD = "traceparent"
"""The status-hash field holding the W3C ``traceparent`` of the message's extract span."""

_TRACER = "engram"
_lock = threading.Lock()
# Set once by ``configure``. A forked child (Celery's prefork pool) inherits it with the provider, whose
# span processor restarts its export thread after the fork (the SDK's at-fork hook), and the
# instrumentation: it traces as its parent does.
_on = False


def enabled() -> bool:
    """Whether this process was configured to trace (``configure`` with ``ENGRAM_TRACING`` on)."""
    return _on


def configure(settings: Settings, *, service: str = "engram") -> bool:
    """Turn tracing on in this process when ``settings.tracing`` is: a tracer provider exporting over OTLP
    (``OTEL_EXPORTER_OTLP_*``; ``OTEL_SERVICE_NAME`` overrides ``service``), unless the application set
    one, and redis-py's instrumentation. Returns whether tracing is on. Raises ``ConfigError`` when it is
    asked for and the ``engram[tracing]`` packages are missing."""
    global _on
    if not settings.tracing:
        return False
    with _lock:
        if _on:
            return True
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.instrumentation.redis import RedisInstrumentor
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ConfigError(
                "ENGRAM_TRACING", f"is on but {exc.name} is not installed: pip install 'engram[tracing]'"
            ) from None
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            provider = TracerProvider(resource=Resource.create({"service.name": service}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            trace.set_tracer_provider(provider)
        if not RedisInstrumentor().is_instrumented_by_opentelemetry:
            RedisInstrumentor().instrument()
        _on = True
    return True


def flush() -> None:
    """Export what is buffered (a worker child about to exit; its last spans would be lost)."""
    provider = trace.get_tracer_provider()
    force = getattr(provider, "force_flush", None)
    if enabled() and force is not None:
        force()


@contextmanager
def span(name: str, **attributes: str | int | float | bool) -> Iterator[trace.Span]:
    """A span of Engram's own, current inside the block (a non-recording one when tracing is off).
    An exception leaving the block is recorded on the span and re-raised."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    with trace.get_tracer(_TRACER).start_as_current_span(name, attributes=attributes) as current:
        yield current


def message_ids(user_id: str, message_id: str) -> dict[str, str]:
    """A message's span attributes."""
    return {"engram.user_id": user_id, "engram.message_id": message_id}


def traced(name: str, attributes: Callable[..., Attributes] | None = None) -> Callable[[F], F]:
    """Run the decorated function in ``span(name)``, with ``attributes(*args, **kwargs)`` (ids only)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not _on:
                return fn(*args, **kwargs)
            with span(name, **(attributes(*args, **kwargs) if attributes else {})):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def traced_recall(fn: F) -> F:
    """``Reader.recall`` in an ``engram.recall`` span linked to the messages its result cites (``recalled``)."""

    @functools.wraps(fn)
    def run(reader: Any, user_id: str, *args: Any, **kwargs: Any) -> Any:
        if not _on:
            return fn(reader, user_id, *args, **kwargs)
        with span("engram.recall", **{"engram.user_id": str(user_id)}):
            result = fn(reader, user_id, *args, **kwargs)
            recalled(reader.redis, user_id, (mid for item in result.items for mid in item.source_ids))
            return result

    return run  # type: ignore[return-value]


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``) for a message's
    envelope; empty with tracing off or outside any span."""
    headers: dict[str, str] = {}
    if enabled():
        propagate.inject(headers)
    return headers


def status_fields() -> dict[str, str]:
    """The status-hash fields that let a later recall link to the current span (``TRACE_FIELD``)."""
    context = trace.get_current_span().get_span_context()
    if not enabled() or not context.is_valid:
        return {}
    return {TRACE_FIELD: _traceparent(context)}


def _traceparent(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def recalled(client: redis.Redis | None, user_id: str, message_ids: Iterable[str]) -> None:
    """Link the current span (a recall) to the recorded span of each message it cites: one pipelined
    read of the status hashes. A message past its status TTL has no record and gets no link; a Redis
    error costs the links, never the recall."""
    current = trace.get_current_span()
    ids = list(dict.fromkeys(message_ids))
    if client is None or not ids or not current.is_recording():
        return
    import redis as redis_module  # loaded already: the caller holds a client

    with suppress(redis_module.RedisError):
        pipe = client.pipeline(transaction=False)
        for message_id in ids:
            pipe.hget(keys.status(user_id, message_id), TRACE_FIELD)
        for message_id, value in zip(ids, pipe.execute(), strict=True):
            linked = _span_context(value)
            if linked is not None:
                current.add_link(linked, {"engram.message_id": message_id})


def _span_context(value: Any) -> trace.SpanContext | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    extracted = propagate.extract({"traceparent": text}, context=otel_context.Context())
    context = trace.get_current_span(extracted).get_span_context()
    return context if context.is_valid else None
