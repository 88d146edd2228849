"""What runs before a request body is read: the trusted-host check, the key and scope of each route.

Invariants:
- A ``/v1`` route names its scope once, in its signature (``who: Reader`` / ``Writer`` / ``Operator``);
  ``GuardedRoute`` authenticates the key and checks that scope before a byte of the body is read, so a
  key without the scope (or no key) costs one digest and a dict lookup however large the body is. Then
  the key's request rate is counted (429 past it), and only then is the body read, bounded by
  ``BodyLimit`` (413 past the limit, chunked or not), and parsed.
- Local mode (no key configured) answers only requests whose ``Host`` is loopback (``localhost``,
  ``127.0.0.1``, ``[::1]``, any port) or one of ``ENGRAM_GATEWAY_TRUSTED_HOSTS``, and refuses a browser
  ``Origin`` that is not one of those: a web page the user visits cannot reach the keyless gateway by
  rebinding its own name to 127.0.0.1 (421), nor post to it cross-origin (403).
- With keys configured, the API description (``/openapi.json``, ``/docs``) needs a valid key
  of any scope unless ``ENGRAM_GATEWAY_PUBLIC_DOCS`` is set; in local mode it is as open as the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from engram_api.settings import Scope as KeyScope
from engram_gateway.auth import AccessDeniedError, KeyRing, Principal
from engram_gateway.problems import problem_response

__all__ = [
    "DOC_PATHS",
    "Caller",
    "GuardedRoute",
    "Operator",
    "Reader",
    "RequestGuard",
    "Writer",
    "principal_of",
    "route_scope",
]

DOC_PATHS = frozenset({"/openapi.json", "/docs"})  # the Swagger UI assets are public files
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def principal_of(ring: KeyRing, headers: Iterable[tuple[bytes, bytes]]) -> Principal:
    """The principal of a request's raw ASGI headers (401 without a valid key, ``LOCAL`` in local mode)."""
    found = {k.lower(): v.decode("latin-1") for k, v in headers if k.lower() in (b"authorization", b"x-api-key")}
    return ring.from_headers(found.get(b"authorization"), found.get(b"x-api-key"))


class Caller:
    """The dependency a route names its scope with: the principal ``GuardedRoute`` already checked."""

    def __init__(self, scope: KeyScope) -> None:
        self.scope = scope

    async def __call__(self, request: Request) -> Principal:
        return request.state.principal  # type: ignore[no-any-return]


Reader = Annotated[Principal, Depends(Caller("read"))]
Writer = Annotated[Principal, Depends(Caller("write"))]
Operator = Annotated[Principal, Depends(Caller("operator"))]


def route_scope(route: APIRoute) -> KeyScope | None:
    """The scope a route names in its signature; None for a route that needs no key (/v1/health)."""
    scopes = {dep.call.scope for dep in route.dependant.dependencies if isinstance(dep.call, Caller)}
    if len(scopes) > 1:
        raise TypeError(f"route {route.path} names more than one scope: {sorted(scopes)}")
    return next(iter(scopes), None)


class GuardedRoute(APIRoute):
    """A route that checks the key and its scope first, then reads the body, then lets FastAPI parse it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        scope = route_scope(self)
        if scope is None:  # /v1/health: no key
            return handler

        async def guarded(request: Request) -> Response:
            principal = principal_of(request.app.state.gateway.ring, request.scope["headers"])
            principal.require(scope)
            request.state.principal = principal
            request.app.state.gateway.rates.admit(principal.name)
            # Read here, outside FastAPI's body parsing: there an error reading (BodyLimit's, for a
            # chunked body past the limit) would become a 400; here it reaches BodyLimit, which answers 413.
            await request.body()
            return await handler(request)

        return guarded


def _host_name(value: str) -> str:
    """'example.org:8080' -> 'example.org'; '[::1]:8080' -> '::1' (lower case)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class RequestGuard:
    """Pure ASGI: the trusted-host check of local mode and the key check of the API description."""

    def __init__(self, app: ASGIApp, ring: KeyRing, trusted_hosts: Iterable[str], public_docs: bool) -> None:
        self.app = app
        self.ring = ring
        self.hosts = LOCAL_HOSTS | {_host_name(h) for h in trusted_hosts}
        self.public_docs = public_docs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        headers = dict(scope.get("headers") or [])
        if self.ring.local_mode:
            host = _host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.hosts:
                return problem_response(
                    421, "untrusted-host", "Untrusted Host",
                    f"no API key is configured, so only requests to {sorted(self.hosts)} are answered "
                    "(add the name to ENGRAM_GATEWAY_TRUSTED_HOSTS, or configure keys)",
                )  # fmt: skip
            origin = headers.get(b"origin")
            if origin is not None and _host_name(urlsplit(origin.decode("latin-1")).netloc) not in self.hosts:
                return problem_response(
                    403, "untrusted-origin", "Untrusted Origin",
                    "no API key is configured, so requests from other web origins are refused",
                )  # fmt: skip
            return None
        if scope["path"] in DOC_PATHS and not self.public_docs:
            try:
                principal_of(self.ring, scope.get("headers") or [])
            except AccessDeniedError as exc:
                return problem_response(
                    401, "unauthorized", "Unauthorized", f"the API description needs a key: {exc}",
                    headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
        return None
