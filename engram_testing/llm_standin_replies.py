"""What the LLM stand-in answers with and what it records: a scripted ``Reply``, the ``Responder``
contract, a ``RecordedRequest``, the stand-in's token count, and the body of an error answer.

Data only: nothing here opens a socket or starts a thread (worker processes import ``Reply`` helpers
without the server). A responder's ``None`` means "no opinion", never "answer empty";
``approx_tokens`` is deterministic, so tests can assert exact usage numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_CONTENT", "MODEL", "RecordedRequest", "Reply", "Responder", "approx_tokens"]

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


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = {429: "rate_limit_error", 400: "invalid_request_error", 404: "not_found_error"}
    error_type = kind.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": None, "code": str(status)}}
