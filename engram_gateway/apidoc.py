"""The API description: the OpenAPI schema as the gateway really behaves, and Swagger UI without a CDN.

Invariants:
- The schema names how to authenticate (``bearer``: ``Authorization: Bearer <key>``, or ``apiKey``:
  ``X-API-Key``) and, on every ``/v1`` operation that needs a key, requires one of the two and says the
  scope (``x-engram-scope``). Operations that need no key (health, liveness, readiness) list neither a
  security requirement nor 401 / 403 / 429.
- No operation lists 422: request validation errors are 400 problem bodies (``engram_gateway.problems``),
  so FastAPI's generated 422 and its ``HTTPValidationError`` schema are removed. Error bodies are
  described as ``application/problem+json``, the type they are sent with.
- Every operation that takes a user id (a ``user_id`` parameter, or a body naming user ids: enqueue, the
  batch) lists 421 Misdirected Request: a gateway serving one cell (``ENGRAM_CELL_INDEX``) refuses another
  cell's user with the ``wrong-cell`` problem and the user's cell in the ``Engram-Cell`` header
  (``engram_api.cells``); no other operation lists it.
- ``/docs`` loads Swagger UI from this process, never from the network: the bundle and stylesheet
  installed with litellm (a dependency) are served at ``/docs/assets/``. Without them ``/docs`` says so
  and links the schema (``/openapi.json``), instead of a page that stays blank offline.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.routing import APIRoute

from engram_gateway.guard import route_scope
from engram_gateway.problems import CELL_HEADER

__all__ = ["ASSETS", "install_docs", "swagger_assets"]

ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}
_SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "an API key from `engram keys new`"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": "the same key, another header"},
}
_KEY_ERRORS = ("401", "403", "429")  # a missing key, a scope, a key's rate
_PROBLEM = {"$ref": "#/components/schemas/Problem"}
_WRONG_CELL = {
    "description": "Misdirected Request: this gateway serves one cell (ENGRAM_CELL_INDEX) and the user is another's "
    "(problem type urn:engram:problem:wrong-cell, its field naming the user id); nothing was read or written. "
    f"Send the request to the cell in {CELL_HEADER}.",
    "headers": {CELL_HEADER: {"description": "the user's cell (0-based)", "schema": {"type": "integer"}}},
    "content": {"application/problem+json": {"schema": _PROBLEM}},
}


def _names_users(schema: dict[str, Any], schemas: dict[str, Any], depth: int = 0) -> bool:
    """Whether a request body of ``schema`` carries a ``user_id`` (in its fields, or its lists' items)."""
    if depth > 4:  # request models nest shallowly; a recursive schema must not loop
        return False
    if "$ref" in schema:
        schema = schemas.get(schema["$ref"].rsplit("/", 1)[-1], {})
    properties = schema.get("properties", {})
    if "user_id" in properties:
        return True
    nested = [*properties.values(), schema.get("items", {}), *schema.get("anyOf", [])]
    return any(_names_users(child, schemas, depth + 1) for child in nested if isinstance(child, dict))


def _takes_user(operation: dict[str, Any], schemas: dict[str, Any]) -> bool:
    if any(parameter.get("name") == "user_id" for parameter in operation.get("parameters", [])):
        return True
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return _names_users(body, schemas)


def swagger_assets() -> Path | None:
    """The folder of the installed Swagger UI files, or None. Found without importing litellm (slow)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "proxy" / "swagger"
    return folder if all((folder / name).is_file() for name in ASSETS) else None


def _schema(app: FastAPI, routers: tuple[APIRouter, ...]) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    scopes = {
        (route.path, method.lower()): route_scope(route)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            scope = scopes.get((path, method))
            responses = operation.get("responses", {})
            responses.pop("422", None)
            for response in responses.values():
                content = response.get("content", {})
                if content.get("application/json", {}).get("schema") == _PROBLEM:
                    content.pop("application/problem+json", None)
                    content["application/problem+json"] = content.pop("application/json")
            if _takes_user(operation, schema.get("components", {}).get("schemas", {})):
                responses["421"] = _WRONG_CELL
            if scope is None:
                for code in _KEY_ERRORS:
                    responses.pop(code, None)
            else:
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
                operation["x-engram-scope"] = scope
    components = schema.setdefault("components", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(unused, None)
    components["securitySchemes"] = _SECURITY_SCHEMES
    app.openapi_schema = schema
    return schema


def install_docs(app: FastAPI, *routers: APIRouter) -> None:
    """The schema at ``/openapi.json`` (FastAPI's route, this generator; ``routers``: those whose routes'
    scopes it names) and Swagger UI at ``/docs``. The app must be built with ``docs_url=None,
    redoc_url=None``: ReDoc has no installed copy."""
    app.openapi = lambda: _schema(app, routers)  # type: ignore[method-assign]
    folder = swagger_assets()

    async def docs(_: Request) -> HTMLResponse:
        if folder is None:
            return HTMLResponse(
                "<!doctype html><title>Engram gateway API</title><p>Swagger UI is not installed with this "
                'gateway; the OpenAPI schema is at <a href="/openapi.json">/openapi.json</a>.</p>'
            )
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="data:,",  # no icon rather than one from the network
        )

    app.add_route("/docs", docs, include_in_schema=False)
    if folder is None:
        return
    for name, media_type in ASSETS.items():

        async def asset(_: Request, path: Path = folder / name, media_type: str = media_type) -> FileResponse:
            return FileResponse(path, media_type=media_type)

        app.add_route(f"/docs/assets/{name}", asset, include_in_schema=False)
