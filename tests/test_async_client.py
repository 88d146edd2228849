"""``AsyncMemoryClient``'s own methods, not only the ones it wraps by name: the export it reads whole in a
worker thread, and an import of it, round trip a user's memory (embedded store, no workers)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engram_api import AsyncMemoryClient
from tests.support.memory import apply_in_process
from tests.support.stack import engram_stack

T0 = datetime(2024, 2, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory):
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("async"), neo4j_uri=None, llm_url=None, workers=False
    ) as s:
        yield s


def test_the_async_export_and_import_round_trip_a_users_memory(stack):
    sync, user = stack.client, f"as_{uuid.uuid4().hex[:10]}"
    for i, text in enumerate(["I live in Tampa.", "I like hiking.", "I moved to Austin."]):
        apply_in_process(sync, user, f"{user}-m{i}", text, T0 + timedelta(days=10 * i))
    expected = list(sync.export_memory(user))

    async def scenario() -> tuple[list[str], int, list[str]]:
        async with AsyncMemoryClient(settings=stack.settings, redis_url=stack.env["REDIS_URL"]) as client:
            exported = await client.export_memory(user)
            await client.forget_user(user)
            emptied = (await client.stats(user)).episodes
            await client.import_memory(exported)
            return exported, emptied, await client.export_memory(user)

    def body(lines: list[str]) -> list[dict]:
        rows = [json.loads(line) for line in lines]
        rows[0].pop("exported_at")
        return rows

    exported, emptied, again = asyncio.run(scenario())
    assert body(exported) == body(expected) and len(exported) > 3  # a header, three episodes, facts, chunks
    assert emptied == 0
    assert body(again) == body(expected)
    assert [f.object_name for f in sync.history(user, "user", "LIVES_IN")] == ["Tampa", "Austin"]
