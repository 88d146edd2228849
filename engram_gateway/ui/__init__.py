"""The memory explorer: a browser page at ``/ui`` over the gateway's own ``/v1`` API.

Invariants:
- The page and its assets are files shipped inside this package (``static/``: HTML, CSS and ES modules,
  no build step); nothing is fetched from another origin, and the Content-Security-Policy says so
  (``default-src 'self'``, no inline script or style, no framing).
- The files hold no data and need no key. Every read and forget the page makes is a ``/v1`` call with the
  key the user typed, sent as ``Authorization: Bearer``: the same keys, scopes and namespaces as any
  client. The key lives in the tab's ``sessionStorage``, never in a URL.
- Only the files listed at import are served (a fixed map of names), so no path reaches the filesystem.
- What ``/v1`` lacked for the page (the calling key, a user list, an entity's neighbourhood) is in
  ``engram_gateway.ui.api``, a router with the same guard and Pydantic answers, in the OpenAPI schema.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse

from engram_gateway.ui.api import router

__all__ = ["STATIC", "install_ui", "router"]

STATIC = Path(__file__).resolve().parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new gateway version is picked up at the next load
}


def _assets() -> dict[str, str]:
    """name -> media type of every served file but the page itself."""
    return {p.name: _TYPES[p.suffix] for p in sorted(STATIC.iterdir()) if p.suffix in _TYPES and p.name != "index.html"}


def install_ui(app: FastAPI) -> None:
    """``/ui`` (the page) and ``/ui/assets/<name>``, and the explorer's ``/v1`` routes."""
    app.include_router(router)

    async def page(_: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)

    app.add_route("/ui", page, include_in_schema=False)
    for name, media_type in _assets().items():

        async def asset(_: Request, path: Path = STATIC / name, media_type: str = media_type) -> FileResponse:
            return FileResponse(path, media_type=media_type, headers=_HEADERS)

        app.add_route(f"/ui/assets/{name}", asset, include_in_schema=False)
