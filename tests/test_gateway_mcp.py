"""The MCP server through real client sessions of the official SDK: stdio (``engram serve --mcp-stdio`` as a
child process) and streamable HTTP (``/mcp`` of a real ``engram serve``), with real workers behind both.

Every tool works; bad arguments, a missing or wrong key, a read-only key and another namespace's users get
a typed tool error (or a 401 before the session) and change nothing.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.gateway import GatewayProcess, footprint, gateway_process, mint_keys
from tests.support.stack import SETTLE_S, Stack, engram_stack
from tests.support.stack import SOURCE_ROOT as REPO_ROOT


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, GatewayProcess, dict]]:
    secrets, entries = mint_keys()
    data = tmp_path_factory.mktemp("mcp")
    with engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack:
        env = {**stack.env, "ENGRAM_API_KEYS": entries}
        with gateway_process(env, data / "logs") as gw:
            yield stack, gw, secrets


@asynccontextmanager
async def session(transport: str, fleet: tuple[Stack, GatewayProcess, dict], key: str) -> AsyncIterator[Client]:
    stack, gw, _ = fleet
    if transport == "stdio":
        env = {**stack.env, "ENGRAM_API_KEYS": _entries(fleet), "ENGRAM_API_KEY": key, "PYTHONPATH": str(REPO_ROOT)}
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "engram_workers.cli", "serve", "--mcp-stdio"], env=env, cwd=REPO_ROOT
        )
        async with Client(params) as client:
            yield client
    else:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client,
        ):
            yield client


def _entries(fleet: tuple[Stack, GatewayProcess, dict]) -> str:
    return fleet[1].process.env["ENGRAM_API_KEYS"]


def data(result: Any) -> Any:
    assert not result.is_error, result.content
    value = result.structured_content
    return value["result"] if isinstance(value, dict) and set(value) == {"result"} else value


def error_text(result: Any) -> str:
    assert result.is_error, result
    return str(result.content[0].text)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_every_tool(transport: str, fleet: tuple[Stack, GatewayProcess, dict]) -> None:
    stack, _, secrets = fleet
    uid = f"appA.{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        async with session(transport, fleet, secrets["a_rw"]) as mcp:
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            assert names == {"remember", "recall", "get_context", "forget"}
            receipt = data(
                await mcp.call_tool("remember", {"user_id": uid, "text": "I live in Austin", "message_id": "m1"})
            )
            assert receipt["message_id"] == "m1" and receipt["duplicate"] is False
            again = data(
                await mcp.call_tool("remember", {"user_id": uid, "text": "I live in Austin", "message_id": "m1"})
            )
            assert again["duplicate"] is True and again["task_id"] == receipt["task_id"]
            await asyncio.to_thread(stack.client.wait, [(uid, "m1")], SETTLE_S)
            items = data(await mcp.call_tool("recall", {"user_id": uid, "query": "where does the user live?", "k": 5}))
            assert any("Austin" in item["statement"] for item in items)
            then = data(
                await mcp.call_tool("recall", {"user_id": uid, "query": "where?", "as_of": "2000-01-01T00:00:00Z"})
            )
            assert then == []
            window = {"user_id": uid, "query": "where does the user live?"}
            inside = data(await mcp.call_tool("recall", {**window, "since": "2000-01-01T00:00:00Z"}))
            assert any("Austin" in item["statement"] for item in inside)
            assert data(await mcp.call_tool("recall", {**window, "until": "2000-01-01T00:00:00Z"})) == []
            # A fact that still holds overlaps any later window; the message that said it does not.
            future = data(await mcp.call_tool("recall", {**window, "since": "2999-01-01T00:00:00Z"}))
            assert [item["kind"] for item in future] == ["fact"]
            assert any(item["kind"] == "episode" for item in inside)
            context = data(await mcp.call_tool("get_context", {"user_id": uid, "query": "where does the user live?"}))
            assert "Austin" in context
            forgot = data(await mcp.call_tool("forget", {"user_id": uid, "memory_id": "m1"}))
            assert forgot["episodes"] == 1
            assert data(await mcp.call_tool("recall", {"user_id": uid, "query": "where does the user live?"})) == []

    asyncio.run(scenario())
    assert stack.client.graph.stats(uid).episodes == 0


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_bad_calls_are_typed_errors_and_change_nothing(
    transport: str, fleet: tuple[Stack, GatewayProcess, dict]
) -> None:
    stack, _, secrets = fleet
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    stack.client.wait(stack.client.enqueue(uid, "I live in Denver", message_id="m0"), timeout=SETTLE_S)
    before = footprint(stack, [uid])

    async def scenario() -> None:
        async with session(transport, fleet, secrets["a_rw"]) as mcp:
            cases = [
                ("remember", {"user_id": "appB.x", "text": "hi"}, "forbidden [user_id]"),
                ("remember", {"user_id": "bad id", "text": "hi"}, "invalid_input [user_id]"),
                ("remember", {"user_id": uid, "text": "   "}, "invalid_input [messages]"),
                ("remember", {"user_id": uid, "text": "hi", "message_id": "no spaces"}, "invalid_input [message_id]"),
                ("recall", {"user_id": uid, "query": "x", "k": 0}, "invalid_input [k]"),
                ("recall", {"user_id": uid, "query": "x", "as_of": "2024-01-01T00:00:00"}, "invalid_input [as_of]"),
                ("recall", {"user_id": uid, "query": "x", "since": "2024-01-01T00:00:00"}, "invalid_input [since]"),
                (
                    "recall",
                    {"user_id": uid, "query": "x", "since": "2024-02-01T00:00:00Z", "until": "2024-01-01T00:00:00Z"},
                    "invalid_input [until]",
                ),
                ("get_context", {"user_id": "appB.x", "query": "x"}, "forbidden [user_id]"),
                ("forget", {"user_id": uid, "memory_id": "bad id"}, "invalid_input [memory_id]"),
                ("forget", {"user_id": "appB.x", "memory_id": "m0"}, "forbidden [user_id]"),
                ("recall", {"user_id": uid, "query": "x", "k": "many"}, "k"),
                ("remember", {"user_id": uid}, "text"),
            ]
            for tool, args, expected in cases:
                text = error_text(await mcp.call_tool(tool, args))
                assert expected in text, (tool, args, text)
        async with session(transport, fleet, secrets["a_read"]) as ro:
            assert "forbidden: key" in error_text(await ro.call_tool("remember", {"user_id": uid, "text": "hi"}))
            assert "forbidden: key" in error_text(await ro.call_tool("forget", {"user_id": uid, "memory_id": "m0"}))
            assert data(await ro.call_tool("get_context", {"user_id": uid, "query": "where does the user live?"}))

    asyncio.run(scenario())
    assert footprint(stack, [uid]) == before


def test_http_mcp_needs_a_key(fleet: tuple[Stack, GatewayProcess, dict]) -> None:
    _, gw, _ = fleet
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer egk_wrong"}, {"X-API-Key": "nope"}):
        r = httpx.post(f"{gw.url}/mcp", json=hello, headers=headers)
        assert r.status_code == 401 and r.json()["type"] == "urn:engram:problem:unauthorized"


def test_stdio_with_a_wrong_key_does_not_start(fleet: tuple[Stack, GatewayProcess, dict]) -> None:
    import subprocess

    env = {**fleet[1].process.env, "ENGRAM_API_KEY": "egk_wrong"}
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", "serve", "--mcp-stdio"],
        env=env, cwd=REPO_ROOT, input="", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown API key" in done.stderr


def test_stdio_key_that_scopes_nothing_is_refused(fleet: tuple[Stack, GatewayProcess, dict]) -> None:
    """Issue 44, finding 11: ENGRAM_API_KEY without ENGRAM_API_KEYS used to run unscoped (every user)."""
    import subprocess

    env = {**fleet[1].process.env, "ENGRAM_API_KEY": fleet[2]["a_read"], "ENGRAM_API_KEYS": "[]"}
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", "serve", "--mcp-stdio"],
        env=env, cwd=REPO_ROOT, input="", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ENGRAM_API_KEY: is set but ENGRAM_API_KEYS configures no key"), done.stderr
