"""Errors as HTTP: every failure is an RFC 9457 problem body (``application/problem+json``).

Invariants:
- The library's typed errors map one to one: ``InvalidInputError`` 400 (``field`` named), ``NotFoundError``
  404, a duplicate message id 409 (with the original receipt), ``BackPressureError`` 429 and
  ``StoreUnavailableError`` 503 (both with ``Retry-After``), a key over its quota 429 (``rate-limited``,
  with ``Retry-After``), a missing/unknown key 401, a key without the
  scope or namespace 403, a body over ``ENGRAM_GATEWAY_MAX_BODY_BYTES`` 413, a user of another cell
  (``WrongCellError``) 421 Misdirected Request with the user's cell in ``Engram-Cell``.
- Request-model validation errors (wrong types, unknown fields) are 400 too, naming the first bad field
  the way the library does (``items[3].messages``), so clients handle one shape; only the first is
  reported (the models' bounds keep the list pydantic builds short).
- Handlers only format: every check ran before anything was written, so an error response means nothing
  changed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_api.cells import WrongCellError
from engram_api.errors import (
    BackPressureError,
    EngramError,
    InvalidInputError,
    NotFoundError,
    StoreUnavailableError,
)
from engram_api.models import Receipt
from engram_gateway.auth import AccessDeniedError
from engram_gateway.quotas import RateLimitedError

__all__ = [
    "CELL_HEADER",
    "BodyLimit",
    "DuplicateMessageError",
    "Problem",
    "buffered",
    "install_handlers",
    "problem_response",
    "rate_limited_response",
]

log = logging.getLogger("engram.gateway")
STORE_RETRY_AFTER_S = 5
CELL_HEADER = "Engram-Cell"  # on a 421: the cell the user belongs to, for the router to resend it there


class Problem(BaseModel):
    """The error body of every non-2xx answer."""

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None
    receipt: Receipt | None = None


class DuplicateMessageError(EngramError):
    """The message id is already known for this user: applied once, never twice (``receipt`` is the first)."""

    def __init__(self, receipt: Receipt) -> None:
        self.receipt = receipt
        super().__init__(f"message {receipt.message_id!r} was already enqueued for {receipt.user_id!r}")


def problem_response(
    status: int, kind: str, title: str, detail: str, *, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = Problem(type=f"urn:engram:problem:{kind}", title=title, status=status, detail=detail, field=field)
    return JSONResponse(
        body.model_dump(exclude_none=True), status_code=status, headers=headers, media_type="application/problem+json"
    )


# How pydantic tags the branch of a union (or a wrapped validator) in an error location.
_BRANCH_TAGS = ("function-", "union[", "str", "constrained-", "list[", "json-or-python")
_UNION_BRANCHES = 8  # errors looked at for the deepest branch: the request models' unions have two


def rate_limited_response(exc: RateLimitedError) -> JSONResponse:
    return problem_response(
        429, "rate-limited", "Key over its quota", str(exc), headers={"Retry-After": exc.retry_after}
    )


def _loc(loc: tuple[Any, ...]) -> str:
    """('body', 'items', 3, 'messages') -> 'items[3].messages' (the library's way of naming a field)."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(_BRANCH_TAGS):
            out += f".{part}" if out else str(part)
    return out or "body"


def _first_error(errors: Sequence[Any]) -> Any:
    """The first field that failed. A union (``messages``: string or list of turns) fails once per branch, on
    consecutive errors of the same field: the deepest of those is the branch the input was meant for (a list
    with a bad role), the others only say "not a string"."""
    first = errors[0]
    field = _field_part(tuple(first.get("loc", ())))
    same = [e for e in errors[:_UNION_BRANCHES] if _field_part(tuple(e.get("loc", ()))) == field]
    # Deepest first; at equal depth, a branch that took the input's type (a list too long) over one that
    # did not (not a string).
    return max(same, key=lambda e: (len(e.get("loc", ())), not str(e.get("type", "")).endswith("_type")))


def _field_part(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The location up to the first union branch tag: what names the field, whichever branch failed."""
    for i, part in enumerate(loc):
        if isinstance(part, str) and part.startswith(_BRANCH_TAGS):
            return loc[:i]
    return loc


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = _first_error(exc.errors())
        field = _loc(tuple(err.get("loc", ())))
        kind = "unknown-field" if err.get("type") == "extra_forbidden" else "invalid-input"
        return problem_response(400, kind, "Invalid input", f"invalid {field}: {err.get('msg')}", field=field)

    @app.exception_handler(InvalidInputError)
    async def _invalid(_: Request, exc: InvalidInputError) -> JSONResponse:
        return problem_response(400, "invalid-input", "Invalid input", str(exc), field=exc.field)

    @app.exception_handler(AccessDeniedError)
    async def _denied(_: Request, exc: AccessDeniedError) -> JSONResponse:
        if exc.status == 401:
            return problem_response(
                401, "unauthorized", "Unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"}
            )
        return problem_response(403, "forbidden", "Forbidden", str(exc), field=exc.field)

    @app.exception_handler(WrongCellError)
    async def _wrong_cell(_: Request, exc: WrongCellError) -> JSONResponse:
        return problem_response(
            421, "wrong-cell", "Misdirected request", str(exc), field=exc.field, headers={CELL_HEADER: str(exc.cell)}
        )

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return problem_response(404, "not-found", "Not found", str(exc))

    @app.exception_handler(DuplicateMessageError)
    async def _duplicate(_: Request, exc: DuplicateMessageError) -> JSONResponse:
        body = Problem(
            type="urn:engram:problem:duplicate",
            title="Duplicate message id",
            status=409,
            detail=f"{exc}; the message is queued or applied once, this request changed nothing",
            receipt=exc.receipt,
        )
        return JSONResponse(
            body.model_dump(mode="json", exclude_none=True), status_code=409, media_type="application/problem+json"
        )

    @app.exception_handler(BackPressureError)
    async def _back_pressure(_: Request, exc: BackPressureError) -> JSONResponse:
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return problem_response(429, "back-pressure", "Too many queued", str(exc), headers={"Retry-After": retry})

    @app.exception_handler(RateLimitedError)
    async def _rate_limited(_: Request, exc: RateLimitedError) -> JSONResponse:
        return rate_limited_response(exc)

    @app.exception_handler(StoreUnavailableError)
    async def _unavailable(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        log.warning("store unavailable: %s", exc)
        request.app.state.gateway.follow_redis()  # so that the retry reaches a restarted embedded Redis
        return problem_response(
            503,
            "store-unavailable",
            "Store unavailable",
            "a backing store (Redis or the graph store) cannot be reached; nothing was changed",
            headers={"Retry-After": str(STORE_RETRY_AFTER_S)},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(exc.status_code, kind, str(exc.detail), str(exc.detail), headers=exc.headers)

    @app.exception_handler(EngramError)
    async def _engram(_: Request, exc: EngramError) -> JSONResponse:
        log.error("unmapped Engram error: %r", exc)
        return problem_response(500, "internal", "Internal error", f"{type(exc).__name__}: {exc}")


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes, by Content-Length or while streaming (chunked),
    before the route reads it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._reject(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413, "too-large", "Request body too large", f"request bodies are limited to {self.limit} bytes"
        )
        await response(scope, receive, send)


async def buffered(receive: Receive) -> Receive:
    """Read the whole request body now (under ``BodyLimit``: ``BodyTooLarge`` past the limit) and return a
    ``receive`` that hands it over in one message, then passes through (``http.disconnect``)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            first: Message = message
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            break
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
