"""Engram memory as MCP tools (official ``mcp`` SDK): remember, recall, get_context, forget.

Transports: streamable HTTP at ``/mcp`` of the gateway app (``engram serve``), and stdio
(``engram serve --mcp-stdio``, for agent frameworks that launch a command).

Invariants:
- Stateless over HTTP by default (``ENGRAM_GATEWAY_MCP_STATELESS``): each request is answered by a fresh
  transport and server session (the SDK's stateless mode), with no ``Mcp-Session-Id``, so consecutive
  requests of one client may go to different gateway replicas; ``tests/test_mcp_replicas.py`` runs a
  client through a round-robin proxy over two. Turned off, sessions live in one process's memory.
- The same keys and namespaces as the HTTP API. Over HTTP the key comes with every request
  (``Authorization: Bearer`` or ``X-API-Key``): a request without a valid key is refused with a 401
  problem before the MCP session sees it, and each tool call resolves its principal from that request's
  headers. Each request counts against its key's rate, and with sessions a new session against its key's
  session cap (429 ``rate-limited`` beyond either). Over stdio the key is the process's ``ENGRAM_API_KEY``, checked once at start (refused when
  no key is configured to check it against).
- Tools go through ``Gateway`` like the routes, so validation, scopes, namespaces and back-pressure are
  the same; a refused call is an MCP tool error whose text starts with the error kind and names the
  field, and it changed nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Message, Receive, Scope, Send

from engram_api.errors import ConfigError, EngramError, InvalidInputError, StoreUnavailableError
from engram_gateway.auth import AccessDeniedError, Principal
from engram_gateway.guard import principal_of
from engram_gateway.problems import buffered, problem_response, rate_limited_response
from engram_gateway.quotas import RateLimitedError
from engram_gateway.service import Gateway

__all__ = ["build_mcp", "mcp_http_endpoint", "run_stdio"]

_SESSION_HEADER = b"mcp-session-id"

_INSTRUCTIONS = (
    "Long-term memory of users. `remember` queues what a user said (extraction runs in the background, "
    "so a fact is recallable a moment later); `recall` and `get_context` read what is known; `forget` "
    "removes one remembered message and what only it stated. User ids are '<namespace>.<user>'."
)


def _tool_error(exc: EngramError) -> ToolError:
    if isinstance(exc, InvalidInputError):
        return ToolError(f"invalid_input [{exc.field}]: {exc.problem}")
    if isinstance(exc, AccessDeniedError):
        kind = "unauthorized" if exc.status == 401 else "forbidden"
        return ToolError(f"{kind}{f' [{exc.field}]' if exc.field else ''}: {exc}")
    return ToolError(f"{type(exc).__name__}: {exc}")


def build_mcp(gateway: Gateway, *, stdio_principal: Principal | None = None) -> MCPServer:
    """The tools; ``stdio_principal`` is who a stdio session acts as (HTTP calls carry their own key)."""
    mcp = MCPServer("engram", instructions=_INSTRUCTIONS)

    def who(ctx: Context) -> Principal:
        headers = ctx.headers
        if headers is None:
            if stdio_principal is None:
                raise AccessDeniedError(401, "no API key for this session")
            return stdio_principal
        return gateway.ring.from_headers(headers.get("authorization"), headers.get("x-api-key"))

    def call(ctx: Context, fn: Any) -> Any:
        try:
            try:
                return fn(who(ctx))
            except StoreUnavailableError:
                if not gateway.follow_redis():  # the embedded Redis restarted elsewhere: try it once
                    raise
                return fn(who(ctx))
        except EngramError as exc:
            raise _tool_error(exc) from None

    @mcp.tool()
    def remember(
        user_id: str,
        text: str,
        ctx: Context,
        message_id: str | None = None,
        timestamp: datetime | None = None,
        owner_name: str | None = None,
        earlier: list[dict[str, str]] | None = None,
        utc_offset_minutes: int | None = None,
    ) -> dict[str, Any]:
        """Queue something the user said for memory; returns a receipt at once (never waits for extraction).
        timestamp: when it was said; owner_name: the user's name in the chat; earlier: preceding turns
        ({role, content, name?}) shown to the extractor as context only; utc_offset_minutes: the sender's."""
        context = {
            k: v
            for k, v in {"owner_name": owner_name, "earlier": earlier, "utc_offset_minutes": utc_offset_minutes}.items()
            if v is not None
        }
        receipt = call(
            ctx, lambda p: gateway.enqueue(p, user_id, text, message_id=message_id, timestamp=timestamp, **context)
        )
        return receipt.model_dump(mode="json")  # type: ignore[no-any-return]

    @mcp.tool()
    def recall(
        user_id: str,
        query: str,
        ctx: Context,
        k: int = 10,
        as_of: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Facts and conversation excerpts about the user that match the query, best first (as_of: what
        was true then; since / until: only what happened in [since, until), ISO 8601 with a zone)."""

        def run(p: Principal) -> Any:
            reader, uid = gateway.reader_for(p, user_id)
            return reader.recall(uid, query, k, as_of=as_of, since=since, until=until)

        result = call(ctx, run)
        return [
            {"id": i.id, "kind": i.kind, "statement": i.statement, "event_time": i.event_time.isoformat(),
             "valid_from": i.valid_from.isoformat(), "current": i.current, "score": i.score}
            for i in result.items
        ]  # fmt: skip

    @mcp.tool()
    def get_context(user_id: str, query: str, ctx: Context, max_tokens: int = 800) -> str:
        """A prompt-ready block about the user within max_tokens: current facts (each with the date it became
        true), then dated conversation excerpts that match the query."""

        def run(p: Principal) -> Any:
            reader, uid = gateway.reader_for(p, user_id)
            return reader.get_context(uid, query, max_tokens)

        return call(ctx, run)  # type: ignore[no-any-return]

    @mcp.tool()
    def forget(user_id: str, memory_id: str, ctx: Context) -> dict[str, Any]:
        """Forget one remembered message (memory_id = its message id) and the facts only it stated."""

        def run(p: Principal) -> Any:
            reader, uid = gateway.reader_for(p, user_id, "write")
            return reader.forget(uid, memory_id)

        return call(ctx, run).model_dump(mode="json")  # type: ignore[no-any-return]

    return mcp


def mcp_http_endpoint(mcp: MCPServer, gateway: Gateway) -> Any:
    """The streamable-HTTP ASGI endpoint, behind the key check and the key's quotas."""
    # The SDK's own Host/Origin allow-list is off: the app's RequestGuard applies the same rule to /v1 and
    # /mcp alike (local mode only, with ENGRAM_GATEWAY_TRUSTED_HOSTS), and keys authenticate the rest.
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    stateless = gateway.settings.gateway_mcp_stateless
    mcp.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=security,
        json_response=True,
        stateless_http=stateless,
        session_idle_timeout=None if stateless else gateway.sessions.idle_s,  # the session ledger's is the SDK's
    )
    return _KeyedEndpoint(StreamableHTTPASGIApp(mcp.session_manager), gateway, sessions=not stateless)


class _KeyedEndpoint:
    """An ASGI app (a class, so Starlette's Route passes scope/receive/send rather than a Request)."""

    def __init__(self, inner: StreamableHTTPASGIApp, gateway: Gateway, *, sessions: bool) -> None:
        self.inner = inner
        self.gateway = gateway
        self.sessions = sessions  # stateless: no session opens, so none is counted against the key's cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        session = headers.get(_SESSION_HEADER, b"").decode("latin-1") or None
        try:
            principal = principal_of(self.gateway.ring, scope.get("headers") or [])
            self.gateway.rates.admit(principal.name)
            if self.sessions and session is None and scope["method"] == "POST":  # an opening request
                self.gateway.sessions.check_room(principal.name)
        except AccessDeniedError as exc:
            await problem_response(401, "unauthorized", "Unauthorized", str(exc))(scope, receive, send)
            return
        except RateLimitedError as exc:
            await rate_limited_response(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal  # for the access log line (the key's name)
        key, sessions = principal.name, self.gateway.sessions
        if session is not None:
            sessions.touched(key, session)

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start" and session is None and message["status"] < 400:
                opened = dict(message.get("headers") or []).get(_SESSION_HEADER)
                if opened:
                    sessions.opened(key, opened.decode("latin-1"))
            await send(message)

        # The key is good: read the body now, so that one past the limit reaches BodyLimit (413) instead
        # of the SDK, which would answer a reading error with a 500.
        await self.inner(scope, await buffered(receive), recording_send)
        if session is not None and scope["method"] == "DELETE":
            sessions.closed(key, session)


def run_stdio(gateway: Gateway) -> None:
    """Serve MCP over stdin/stdout as the principal of ``ENGRAM_API_KEY``; with no key configured, as the
    local caller, and then only if ``ENGRAM_API_KEY`` is unset too: a key that scopes nothing is refused
    rather than silently ignored (the session would reach every user)."""
    if gateway.ring.local_mode and gateway.settings.api_key:
        raise ConfigError(
            "ENGRAM_API_KEY",
            "is set but ENGRAM_API_KEYS configures no key, so it would scope nothing and the session would "
            "reach every user: add the key's entry (`engram keys new`) to ENGRAM_API_KEYS, or unset "
            "ENGRAM_API_KEY to run as the local caller",
        )
    principal = gateway.ring.principal(gateway.settings.api_key)
    mcp = build_mcp(gateway, stdio_principal=principal)
    try:
        mcp.run("stdio")
    finally:
        gateway.close()
