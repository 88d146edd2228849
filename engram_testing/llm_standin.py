"""An OpenAI-compatible chat-completions server with scripted answers: the LLM for tests and benchmarks.

It is a real HTTP server on 127.0.0.1, so the code under test goes through litellm, httpx and the
network stack exactly as with a hosted model; only the answers are scripted. It also takes Anthropic's
``POST /v1/messages`` (litellm's ``anthropic/`` models with ``api_base`` = the server's root,
:attr:`LLMStandin.root`), so what litellm sends a Claude model can be asserted on the wire; there a JSON
reply to a forced tool (litellm's JSON-schema mode) comes back as that tool's ``tool_use`` input. Per request it picks a
:class:`Reply`: a random injected failure (``failure_rate``), else the first rule of :meth:`script` that
answers, else ``responder``, else an empty extraction. Replies can also fail on purpose: HTTP errors,
429 with Retry-After, bodies that are not JSON, bodies cut off mid-way, or no answer at all.

Standalone (benchmarks run it as its own process)::

    python -m engram_testing.llm_standin --port 0 --latency 1.0
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any

__all__ = ["DEFAULT_CONTENT", "LLMStandin", "RecordedRequest", "Reply", "Responder", "approx_tokens"]

log = logging.getLogger(__name__)

DEFAULT_CONTENT = json.dumps({"entities": [], "facts": []})
MODEL = "standin"


@dataclass
class Reply:
    """One scripted answer. ``status`` >= 400 sends an OpenAI-style error body with ``content`` as message.

    ``truncate`` announces the full Content-Length, sends half the body and closes the connection;
    ``hang`` sends nothing for ``LLMStandin.hang_s`` seconds (client timeouts), then closes.
    ``body`` replaces the whole HTTP body with raw bytes (answers that are not an API response).
    """

    content: str = DEFAULT_CONTENT
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    truncate: bool = False
    hang: bool = False
    body: bytes | None = None
    finish_reason: str = "stop"

    @classmethod
    def json(cls, obj: Any, **kwargs: Any) -> Reply:
        """A successful answer whose content is ``obj`` as JSON text."""
        return cls(content=json.dumps(obj), **kwargs)

    @classmethod
    def error(cls, status: int = 500, message: str | None = None) -> Reply:
        return cls(content=message or f"stand-in: scripted HTTP {status}", status=status)

    @classmethod
    def rate_limited(cls, retry_after: float = 1) -> Reply:
        return cls(
            content="stand-in: scripted rate limit",
            status=429,
            headers={"Retry-After": f"{retry_after:g}"},
        )

    @classmethod
    def malformed(cls) -> Reply:
        """HTTP 200 whose body is not JSON at all (a broken proxy or gateway)."""
        return cls(body=b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{"mess')


Responder = Callable[[dict[str, Any]], "Reply | str | Mapping[str, Any] | None"]
"""Gets the request JSON; returns a Reply, a str (the content), a dict (sent as JSON content) or None
(no opinion: the next rule, then ``responder``, then the default answer)."""


@dataclass(frozen=True)
class RecordedRequest:
    timestamp: float
    model: str
    messages: list[dict[str, Any]]
    body: dict[str, Any]


def approx_tokens(text: str) -> int:
    """The stand-in's token count: ~4 characters per token, like OpenAI's rule of thumb; deterministic so
    tests can assert exact usage numbers."""
    return max(1, (len(text) + 3) // 4)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _coerce(answer: Reply | str | Mapping[str, Any]) -> Reply:
    if isinstance(answer, Reply):
        return answer
    if isinstance(answer, str):
        return Reply(content=answer)
    return Reply.json(dict(answer))


def _default_failure_mix() -> list[Reply]:
    return [Reply.error(500), Reply.error(503), Reply.rate_limited(1), Reply.malformed()]


class LLMStandin:
    """A threaded HTTP server speaking ``POST /v1/chat/completions``, ``POST /v1/messages`` (Anthropic),
    ``GET /v1/models``, ``GET /health``.

    Settings may be changed while it runs (tests script it per test): ``responder``, ``latency_s``
    (added to every chat completion), ``failure_rate`` / ``failure_mix``, ``hang_s``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        responder: Responder | None = None,
        latency_s: float = 0.0,
        failure_rate: float = 0.0,
        failure_mix: Sequence[Reply] | None = None,
        seed: int = 0,
        hang_s: float = 600.0,
    ) -> None:
        self.host = host
        self._requested_port = port
        self.responder = responder
        self.latency_s = latency_s
        self.failure_rate = failure_rate
        self.failure_mix: list[Reply] = list(failure_mix) if failure_mix is not None else _default_failure_mix()
        self.hang_s = hang_s
        self._initial_hang_s = hang_s  # what reset() restores
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []  # exceptions raised by rules/responders (answered with HTTP 500)
        self.failures_injected = 0
        self._rules: list[Responder] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> LLMStandin:
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = _Server((self.host, self._requested_port), _Handler, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="llm-standin", daemon=True
        )
        self._thread.start()
        # Restarts come back on the same port, like the other services.
        self._requested_port = self.port
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # releases handlers sleeping in hang / delay
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> LLMStandin:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("LLMStandin is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The OpenAI base URL (``api_base`` for litellm)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root(self) -> str:
        """The Anthropic base URL (``api_base`` for litellm's ``anthropic/`` models: it appends /v1/messages)."""
        return f"http://{self.host}:{self.port}"

    # -- scripting -----------------------------------------------------------------------------

    def script(self, *rules: Responder) -> None:
        """Replace the rule list; each request is answered by the first rule not returning None."""
        self._rules = list(rules)

    def inject_failures(self, rate: float, *, mix: Sequence[Reply] | None = None, seed: int | None = None) -> None:
        """Answer a random ``rate`` share of chat completions with a random member of ``mix``."""
        with self._lock:
            self.failure_rate = rate
            if mix is not None:
                self.failure_mix = list(mix)
            if seed is not None:
                self._rng = random.Random(seed)

    def reset(self, *, seed: int = 0) -> None:
        """Back to a fresh state: no rules or responder, no latency or failures, the constructor's hang time,
        no recorded requests."""
        with self._lock:
            self._rules = []
            self.responder = None
            self.latency_s = 0.0
            self.hang_s = self._initial_hang_s
            self.failure_rate = 0.0
            self.failure_mix = _default_failure_mix()
            self._rng = random.Random(seed)
            self.requests.clear()
            self.errors.clear()
            self.failures_injected = 0

    @property
    def calls(self) -> int:
        """Chat completion requests received so far (answered or not)."""
        with self._lock:
            return len(self.requests)

    # -- request handling (called from handler threads) ----------------------------------------

    def _record(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        entry = RecordedRequest(
            timestamp=time.time(),
            model=str(body.get("model", "")),
            messages=list(messages) if isinstance(messages, list) else [],
            body=body,
        )
        with self._lock:
            self.requests.append(entry)

    def _choose(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.failure_rate > 0 and self.failure_mix and self._rng.random() < self.failure_rate:
                self.failures_injected += 1
                return self._rng.choice(self.failure_mix)
        try:
            for rule in [*self._rules, self.responder]:
                if rule is not None and (answer := rule(body)) is not None:
                    return _coerce(answer)
        except Exception as exc:  # a broken test script must show up, not look like a model outage
            log.exception("LLM stand-in rule failed")
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return Reply.error(500, f"stand-in rule raised {type(exc).__name__}: {exc}")
        return Reply()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; False when interrupted by stop()."""
        return seconds <= 0 or not self._stopping.wait(seconds)

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt = "".join(_message_text(m) for m in body.get("messages", []) if isinstance(m, Mapping))
        prompt_tokens, completion_tokens = approx_tokens(prompt), approx_tokens(reply.content)
        return {
            "id": f"chatcmpl-standin-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or MODEL,
            "system_fingerprint": "engram-llm-standin",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _anthropic_message(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The reply as an Anthropic Messages API answer: a forced tool (``tool_choice`` of type "tool")
        gets the reply's JSON object as its ``tool_use`` input, anything else a text block."""
        system = body.get("system")
        system_text = _message_text({"content": system}) if system is not None else ""
        prompt = system_text + "".join(_message_text(m) for m in body.get("messages", []) if isinstance(m, Mapping))
        choice = body.get("tool_choice") if isinstance(body.get("tool_choice"), Mapping) else {}
        block: dict[str, Any] = {"type": "text", "text": reply.content}
        if choice.get("type") == "tool":
            try:
                value = json.loads(reply.content)
            except ValueError:
                value = None
            if isinstance(value, dict):
                tool_id = f"toolu_standin_{next(self._ids)}"
                block = {"type": "tool_use", "id": tool_id, "name": choice.get("name"), "input": value}
        stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
        if reply.finish_reason == "length":
            stop = "max_tokens"
        return {
            "id": f"msg_standin_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or MODEL,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": approx_tokens(prompt), "output_tokens": approx_tokens(reply.content)},
        }


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = {429: "rate_limit_error", 400: "invalid_request_error", 404: "not_found_error"}
    error_type = kind.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": None, "code": str(status)}}


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="OpenAI-compatible LLM stand-in with scripted answers.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every completion")
    parser.add_argument("--failure-rate", type=float, default=0.0, help="share of completions that fail")
    parser.add_argument("--seed", type=int, default=0, help="seed for the injected failures")
    parser.add_argument("--content", default=DEFAULT_CONTENT, help="the content of every answer")
    args = parser.parse_args(argv)

    content = args.content
    standin = LLMStandin(
        host=args.host,
        port=args.port,
        responder=lambda _request: Reply(content=content),
        latency_s=args.latency,
        failure_rate=args.failure_rate,
        seed=args.seed,
    )
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with standin:
        # The caller (a benchmark) reads this first line to learn the URL.
        print(standin.url, flush=True)
        done.wait()


if __name__ == "__main__":
    main()
