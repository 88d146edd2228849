"""A SIGKILLed worker's messages come back within the bound the configuration promises, and each is applied
once: the embedded default (SQLite graph), real Redis, real worker processes, the LLM stand-in.

The bound (``celery_config.redelivery_bound_s``, docs/operations.md "When a worker dies"): a message a
worker held unacked is back on its queue at most the visibility timeout plus one restore interval after the
worker's death, because live workers keep re-stamping what they hold (``engram_workers.broker``) and a dead
one stops. These tests run with a short timeout (10 s) so that the bound is short, measure the time from
the kill to the messages' return against it (generously: twice the bound, to absorb a loaded machine; the
old behaviour is an hour), and count every message's episode and facts in the graph. Beat's redelivery
sweep runs as in production while they wait: it may re-send at most the one message a killed consumer can
strand between kombu's pop and its unacked record, and the one parked message whose wake-up the killed
worker did not send. The same with a killed
``engram up`` is ``tests/test_fleet.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_api import keys
from engram_api.errors import WaitTimeoutError
from engram_api.settings import Settings
from engram_testing import LLMStandin
from engram_workers.celery_config import keep_alive_s, make_celery, redelivery_bound_s
from engram_workers.maintenance.redeliver import resend_lost
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.stack import Stack, engram_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops" / "chaos"))

from fleet import warm_up  # ops/chaos: the chaos workload and its warm-up
from workload import Workload

TIMEOUT_S = 10  # ENGRAM_VISIBILITY_TIMEOUT_S: the smallest allowed, so that the bound is short


def test_a_held_message_is_re_stamped_and_an_acked_one_never_comes_back(redis_url: str) -> None:
    """The keep-alive moves a held message's ``unacked_index`` entry forward and leaves an acked one gone."""
    app = make_celery(Settings(), redis_url)
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue(f"engram-test-keepalive-{os.getpid()}")
        try:
            queue.put({"n": 1})
            message = queue.get(timeout=5)
            channel = message.channel
            index = channel.unacked_index_key
            delivered = channel.client.zscore(index, message.delivery_tag)
            assert delivered is not None
            assert channel.keep_alive(delivered + 100) == 1
            assert channel.client.zscore(index, message.delivery_tag) == delivered + 100
            message.ack()
            assert channel.keep_alive(delivered + 200) == 0  # nothing held any more
            channel.qos._delivered[message.delivery_tag] = message  # even a stale local record ...
            channel.keep_alive(delivered + 300)
            assert channel.client.zscore(index, message.delivery_tag) is None  # ... never re-creates the entry
            del channel.qos._delivered[message.delivery_tag]
        finally:
            queue.clear()
            queue.close()


@pytest.fixture
def stack(redis_url: str, llm_standin: LLMStandin, tmp_path: Path) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=llm_standin.url, workers=False,
        visibility_timeout_s=TIMEOUT_S, llm_timeout_s=120,
    ) as s:  # fmt: skip
        yield s


def _held(stack: Stack, queue: str) -> dict[str, float]:
    """Delivery tag -> unacked_index score of every message of ``queue`` a worker holds unacked."""
    redis = stack.client.redis
    held = {}
    for tag, raw in redis.hgetall(keys.kombu_unacked()).items():
        _, _, routing_key = json.loads(raw)
        score = redis.zscore("unacked_index", tag)
        if routing_key == queue and score is not None:
            held[tag] = score
    return held


@pytest.mark.slow
def test_a_live_worker_keeps_a_message_it_holds_longer_than_the_visibility_timeout(
    stack: Stack, llm_standin: LLMStandin
) -> None:
    """The model answers after 2.5 visibility timeouts: without the keep-alive a second delivery would call it
    again (kombu restores any entry older than the timeout, whoever holds it)."""
    work = Workload(f"keep{os.getpid()}", users=1, per_user=1)
    stack.start_worker("extract", EXTRACT_WORKER, concurrency=2)
    stack.start_worker("apply", APPLY_WORKER)
    llm_standin.script(work.reply)
    llm_standin.latency_s = 2.5 * TIMEOUT_S
    (message,) = work.messages
    receipt = stack.client.enqueue(**message.item())
    result = stack.client.wait([receipt], timeout=240)
    assert result.applied == [receipt.message_id], result
    assert llm_standin.calls == 1, "the message was handed out again while its worker still held it"
    assert work.graph_mismatches(stack.client, {receipt.message_id}, set()) == []


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["extract", "apply"])
def test_a_worker_sigkilled_mid_task_has_its_messages_back_within_the_bound_and_applied_once(
    stack: Stack, llm_standin: LLMStandin, stage: str
) -> None:
    work = Workload(f"kill{stage}{os.getpid()}", users=4, per_user=8)
    workers = {
        "extract": stack.start_worker("extract", EXTRACT_WORKER, concurrency=4),
        "apply": stack.start_worker("apply", APPLY_WORKER),
    }
    warm_up(stack, llm_standin, work.reply, users=2)  # cold starts are not what is measured
    llm_standin.latency_s = 0.5  # extract holds messages for a while: some are mid-call at the kill
    queue = keys.EXTRACT_QUEUE if stage == "extract" else keys.APPLY_QUEUE
    receipts = [stack.client.enqueue(**m.item()) for m in work.messages]

    deadline = time.monotonic() + 120
    while not (held := _held(stack, queue)):
        assert time.monotonic() < deadline, f"the {stage} worker never held a message"
        time.sleep(0.02)
    victim = workers[stage]
    victim.kill()  # SIGKILL, main process and pool children: a pod past its grace period
    killed_at, killed_wall = time.monotonic(), time.time()
    victim.start()  # as a restart policy would; the other stage's worker restores what the dead one held

    bound = redelivery_bound_s(stack.settings)
    back_by = time.monotonic() + 2 * bound
    while True:
        now_held = _held(stack, queue)
        # Back: restored (gone from unacked), or delivered again since the kill (a newer stamp).
        if all(now_held.get(tag, killed_wall + 1) > killed_wall for tag in held):
            returned_s = time.monotonic() - killed_at
            break
        assert time.monotonic() < back_by, f"{len(held)} messages still held by the dead {stage} worker"
        time.sleep(0.1)

    # Beat's redelivery sweep runs as in production (threshold: the visibility timeout). A message the killed
    # process had popped but not yet recorded unacked (celery/celery#7950) exists nowhere else and only the
    # sweep finds it: at most one per killed consumer. A worker killed between a message's finish and its
    # extraction turn's pass-on strands its user's earliest parked message (``Turns.left_waiting``): one more.
    # The sweep must re-send nothing else.
    resent: list[str] = []
    hang_guard = time.monotonic() + 240  # a hang guard, not a bound
    while True:
        try:
            result = stack.client.wait(receipts, timeout=2 * bound)
            break
        except WaitTimeoutError:
            assert time.monotonic() < hang_guard, "messages still pending"
            resent += resend_lost(stack.settings, stack.env["REDIS_URL"], older_than_s=TIMEOUT_S).resent
    applied_s = time.monotonic() - killed_at
    assert result.done and not result.dead_lettered, result
    assert len(resent) <= 2, resent
    assert work.graph_mismatches(stack.client, set(result.applied), set()) == []  # each episode and fact once
    # Not before the timeout since the victim's last keep-alive: a message is never taken from a live holder.
    assert returned_s >= TIMEOUT_S - keep_alive_s(stack.settings) - 1, returned_s
    print(f"\n{stage} SIGKILL: {len(held)} held; back on the queue after {returned_s:.1f}s "
          f"(bound {bound:.1f}s); all {len(receipts)} applied {applied_s:.1f}s after the kill; the sweep re-sent {resent}")  # fmt: skip
