"""MCP over HTTP with two gateway replicas behind a round-robin proxy (no affinity): an MCP client of the
official SDK opens, lists tools, remembers, and recalls what the workers applied, each request answered by
whichever replica's turn it is. The gateway is stateless by default (``ENGRAM_GATEWAY_MCP_STATELESS``).

The control: the same proxy over two replicas with the SDK's sessions (the setting off) loses the session at
the first request the other replica answers, which is why stateful MCP needs affinity on ``Mcp-Session-Id``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.gateway import gateway_process, mint_keys
from tests.support.proxy import RoundRobinProxy
from tests.support.stack import SETTLE_S, Stack, engram_stack

pytestmark = pytest.mark.slow  # a fleet of processes


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, str], Path]]:
    key_secrets, entries = mint_keys()
    data = tmp_path_factory.mktemp("replicas")
    with engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack:
        stack.env["ENGRAM_API_KEYS"] = entries
        yield stack, key_secrets, data


@contextmanager
def _replicas(fleet: tuple[Stack, dict[str, str], Path], stateless: bool) -> Iterator[RoundRobinProxy]:
    """Two gateway processes on the fleet's Redis and store, and a round-robin proxy over them."""
    stack, _, data = fleet
    env = {**stack.env, "ENGRAM_GATEWAY_MCP_STATELESS": str(stateless).lower()}
    with ExitStack() as scope:
        # A fresh name (and log file) each time: a start waits for its own log's "startup complete" line.
        names = [f"gw-{uuid.uuid4().hex[:6]}-{i}" for i in (1, 2)]
        gateways = [scope.enter_context(gateway_process(env, data / "logs", name=name)) for name in names]
        with RoundRobinProxy([gw.url for gw in gateways]) as proxy:
            yield proxy


def _data(result: Any) -> Any:
    assert not result.is_error, result.content
    value = result.structured_content
    return value["result"] if isinstance(value, dict) and set(value) == {"result"} else value


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_session_works_across_two_replicas(mode: str, fleet: tuple[Stack, dict[str, str], Path]) -> None:
    """``legacy``: the initialize handshake of protocol 2025-11-25 and before, where the SDK's stateful mode
    would hand out an ``Mcp-Session-Id``; ``auto``: the SDK's newest protocol, sessionless by design."""
    stack, key_secrets, _ = fleet
    uid = f"appA.{uuid.uuid4().hex[:8]}"

    with _replicas(fleet, stateless=True) as proxy:

        async def scenario() -> None:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {key_secrets['a_rw']}"}, timeout=60) as http,
                Client(streamable_http_client(f"{proxy.url}/mcp", http_client=http), mode=mode) as mcp,
            ):
                names = {tool.name for tool in (await mcp.list_tools()).tools}
                assert names == {"remember", "recall", "get_context", "forget"}
                receipt = _data(await mcp.call_tool("remember", {"user_id": uid, "text": "I live in Austin"}))
                await asyncio.to_thread(stack.client.wait, [(uid, receipt["message_id"])], SETTLE_S)
                for _ in range(2):  # each replica answers a recall
                    items = _data(await mcp.call_tool("recall", {"user_id": uid, "query": "where does the user live?"}))
                    assert any("Austin" in item["statement"] for item in items)

        asyncio.run(scenario())
        posts = [f for f in proxy.log if f.method == "POST"]
        assert {f.backend for f in posts} == set(proxy.backends), "both replicas answered the session's requests"
        assert all(f.status < 400 and f.answered_session is None for f in posts), posts
        assert len(posts) >= 4  # (the handshake,) list_tools, remember, two recalls


def test_stateful_sessions_break_without_affinity(fleet: tuple[Stack, dict[str, str], Path]) -> None:
    _, key_secrets, _ = fleet
    with _replicas(fleet, stateless=False) as proxy:

        async def scenario() -> None:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {key_secrets['a_rw']}"}, timeout=60) as http,
                Client(streamable_http_client(f"{proxy.url}/mcp", http_client=http), mode="legacy") as mcp,
            ):
                await asyncio.wait_for(mcp.list_tools(), 60)

        with pytest.raises(ExceptionGroup) as failed:  # the SDK's task groups wrap its MCPError
            asyncio.run(scenario())
        assert "Session not found" in repr(failed.value)
        opened = proxy.log[0]
        assert opened.status == 200 and opened.answered_session  # the handshake opened a session on one replica
        lost = [f for f in proxy.log[1:] if f.backend != opened.backend]
        assert lost and lost[0].sent_session == opened.answered_session and lost[0].status == 404
