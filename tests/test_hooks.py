"""Middleware hooks that raise, on real worker processes: retried like any unexpected error, then
dead-lettered with the traceback; never acked into oblivion."""

from __future__ import annotations

import time
import uuid

import pytest

from engram_api import keys
from engram_api.models import DeadLetter
from tests.support.stack import engram_stack

CASES = [(hook, stage) for hook in ("before", "after") for stage in ("extract", "apply")]


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory):
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("hooks"),
        neo4j_uri=None,
        llm_url=None,
        middleware="tests.support.faults:RaisingHook",
    ) as s:
        yield s


def _letters(client, wanted: dict[str, str], timeout: float = 120.0) -> dict[str, DeadLetter]:
    """Wait for a dead letter per message id. ``wait()`` is not enough here: a message whose extract
    ``after_stage`` hook fails may be applied first (the hand-over already happened) and dead-lettered after."""
    deadline = time.monotonic() + timeout
    while True:
        letters = {d.message_id: d for user in set(wanted.values()) for d in client.dead_letters(user)}
        if set(wanted) <= set(letters) or time.monotonic() > deadline:
            return letters
        time.sleep(0.2)


def test_a_hook_that_always_raises_is_retried_then_dead_lettered_with_its_traceback(stack):
    client, user = stack.client, f"u_{uuid.uuid4().hex[:10]}"
    ids = {f"hook-{hook}-{stage}-always-{uuid.uuid4().hex[:6]}": (hook, stage) for hook, stage in CASES}
    notify = f"hook-before-extract-always-notify-{uuid.uuid4().hex[:6]}"  # and its on_dead_letter raises too
    ids[notify] = ("before", "extract")
    for mid in ids:
        client.enqueue(user, "I live in Tampa.", message_id=mid)
    letters = _letters(client, dict.fromkeys(ids, user))
    for mid, (hook, stage) in ids.items():
        letter = letters.get(mid)
        assert letter is not None, f"{hook}_stage({stage}) failure lost message {mid}"
        assert (letter.stage, letter.attempts) == (stage, 3)
        assert f"RuntimeError: injected {hook}_stage failure ({stage})" in letter.reason
        assert "Traceback" in letter.reason and f"in {hook}_stage" in letter.reason
        # After a failed extract after_stage the apply task is already out: it may still finish the message.
        ended = {"dead", "applied"} if (hook, stage) == ("after", "extract") else {"dead"}
        assert client.redis.hget(keys.status(user, mid), "state") in ended
    assert "on_dead_letter hook failed: RuntimeError: injected on_dead_letter failure" in letters[notify].reason


def test_a_hook_that_raises_once_is_retried_and_the_message_applied(stack):
    client, user = stack.client, f"u_{uuid.uuid4().hex[:10]}"
    ids = [f"hook-{hook}-{stage}-once-{uuid.uuid4().hex[:6]}" for hook, stage in CASES]
    texts = ["I live in Tampa.", "I work at Acme.", "I like hiking.", "My sister is Ana."]
    receipts = [client.enqueue(user, text, message_id=mid) for mid, text in zip(ids, texts, strict=True)]
    result = client.wait(receipts, timeout=120)
    assert sorted(result.applied) == sorted(ids)
    for mid in ids:
        assert (stack.data_dir / "faults" / f"raised-{mid}").exists(), f"the hook never raised for {mid}"
    assert client.dead_letters(user) == []
    assert client.stats(user).episodes == len(ids)
