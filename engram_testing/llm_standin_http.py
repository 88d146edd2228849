"""The LLM stand-in's HTTP side: a threaded server and the handler that routes OpenAI's and Anthropic's
paths to an ``LLMStandin``.

Every chat request with a JSON-object body is recorded before it is answered (an unknown route or a body
that is not JSON is answered 404 or 400 and not recorded); streaming is refused with 400 rather than
answered in a shape the client would misread; error bodies have OpenAI's shape. Handler threads are
daemons, so a hanging answer never keeps the process alive.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from engram_testing.llm_standin_replies import MODEL, _error_body

if TYPE_CHECKING:
    from engram_testing.llm_standin import LLMStandin


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hanging handler must never keep the process alive
    request_queue_size = 256  # benchmarks open hundreds of connections at once
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], standin: LLMStandin):
        self.standin = standin
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: httpx pools connections as with a hosted API
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: thousands of requests per benchmark; ``standin.requests`` has the record."""

    def _send(self, status: int, payload: bytes, headers: Mapping[str, str], *, truncate: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        if truncate:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload[: len(payload) // 2] if truncate else payload)
        if truncate:
            self.wfile.flush()
            self.close_connection = True

    def _send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers or {})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/health", "/v1/health"):
            self._send_json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            created = int(time.time())
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": created, "owned_by": "engram"}],
                },
            )
        else:
            self._send_json(404, _error_body(404, f"no route GET {path}"))

    def do_POST(self) -> None:
        standin = self.server.standin
        path = self.path.split("?", 1)[0].rstrip("/")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        anthropic = path in ("/v1/messages", "/messages")
        if path not in ("/v1/chat/completions", "/chat/completions") and not anthropic:
            self._send_json(404, _error_body(404, f"no route POST {path}"))
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("request body is not a JSON object")
        except ValueError as exc:
            self._send_json(400, _error_body(400, f"invalid JSON body: {exc}"))
            return
        standin._record(body)
        if body.get("stream"):
            # Streaming is not implemented: fail loudly rather than answer in a shape the client misreads.
            self._send_json(400, _error_body(400, "the LLM stand-in does not stream; call without stream"))
            return

        reply = standin._choose(body)
        if not standin._sleep(standin.latency_s + reply.delay_s):
            return
        if reply.hang:
            standin._sleep(standin.hang_s)
            self.close_connection = True  # no answer at all: the client's timeout has to fire
            return
        if reply.body is not None:
            payload = reply.body
        elif reply.status >= 400:
            payload = json.dumps(_error_body(reply.status, reply.content)).encode()
        elif anthropic:
            payload = json.dumps(standin._anthropic_message(body, reply)).encode()
        else:
            payload = json.dumps(standin._completion(body, reply)).encode()
        self._send(reply.status, payload, reply.headers, truncate=reply.truncate)
