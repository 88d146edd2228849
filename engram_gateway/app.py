"""The ASGI app: the ``/v1`` routes, the MCP endpoint at ``/mcp``, the explorer at ``/ui``, problem bodies,
body limit, metrics.

Invariants:
- One ``Gateway`` (one ``MemoryClient``) per process, built before the app and closed on shutdown.
- ``serve`` refuses a non-loopback address when no API key is configured (``check_bind``), before the
  socket is opened.
- The body limit wraps everything, the MCP endpoint included: an oversized body never reaches a parser.
- ``RequestGuard`` (trusted hosts in local mode, keys for the API description) runs before any route;
  the routes' own key and scope checks run before their body is read (``engram_gateway.guard``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_api import tracing
from engram_api.redaction import RedactingFilter
from engram_api.settings import Settings, load_settings
from engram_gateway.apidoc import install_docs
from engram_gateway.auth import check_bind
from engram_gateway.guard import RequestGuard
from engram_gateway.mcp_server import build_mcp, mcp_http_endpoint
from engram_gateway.problems import BodyLimit, install_handlers
from engram_gateway.routes import router
from engram_gateway.service import Gateway
from engram_gateway.ui import install_ui
from engram_gateway.ui import router as ui_router

__all__ = ["create_app", "serve"]

log = logging.getLogger("engram.gateway")
# Probes answer every few seconds: spans of them would bury the traces of real requests.
_UNTRACED = "/v1/health,/v1/livez,/v1/readyz"
access = logging.getLogger("engram.gateway.access")


class _Counters:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "engram_gateway_requests_total", "HTTP requests by route and status", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "engram_gateway_request_seconds", "HTTP request time by route", ["route"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )  # fmt: skip


class _Metrics:
    """Counts, times and logs every request: one access line (``engram.gateway.access``) naming the method,
    the route template, the status, the time and the key's name; never the path (it holds user ids), a
    query or a body. Pure ASGI (no BaseHTTPMiddleware: that one copies every request and response through
    a second task)."""

    def __init__(self, app: ASGIApp, counters: _Counters) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            # The route template, not the path: user ids must not become label values.
            # A plain (non-API) route matched, /mcp or the docs, has a fixed path: that is its template.
            route = getattr(scope.get("route"), "path", None) or (scope["path"] if "endpoint" in scope else "unmatched")
            seconds = time.perf_counter() - start
            self.counters.requests.labels(route, str(status)).inc()
            self.counters.seconds.labels(route).observe(seconds)
            principal = scope.get("state", {}).get("principal")
            key = principal.name if principal is not None else "-"
            access.info("%s %s %d %.1f ms key=%s", scope["method"], route, status, seconds * 1e3, key)


def create_app(gateway: Gateway) -> FastAPI:
    mcp = build_mcp(gateway)
    endpoint = mcp_http_endpoint(mcp, gateway)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio

        try:
            await anyio.to_thread.run_sync(gateway.warm)
        except Exception as exc:  # a store down at start: serve anyway, /v1/health says what is wrong
            log.warning("warm-up failed: %s", exc)
        async with mcp.session_manager.run():
            yield
        gateway.close()

    app = FastAPI(
        title="Engram gateway",
        version="1",
        summary="Enqueue chat messages and read memory over HTTP; the same keys serve MCP at /mcp.",
        lifespan=lifespan,
        docs_url=None,  # install_docs: Swagger UI from installed files, not a CDN
        redoc_url=None,
    )
    install_docs(app, router, ui_router)
    app.state.gateway = gateway
    counters = _Counters(gateway.registry)  # beside the reader's metrics (``Gateway.registry``)
    app.state.registry = gateway.registry
    install_handlers(app)
    app.include_router(router)
    install_ui(app)  # the memory explorer at /ui and its /v1 routes
    app.add_route("/mcp", endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    settings = gateway.settings
    app.add_middleware(BodyLimit, limit=settings.gateway_max_body_bytes)
    app.add_middleware(
        RequestGuard,
        ring=gateway.ring,
        trusted_hosts=settings.gateway_trusted_hosts,
        public_docs=settings.gateway_public_docs,
    )
    app.add_middleware(_Metrics, counters=counters)
    if tracing.enabled():  # HTTP server spans, parents of the enqueue and recall spans a route runs
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, excluded_urls=_UNTRACED)
    return app


def serve(settings: Settings | None = None, *, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway with uvicorn until SIGINT/SIGTERM."""
    import uvicorn

    settings = settings or load_settings()
    tracing.configure(settings, service="engram-gateway")
    gateway = Gateway(settings)
    host = host or settings.gateway_host
    check_bind(host, gateway.ring)
    app = create_app(gateway)
    uvicorn.run(app, host=host, port=port or settings.gateway_port, log_config=_log_config(settings))


def _log_config(settings: Settings) -> dict[str, Any]:
    """uvicorn's logging, with the gateway's own lines (``engram.gateway``: warnings and the access line)
    on the same handler, and every line redacted. uvicorn's access log stays off: it prints the path,
    which holds user ids."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": RedactingFilter, "secrets": settings.secrets}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["loggers"]["uvicorn.access"] = {"handlers": [], "level": "WARNING", "propagate": False}
    config["loggers"]["engram.gateway"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config
