"""``engram serve`` (the HTTP API and MCP server) and ``engram keys new`` (mint a gateway API key).

The key secret is printed once and never stored: ``ENGRAM_API_KEYS`` holds only its SHA-256.
"""

from __future__ import annotations

import json

import click

from engram_workers.cli._common import settings

__all__ = ["COMMANDS"]


@click.command(short_help="Run the HTTP API (/v1) and MCP server (/mcp, or --mcp-stdio).")
@click.option("--host", help="Interface to listen on (default ENGRAM_GATEWAY_HOST, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default ENGRAM_GATEWAY_PORT, 8080).")
@click.option("--mcp-stdio", is_flag=True, help="Serve MCP over stdin/stdout instead (key: ENGRAM_API_KEY).")
def serve(host: str | None, port: int | None, mcp_stdio: bool) -> None:
    """Run the gateway: enqueue and read memory over HTTP (OpenAPI at /docs) and as MCP tools.

    Keys come from ENGRAM_API_KEYS (mint one with `engram keys new`). With no key configured the gateway
    refuses to listen anywhere but 127.0.0.1.
    """
    current = settings()
    if mcp_stdio:
        from engram_gateway.mcp_server import run_stdio
        from engram_gateway.service import Gateway

        run_stdio(Gateway(current))
        return
    from engram_gateway import serve as run

    run(current, host=host, port=port)


@click.group(short_help="Gateway API keys.")
def keys() -> None:
    """Gateway API keys (only their SHA-256 is configured, in ENGRAM_API_KEYS)."""


@keys.command("new", short_help="Mint a key: prints the secret once and its ENGRAM_API_KEYS entry.")
@click.option("--name", required=True, help="A label for logs and metrics (not secret).")
@click.option("--namespace", required=True, help="User ids this key may touch: '<namespace>.*'; '*' = all users.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["read", "write", "operator"]),
    default=("read", "write"),
    show_default=True,
    help="Repeatable.",
)
def new(name: str, namespace: str, scopes: tuple[str, ...]) -> None:
    """Mint a key. Give the secret to the application; append the entry to ENGRAM_API_KEYS (a JSON list)."""
    from pydantic import ValidationError

    from engram_api.errors import InvalidInputError
    from engram_gateway.auth import mint_key

    try:
        key, spec = mint_key(name, scopes, namespace)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InvalidInputError(f"--{err['loc'][0]}", err["msg"]) from None
    click.echo(f"key:   {key}")
    click.echo(f"entry: {json.dumps(spec.model_dump(mode='json') | {'scopes': sorted(spec.scopes)})}")


COMMANDS = [serve, keys]
