"""HTTP and MCP enqueue carry what the Python client does (``owner_name``, ``earlier``,
``utc_offset_minutes``) all the way into the extraction prompt: a real ``engram serve``, workers and the LLM
stand-in, whose recorded requests show the prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from engram_testing.llm_standin import Reply
from tests.support.gateway import GatewayProcess, gateway_process, mint_keys
from tests.support.stack import SETTLE_S, Stack, engram_stack

TURNS = [{"role": "user", "name": "Caroline", "content": "Moved in yesterday!"}]
EARLIER = [{"role": "assistant", "content": "How is the new flat?"}]
CONTEXT = {"owner_name": "Caroline", "earlier": EARLIER, "utc_offset_minutes": -300}


@pytest.fixture(scope="module")
def fleet(
    redis_url: str, llm_server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, GatewayProcess, dict]]:
    llm_server.script(lambda _req: Reply.json({"facts": []}))
    secrets, entries = mint_keys()
    data = tmp_path_factory.mktemp("gateway-context")
    with (
        engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=llm_server.url) as stack,
        gateway_process({**stack.env, "ENGRAM_API_KEYS": entries}, data / "logs") as gw,
    ):
        yield stack, gw, secrets


def prompt_of(llm_server, marker: str) -> str:
    for request in reversed(llm_server.requests):
        user = next(m["content"] for m in request.messages if m["role"] == "user")
        if marker in user:
            return user
    raise AssertionError(f"no prompt holds {marker!r}")


def assert_context_shown(prompt: str) -> None:
    assert "Memory owner: Caroline" in prompt
    assert "Caroline (memory owner): Moved in yesterday!" in prompt
    assert "assistant: How is the new flat?" in prompt.split("Conversation:")[0]  # an earlier turn, context only
    assert "2024-03-01T07:00:00-05:00" in prompt and "the sender's local time" in prompt


def test_http_enqueue_carries_owner_earlier_and_offset_into_the_prompt(fleet, llm_server) -> None:
    stack, gw, secrets = fleet
    body = {"user_id": "appA.carol", "messages": TURNS, "message_id": "h1", "timestamp": "2024-03-01T12:00:00Z"}
    headers = {"Authorization": f"Bearer {secrets['a_rw']}"}
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        assert http.post("/v1/messages", json={**body, **CONTEXT}, headers=headers).status_code == 202
        many = {"items": [{**body, "message_id": "h2", **CONTEXT}]}
        assert http.post("/v1/messages/batch", json=many, headers=headers).status_code == 202
    done = stack.client.wait([("appA.carol", "h1"), ("appA.carol", "h2")], timeout=SETTLE_S)
    assert sorted(done.applied) == ["h1", "h2"]
    assert_context_shown(prompt_of(llm_server, "Moved in yesterday!"))


def test_mcp_remember_carries_owner_earlier_and_offset_into_the_prompt(fleet, llm_server) -> None:
    stack, gw, secrets = fleet

    async def remember() -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {secrets['a_rw']}"}, timeout=60) as http,
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client,
        ):
            args = {"user_id": "appA.mcarol", "text": "Moved in yesterday!", "message_id": "m1",
                    "timestamp": "2024-03-01T12:00:00Z", **CONTEXT}  # fmt: skip
            result = await client.call_tool("remember", args)
            assert not result.is_error, result.content

    asyncio.run(remember())
    assert stack.client.wait([("appA.mcarol", "m1")], timeout=SETTLE_S).applied == ["m1"]
    prompt = prompt_of(llm_server, "Moved in yesterday!")
    assert "Memory owner: Caroline" in prompt and "assistant: How is the new flat?" in prompt
    assert "2024-03-01T07:00:00-05:00" in prompt
