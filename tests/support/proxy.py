"""A round-robin HTTP reverse proxy for tests: each request goes to the next backend in turn, whatever
the client sent before (no affinity of any kind), and the proxy records which backend answered what.

Bodies are buffered both ways, which suits the gateway's JSON answers (MCP runs with ``json_response``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import httpx

from tests.support.loopback import LoopbackServer

__all__ = ["Forwarded", "RoundRobinProxy"]

# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones the proxy sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"})


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    backend: str
    status: int
    sent_session: str | None  # the request's Mcp-Session-Id
    answered_session: str | None  # the answer's


class RoundRobinProxy(LoopbackServer):
    def __init__(self, backends: Sequence[str]) -> None:
        self.backends = list(backends)
        self.log: list[Forwarded] = []
        self._turn = itertools.cycle(self.backends)
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=120)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with proxy._lock:
                    backend = next(proxy._turn)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
                answer = proxy._http.request(self.command, backend + self.path, headers=headers, content=body)
                sessions = (self.headers.get("mcp-session-id"), answer.headers.get("mcp-session-id"))
                with proxy._lock:
                    proxy.log.append(Forwarded(self.command, self.path, backend, answer.status_code, *sessions))
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in _NOT_FORWARDED and key.lower() != "content-encoding":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(Handler)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._http.close()
