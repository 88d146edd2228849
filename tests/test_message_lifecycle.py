"""A message's life when something happens to it between the stages: its user or the message itself is
forgotten while it waits in the queue or between extract and apply, and the async client driving a real
fleet. Real Redis, SQLite, the offline extractor and real worker processes, started by each test at the
moment the scenario needs them (the stack starts with none).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from engram_api import AsyncMemoryClient, keys
from engram_api.ledger import DeadLetterStore
from engram_api.models import DeadLetter, MessageState
from engram_api.producer import build_envelope
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.operator_processes import wait_until
from tests.support.stack import SETTLE_S, Stack, engram_stack

pytestmark = pytest.mark.slow

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("lifecycle"),
        neo4j_uri=None,
        llm_url=None,
        workers=False,
        log_format="json",
    ) as s:
        yield s


def running(stack: Stack, name: str) -> None:
    """The stack's ``extract`` or ``apply`` worker, started unless it already runs."""
    if not any(proc.name == name for proc in stack.workers):
        stack.start_worker(name, {"extract": EXTRACT_WORKER, "apply": APPLY_WORKER}[name], concurrency=2)


def stage_outcomes(stack: Stack, stage: str) -> dict[tuple[str, str], str]:
    """(user id, message id) -> what the stage reported, from the worker's JSON log."""
    path = stack.data_dir / "logs" / f"{stage}.log"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return {
        (r["user_id"], r["message_id"]): r["message"].removeprefix(f"{stage} ")
        for r in records
        if r.get("name") == "engram.pipeline" and r.get("stage") == stage
    }


def user_keys(stack: Stack, user: str) -> list[str]:
    return [k for pattern in keys.user_keys_pattern(user) for k in stack.client.redis.scan_iter(match=pattern)]


def test_forgetting_a_queued_or_in_flight_message_stores_nothing(stack: Stack) -> None:
    client = stack.client
    queued_user, queued_msg, flight_user, flight_msg, keeper = (
        "lc_q_user",
        "lc_q_msg",
        "lc_f_user",
        "lc_f_msg",
        "lc_keep",
    )
    letters = DeadLetterStore(redis_client=client.redis, status_ttl_s=600)
    for user in (queued_user, keeper):
        envelope = build_envelope(client.settings, user, "I live in Quito.", message_id="old", timestamp=T0)
        letters.put(DeadLetter(user_id=user, message_id="old", stage="extract", reason="boom", envelope=envelope))

    # No worker yet: everything waits in the extract queue.
    for user in (queued_user, queued_msg, keeper):
        client.enqueue(user, "I live in Oslo.", message_id="m1", timestamp=T0)
    client.forget_user(queued_user)
    client.forget(queued_msg, "m1")
    assert user_keys(stack, queued_user) == []
    assert [d.user_id for d in client.dead_letters() if d.user_id in (queued_user, keeper)] == [keeper]

    # Extraction only: the next two messages stop between the stages, extracted, then are forgotten.
    running(stack, "extract")
    for user in (flight_user, flight_msg):
        client.enqueue(user, "I live in Lima.", message_id="m1", timestamp=T0)
    wait_until(
        lambda: all(
            client.redis.hget(keys.status(u, "m1"), "state") == MessageState.EXTRACTED
            for u in (flight_user, flight_msg, keeper)
        ),
        timeout=SETTLE_S,
        what="three messages extracted",
    )
    client.forget_user(flight_user)
    client.forget(flight_msg, "m1")

    running(stack, "apply")
    assert client.wait([(keeper, "m1")], timeout=SETTLE_S).applied == ["m1"]
    wait_until(
        lambda: {(flight_user, "m1"), (flight_msg, "m1")} <= stage_outcomes(stack, "apply").keys(),
        timeout=SETTLE_S,
        what="apply to take the two forgotten in-flight messages",
    )
    extracted, applied = stage_outcomes(stack, "extract"), stage_outcomes(stack, "apply")
    # The tombstone's word, read as each stage's task starts: neither stage did anything for them.
    assert extracted[(queued_user, "m1")] == extracted[(queued_msg, "m1")] == "forgotten"
    assert applied[(flight_user, "m1")] == applied[(flight_msg, "m1")] == "forgotten"
    for user in (queued_user, queued_msg, flight_user, flight_msg):
        stats = client.stats(user)
        assert (stats.facts, stats.entities, stats.episodes) == (0, 0, 0), user
        assert not client.redis.exists(keys.message_payload(user, "m1"), keys.extraction(user, "m1")), user
    assert client.stats(keeper).facts == 1
    assert not client.redis.exists(keys.status(flight_user, "m1"))


def test_the_async_client_awaits_every_method_concurrently(stack: Stack) -> None:
    running(stack, "extract")
    running(stack, "apply")
    user, other = "lc_async", "lc_async_gone"
    letters = DeadLetterStore(redis_client=stack.client.redis, status_ttl_s=600)
    for mid in ("dead-replay", "dead-drop"):
        envelope = build_envelope(stack.settings, user, "I like chess.", message_id=mid, timestamp=T0)
        letters.put(DeadLetter(user_id=user, message_id=mid, stage="extract", reason="boom", envelope=envelope))

    async def scenario() -> dict[str, Any]:
        async with AsyncMemoryClient(settings=stack.settings, redis_url=stack.env["REDIS_URL"]) as client:
            first, many, health, dead = await asyncio.gather(
                client.enqueue(user, "I live in Tampa.", message_id="a1", timestamp=T0),
                client.enqueue_many(
                    [
                        {"user_id": user, "messages": "My brother Alex works at Amazon.", "message_id": "a2"},
                        {"user_id": other, "messages": "I live in Oslo.", "message_id": "b1"},
                    ]
                ),
                client.health(),
                client.dead_letters(user),
            )
            replayed, dropped = await asyncio.gather(
                client.replay(user, "dead-replay"), client.drop_dead_letter(user, "dead-drop")
            )
            waited = await client.wait([first, *many, replayed], timeout=SETTLE_S)
            recall, search, context, history, page, stats = await asyncio.gather(
                client.recall(user, "where does the user live?", k=5),
                client.search(user, "brother", k=5),
                client.get_context(user, "where does the user live?"),
                client.history(user, "user", "LIVES_IN"),
                client.get_graph(user),
                client.stats(user),
            )
            rows, forgot, erased = await asyncio.gather(
                client.feedback(user, recall.recall_id, [recall.items[0].id]),
                client.forget(user, "a2"),
                client.forget_user(other),
            )
            await client.close()
            return locals()

    out = asyncio.run(scenario())
    assert out["health"].ok, out["health"]
    assert sorted(d.message_id for d in out["dead"]) == ["dead-drop", "dead-replay"]
    assert out["dropped"] is True and out["replayed"].message_id == "dead-replay"
    assert sorted(out["waited"].applied) == ["a1", "a2", "b1", "dead-replay"]
    assert out["recall"].items[0].statement == "User lives in Tampa"
    assert out["search"].facts and "Tampa" in out["context"]
    assert [f.object_name for f in out["history"]] == ["Tampa"]
    assert out["stats"].episodes == 3 and out["page"].facts
    assert out["rows"] == len(out["recall"].items)
    assert out["forgot"].episodes == 1 and out["erased"].episodes == 1
    assert stack.client.stats(other).facts == 0
