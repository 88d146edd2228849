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

Here: the server's state, scripting and answers (``LLMStandin``); its replies and records are in
``llm_standin_replies``, its HTTP server and handler in ``llm_standin_http``; every public name imports from here.
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
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from engram_testing.llm_standin_http import _Handler, _Server
from engram_testing.llm_standin_replies import (
    DEFAULT_CONTENT,
    MODEL,
    RecordedRequest,
    Reply,
    Responder,
    _coerce,
    _default_failure_mix,
    _message_text,
    approx_tokens,
)

__all__ = ["DEFAULT_CONTENT", "LLMStandin", "RecordedRequest", "Reply", "Responder", "approx_tokens"]

log = logging.getLogger(__name__)


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
