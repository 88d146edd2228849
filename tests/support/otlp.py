"""An OTLP/HTTP trace collector for tests: a real HTTP server on 127.0.0.1 that the processes under test
export to (``OTEL_EXPORTER_OTLP_ENDPOINT``), decoding each ``ExportTraceServiceRequest`` (protobuf, the
SDK exporter's wire format) into ``Span`` rows held in memory.

It is the in-memory exporter of a fleet: worker and gateway processes keep their real exporter (the SDK's
batch processor and OTLP over HTTP), and the test reads what arrived.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.loopback import LoopbackServer

__all__ = ["OtlpCollector", "Span"]


@dataclass(frozen=True)
class Span:
    """One received span; ids in hex (as in a ``traceparent``), ``parent`` "" for a root span."""

    name: str
    service: str
    trace_id: str
    span_id: str
    parent: str
    links: tuple[tuple[str, str], ...]
    attributes: dict[str, str]


def _value(any_value: object) -> str:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return str(getattr(any_value, kind)) if kind else ""


def _spans(request: ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                found.append(
                    Span(
                        name=s.name,
                        service=resource.get("service.name", ""),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent=s.parent_span_id.hex(),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                )
    return found


class OtlpCollector(LoopbackServer):
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with collector._lock:
                    collector.spans.extend(_spans(request))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(Handler)

    @property
    def endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        return self.url

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float) -> list[Span]:
        """The spans received once ``done(spans)`` holds (a hang guard, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"the spans never arrived; {len(spans)} received: {names[:40]}")
            time.sleep(0.2)
