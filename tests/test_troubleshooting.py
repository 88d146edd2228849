"""docs/troubleshooting.md quotes errors as Engram prints them: each quoted here is provoked for real (the CLI
as a user runs it, or the library's own error) and must match the page's line, ``<...>`` standing for a
value of the user's. A changed message fails here until the page says it again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engram_api.errors import SchemaNotMigratedError, UserBusyError
from engram_api.models import WaitResult
from engram_api.producer import still_pending
from engram_api.storage.graph.neo4j.cypher import SCHEMA_VERSION
from engram_gateway.auth import AccessDeniedError, KeyRing, mint_key

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "troubleshooting.md").read_text()
_OUTSIDE = ("REDIS_URL", "NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD", "LLM_MODEL", "LLM_API_KEY", "LLM_API_BASE")


def shown(line: str, actual: str) -> None:
    """``line`` is on the page, and ``actual`` is it with each ``<...>`` filled in."""
    assert line in PAGE, f"docs/troubleshooting.md no longer shows: {line}"
    pattern = "".join(".+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", line))
    assert re.fullmatch(pattern, actual), f"the page shows\n  {line}\nEngram prints\n  {actual}"


def cli(tmp_path: Path, *args: str, **env: str) -> str:
    """The one error line of ``engram <args>`` on a fresh data directory, nothing configured."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k not in _OUTSIDE}
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", *args], env={**base, "ENGRAM_DATA_DIR": str(tmp_path), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ("enqueue", "alice", "hi"),
            {},
            "error: REDIS_URL: not set and no embedded Redis is running for <data dir> (start one with `engram up`, "
            "or set REDIS_URL=redis://host:port/0)",
        ),
        (
            ("enqueue", "../alice", "hi"),
            {},
            "error: invalid user_id: must be 1-128 characters of letters, digits, '_', '.', '@' or '-', starting "
            "with a letter or digit (got '<your id>')",
        ),
        (
            ("stats", "alice"),
            {"ENGRAM_APPLY_BATCH": "abc"},
            "error: ENGRAM_APPLY_BATCH: Input should be a valid integer, unable to parse string as an integer "
            "(got 'abc')",
        ),
        (
            ("stats", "alice"),
            {"NEO4J_URI": "bolt://127.0.0.1:1"},
            "error: Neo4j at <NEO4J_URI> is unavailable: <the driver's reason>",
        ),
        (
            ("serve", "--host", "0.0.0.0"),
            {},
            "error: ENGRAM_API_KEYS: no API key is configured, so the gateway only listens on 127.0.0.1 (asked for "
            "'0.0.0.0'); mint a key with `engram keys new`",
        ),
    ],
    ids=["no-redis", "user-id", "setting", "neo4j-down", "serve-without-keys"],
)
def test_the_cli_prints_what_the_page_shows(tmp_path: Path, args: tuple[str, ...], env: dict, line: str) -> None:
    shown(line, cli(tmp_path, *args, **env))


def test_the_library_and_gateway_errors_read_as_the_page_shows() -> None:
    shown(
        "error: the Neo4j database has no Engram schema, this code needs version <n>: run `engram migrate`",
        f"error: {SchemaNotMigratedError(None, SCHEMA_VERSION)}",
    )
    waited = still_pending(WaitResult(applied=["m1"], pending=["m2", "m3"]), 3, 60.0)
    shown(
        "WaitTimeoutError: <n> of <total> messages still pending after <seconds>s (first: [<message ids>])",
        f"{type(waited).__name__}: {waited}",
    )
    busy = UserBusyError("shop.alice")
    shown(
        "UserBusyError: user '<user>' is being written by another process; try again shortly",
        f"{type(busy).__name__}: {busy}",
    )

    key, spec = mint_key("reader", ["read"], "shop")
    ring = KeyRing([spec])
    refusals = {
        "`missing API key (send 'Authorization: Bearer <key>' or 'X-API-Key')`": lambda: ring.principal(None),
        "`unknown API key`": lambda: ring.principal("egk_not-a-key"),
        "`key '<name>' lacks the 'write' scope`": lambda: ring.principal(key).require("write"),
        "`user ids of key '<name>' start with '<namespace>.'`": lambda: ring.principal(key).user("blog.alice"),
    }
    for line, refuse in refusals.items():
        with pytest.raises(AccessDeniedError) as refused:
            refuse()
        shown(line, f"`{refused.value}`")
