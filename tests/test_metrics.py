"""`engram worker --metrics-port`: Prometheus metrics summed over prefork children, with values that match
what the fleet did; and ENGRAM_LOG_FORMAT=json logs carrying user and message ids, never message text."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from engram_api import MemoryClient, keys
from engram_api.connections import redis_client
from engram_api.errors import InvalidInputError
from engram_api.models import MessageState, StageOutcome
from engram_api.reader.metrics import reader_metrics
from engram_api.settings import load_settings
from engram_api.storage.writer.lease import Lease
from engram_testing.llm_standin import LLMStandin, Reply, approx_tokens
from engram_workers.celery_config import make_celery
from engram_workers.control import LLMBreaker, LLMRateLimiter
from engram_workers.metrics import QueueDepth
from engram_workers.services.ports import free_port
from engram_workers.stages.apply import run_apply
from engram_workers.stages.common import RetryLater
from tests.support.extractions import entity, fact, lives_in, message_text
from tests.support.memory import remember
from tests.support.operator_processes import engram_process
from tests.support.stack import SETTLE_S, engram_stack

ANSWERS = {
    "I live in Tampa.": lives_in("Tampa"),
    "My brother Alex works at Amazon.": {
        "entities": [entity("e1", "Alex", "Person"), entity("e2", "Amazon", "Company")],
        "facts": [fact("e1", "WORKS_AT", "e2", "Alex works at Amazon")],
    },
}
BROKEN = "My passport number is X1234567."  # answered with non-JSON until it is dead-lettered
NOT_JSON = "{not json at all"
MAINTENANCE_BACKLOG = 3  # jobs left waiting: this worker does not consume the maintenance queue
T0 = datetime(2024, 5, 1, tzinfo=UTC)
TRIVIAL = "ok thanks"  # the extract stage skips the LLM for these


def scripted(request: dict[str, Any]) -> Reply:
    text = message_text(request)
    return Reply(content=NOT_JSON) if text == BROKEN else Reply.json(ANSWERS[text])


@dataclass(frozen=True)
class Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    log: Path
    metrics_dir: Path
    worker_pid: int
    applied: dict[str, str]  # message id -> user id
    dead: tuple[str, str]  # (user id, message id)
    prompt_tokens: int
    completion_tokens: int
    llm_calls: int

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; a sample the scrape lacks is an error, never a silent 0."""
        key = (name, frozenset(labels.items()))
        if key not in self.samples:
            present = sorted({n for n, _ in self.samples if n.startswith(name.split("_total")[0])})
            raise KeyError(f"no sample {name}{labels} in the scrape; samples of that family: {present}")
        return self.samples[key]


@pytest.fixture(scope="module")
def scrape(redis_url: str, llm_server: LLMStandin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    """One `engram worker` (extract and apply queues, prefork x2, --metrics-port, JSON logs) fed four
    messages: two answered by the LLM, one trivial, one the LLM keeps answering with non-JSON; and a few
    maintenance jobs nobody consumes. Then /metrics scraped once."""
    llm_server.reset()
    llm_server.script(scripted)
    data_dir = tmp_path_factory.mktemp("metrics")
    with engram_stack(
        redis_url=redis_url,
        data_dir=data_dir,
        neo4j_uri=None,
        llm_url=llm_server.url,
        workers=False,
        log_format="json",
        # The counts below are per message: no redelivery of a task that is merely slow on a loaded machine.
        visibility_timeout_s=3600,
    ) as stack:
        port, metrics_dir = free_port(), data_dir / "prometheus"
        metrics_dir.mkdir()
        (metrics_dir / "counter_1.db").write_bytes(b"stale")  # a previous run's file: `engram worker` clears it
        queues = f"{keys.EXTRACT_QUEUE},{keys.APPLY_QUEUE}"
        args = ["worker", "--queues", queues, "--concurrency", "2", "--metrics-port", str(port)]
        env = {**stack.env, "ENGRAM_METRICS_DIR": str(metrics_dir)}
        with engram_process("worker", args, env=env, log_dir=data_dir) as worker:
            worker.wait_for_log("ready.", timeout=90)
            client = stack.client
            good = [client.enqueue(f"m_{n}", text) for n, text in enumerate([*ANSWERS, TRIVIAL])]
            bad = client.enqueue("m_dead", BROKEN)
            result = client.wait([*good, bad], timeout=SETTLE_S)
            celery = make_celery(stack.settings, stack.env["REDIS_URL"])
            for _ in range(MAINTENANCE_BACKLOG):
                celery.send_task(keys.DECAY_TASK, queue=keys.MAINTENANCE_QUEUE, routing_key=keys.MAINTENANCE_QUEUE)
            assert sorted(result.applied) == sorted(r.message_id for r in good)
            assert result.dead_lettered == [bad.message_id]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                body = response.read().decode()
            texts = [message_text({"messages": r.messages}) for r in llm_server.requests]
            yield Scrape(
                samples={
                    (s.name, frozenset(s.labels.items())): s.value
                    for family in text_string_to_metric_families(body)
                    for s in family.samples
                },
                log=worker.log_path,
                metrics_dir=metrics_dir,
                worker_pid=worker.pid,
                applied={r.message_id: r.user_id for r in good},
                dead=(bad.user_id, bad.message_id),
                prompt_tokens=sum(
                    approx_tokens("".join(m["content"] for m in r.messages)) for r in llm_server.requests
                ),
                completion_tokens=sum(
                    approx_tokens(NOT_JSON if t == BROKEN else json.dumps(ANSWERS[t])) for t in texts
                ),
                llm_calls=len(texts),
            )
    llm_server.reset()


def test_messages_are_counted_per_stage_and_outcome(scrape: Scrape) -> None:
    assert scrape.value("engram_messages_total", stage="extract", outcome="llm") == 2
    assert scrape.value("engram_messages_total", stage="extract", outcome="trivial") == 1
    assert scrape.value("engram_messages_total", stage="extract", outcome="dead-lettered") == 1
    assert scrape.value("engram_messages_total", stage="apply", outcome="applied") == 3
    assert scrape.value("engram_dead_letters_total", stage="extract") == 1
    # A labelled counter has a sample only once a label value was counted: none for apply.
    assert not scrape.has("engram_dead_letters_total", stage="apply")
    # Every outcome label is a StageOutcome value (no free text split into labels).
    labels = {dict(labels)["outcome"] for name, labels in scrape.samples if name == "engram_messages_total"}
    assert labels == {"llm", "trivial", "dead-lettered", "applied"} <= {o.value for o in StageOutcome}


@pytest.mark.parametrize(("stage", "messages"), [("extract", 4), ("apply", 3)])
def test_stage_seconds_has_one_observation_per_message_in_cumulative_buckets(
    scrape: Scrape, stage: str, messages: int
) -> None:
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (name, labels), value in scrape.samples.items()
        if name == "engram_stage_seconds_bucket" and dict(labels)["stage"] == stage
    )
    assert len(buckets) == 13  # the 12 declared bounds and +Inf
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and counts[-1] == messages
    assert scrape.value("engram_stage_seconds_count", stage=stage) == messages
    assert scrape.value("engram_stage_seconds_sum", stage=stage) > 0


def test_llm_tokens_and_cost_are_the_stand_ins_usage(scrape: Scrape) -> None:
    # Every call is paid for, the non-JSON answers of the dead-lettered message included: each of its three
    # attempts asks once more with the parse error appended.
    assert scrape.llm_calls == 2 + 3 * 2
    assert scrape.value("engram_llm_tokens_total", kind="prompt") == scrape.prompt_tokens
    assert scrape.value("engram_llm_tokens_total", kind="completion") == scrape.completion_tokens
    worker = load_settings()  # the worker's prices: it read this process's environment plus the stack's
    cost = (
        scrape.prompt_tokens / 1000 * worker.llm_input_cost_per_1k
        + scrape.completion_tokens / 1000 * worker.llm_output_cost_per_1k
    )
    assert scrape.value("engram_llm_cost_usd_total") == pytest.approx(cost)


def test_the_parent_serves_the_sum_of_its_pool_children(scrape: Scrape) -> None:
    writers = {int(path.stem.rsplit("_", 1)[1]) for path in scrape.metrics_dir.glob("*.db")}
    assert 1 not in writers, "the stale file of an earlier run was not cleared"
    # The tasks ran in prefork children, each writing its own file; the scrape (served by the parent) had
    # every message, so the parent summed the children's files.
    assert writers - {scrape.worker_pid}


def test_json_logs_carry_ids_never_message_text(scrape: Scrape) -> None:
    lines = scrape.log.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    pipeline = [r for r in records if r["name"] == "engram.pipeline"]
    seen = {(r["stage"], r["user_id"], r["message_id"]) for r in pipeline if r["levelname"] == "INFO"}
    outcomes = {r["outcome"] for r in pipeline if r["levelname"] == "INFO"}
    # One line a stage, not three: Celery's "received" is off at INFO; its "succeeded" stays.
    assert not [r for r in records if r["name"] == "celery.worker.strategy"]
    assert any(r["name"] == "celery.app.trace" and "succeeded" in r["message"] for r in records)
    assert outcomes == {"llm", "trivial", "dead-lettered", "applied"}
    for message_id, user_id in scrape.applied.items():
        assert {("extract", user_id, message_id), ("apply", user_id, message_id)} <= seen
    user_id, message_id = scrape.dead
    warnings = [r for r in pipeline if r["levelname"] == "WARNING"]
    assert [(w["stage"], w["user_id"], w["message_id"]) for w in warnings] == [("extract", user_id, message_id)]
    assert warnings[0]["message"].startswith("dead-lettered: ")
    # Whatever names a message does so in a JSON record: no text-format line slipped through.
    ids = [*scrape.applied, message_id]
    assert not [line for line in lines if not line.startswith("{") and any(i in line for i in ids)]
    text = "\n".join(lines)
    assert "Tampa" not in text and "Amazon" not in text and "X1234567" not in text


def test_queue_depth_is_read_from_the_broker_at_scrape_time(scrape: Scrape) -> None:
    assert scrape.value("engram_queue_depth", queue=keys.MAINTENANCE_QUEUE) == MAINTENANCE_BACKLOG
    assert scrape.value("engram_queue_depth", queue=keys.EXTRACT_QUEUE) == 0
    # Every message was applied before the scrape: nothing waits on apply (a depth read from another queue,
    # or summed over queues, would show the maintenance backlog here).
    assert scrape.value("engram_queue_depth", queue=keys.APPLY_QUEUE) == 0


def test_queue_lag_is_served_with_the_depths(scrape: Scrape) -> None:
    # The maintenance jobs sent before the scrape wait unconsumed: their age is the lag; extract is empty.
    assert scrape.value("engram_queue_lag_seconds", queue=keys.MAINTENANCE_QUEUE) > 0
    assert scrape.value("engram_queue_lag_seconds", queue=keys.EXTRACT_QUEUE) == 0


def test_the_backlog_and_the_breaker_are_served_with_the_depths(scrape: Scrape) -> None:
    # Every message was applied or dead-lettered: none is left in flight (a task may still await its ack).
    assert scrape.value("engram_in_flight_messages", stage="extract") == 0
    assert scrape.value("engram_in_flight_messages", stage="apply") == 0
    assert scrape.has("engram_unacked_messages")
    # Bad answers are not service failures: the breaker stayed closed and admitted every call to the model.
    assert scrape.value("engram_llm_breaker_state") == 0
    assert scrape.value("engram_llm_breaker_calls_total", decision="admitted") == scrape.llm_calls
    assert scrape.value("engram_llm_breaker_calls_total", decision="rejected") == 0


def _lags(collector: QueueDepth) -> dict[str, float]:
    return {
        s.labels["queue"]: s.value
        for f in collector.collect()
        if f.name == "engram_queue_lag_seconds"
        for s in f.samples
    }


def test_queue_lag_is_the_age_of_the_oldest_waiting_message(redis_url: str, tmp_path: Path) -> None:
    """On the real broker: the producer's and Celery's publishes carry their time; the oldest one counts."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        url = stack.env["REDIS_URL"]
        stamps: list[float] = []
        now = 0.0
        collector = QueueDepth(redis_client(url, stack.settings, decode_responses=False), clock=lambda: now)
        assert _lags(collector) == dict.fromkeys(keys.QUEUES, 0.0)  # empty queues: no lag
        for n in range(2):
            stack.client.enqueue("lag_user", f"message {n}")
            stamps.append(json.loads(stack.client.redis.lindex(keys.EXTRACT_QUEUE, 0))["headers"][keys.SENT_AT_HEADER])
        celery = make_celery(stack.settings, url)
        celery.send_task(keys.DECAY_TASK, queue=keys.MAINTENANCE_QUEUE, routing_key=keys.MAINTENANCE_QUEUE)
        job_stamp = json.loads(stack.client.redis.lindex(keys.MAINTENANCE_QUEUE, 0))["headers"][keys.SENT_AT_HEADER]
        assert stamps[0] <= stamps[1] <= job_stamp
        now = job_stamp + 42.5
        lags = _lags(collector)
        # The first enqueued message is the next one out (the tail): its age, not the newest one's.
        assert lags[keys.EXTRACT_QUEUE] == pytest.approx(now - stamps[0])
        assert lags[keys.MAINTENANCE_QUEUE] == pytest.approx(42.5)
        assert lags[keys.APPLY_QUEUE] == 0
        # A message without a stamp (an older Engram's) gives no sample rather than a made-up age.
        stack.client.redis.rpush(keys.APPLY_QUEUE, json.dumps({"headers": {"task": keys.APPLY_TASK}}))
        assert keys.APPLY_QUEUE not in _lags(collector)


def _gauges(collector: QueueDepth) -> dict[str, float]:
    """The collector's unlabelled samples, the breaker's decision counts as ``decision:<name>`` and the
    in-flight messages by stage as ``in_flight:<stage>``."""
    found: dict[str, float] = {}
    for family in collector.collect():
        for s in family.samples:
            if "decision" in s.labels:
                found[f"decision:{s.labels['decision']}"] = s.value
            elif "stage" in s.labels:
                found[f"in_flight:{s.labels['stage']}"] = s.value
            else:
                found[s.name] = s.value
    return found


def test_unacked_in_flight_and_breaker_state_are_read_at_scrape_time(redis_url: str, tmp_path: Path) -> None:
    """Each set up through the code that keeps it: kombu reserving a task, the ledger's enqueue, the breaker."""
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        url = stack.env["REDIS_URL"]
        collector = QueueDepth(redis_client(url, stack.settings, decode_responses=False))
        before = _gauges(collector)
        assert before["engram_unacked_messages"] == 0
        assert before["in_flight:extract"] == 0 and before["in_flight:apply"] == 0
        assert before["engram_llm_breaker_state"] == 0
        assert {k: v for k, v in before.items() if k.startswith("decision:")} == {
            "decision:admitted": 0, "decision:trials": 0,
            "decision:rejected": 0, "decision:opened": 0,
        }  # fmt: skip
        first, second = (stack.client.enqueue("gauge_user", f"message {n}").message_id for n in range(2))
        # A worker takes one without acking (kombu's reservation, as a prefork child holds a task).
        with make_celery(stack.settings, url).connection_for_read() as connection:
            channel = connection.default_channel
            taken = channel.basic_get(keys.EXTRACT_QUEUE, no_ack=False)
            assert taken is not None
            seen = _gauges(collector)
            assert seen["engram_unacked_messages"] == 1
            # Taken or waiting, neither is extracted yet: both wait for extract.
            assert (seen["in_flight:extract"], seen["in_flight:apply"]) == (2, 0)
            taken.ack()
        assert _gauges(collector)["engram_unacked_messages"] == 0
        # Through the ledger's own transitions: extracted waits for apply, applied leaves, sent back returns.
        ledger = stack.client.producer.ledger
        ledger.set_state("gauge_user", first, MessageState.EXTRACTED, extraction="{}")
        ledger.set_state("gauge_user", second, MessageState.EXTRACTED, extraction="{}")
        assert [_gauges(collector)[f"in_flight:{s}"] for s in ("extract", "apply")] == [0, 2]
        ledger.set_state("gauge_user", first, MessageState.APPLIED)
        ledger.set_state("gauge_user", second, MessageState.QUEUED)  # sent back to extract
        assert [_gauges(collector)[f"in_flight:{s}"] for s in ("extract", "apply")] == [1, 0]

        def fail() -> None:
            raise ConnectionError("model down")

        breaker = LLMBreaker(redis=stack.client.redis, fail_max=2, reset_timeout=1.0, is_failure=lambda _: True)
        for _ in range(2):
            with pytest.raises(ConnectionError):
                breaker.call(fail)
        opened = _gauges(collector)
        if breaker.state == "open":  # still open after the scrape, so open during it (a slow host may be past)
            assert opened["engram_llm_breaker_state"] == 1
        assert opened["decision:admitted"] == 2 and opened["decision:opened"] == 1
        while breaker.state == "open":  # the open key expires after reset_timeout
            time.sleep(0.01)
        assert _gauges(collector)["engram_llm_breaker_state"] == 0.5
        assert breaker.call(lambda: "answer") == "answer"  # the trial succeeds: closed again
        closed = _gauges(collector)
        assert closed["engram_llm_breaker_state"] == 0 and closed["decision:trials"] == 1


def _count(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_rate_limit_waits_and_refusals_are_counted(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        _count_rate_limit(stack.client.redis)


def _count_rate_limit(client: Any) -> None:
    refused, waited = _count("engram_llm_rate_refused_total"), _count("engram_llm_rate_wait_seconds_total")
    slow = LLMRateLimiter(redis=client, per_second=0.01)  # one slot per 100 s
    assert slow.acquire(max_wait=0)
    assert not slow.acquire(max_wait=1)  # the next slot is ~100 s away: refused, without sleeping
    assert _count("engram_llm_rate_refused_total") == refused + 1
    assert _count("engram_llm_rate_wait_seconds_total") == waited
    client.delete(keys.RATE_BUCKET)
    fast = LLMRateLimiter(redis=client, per_second=20)  # slots 50 ms apart
    assert fast.acquire(max_wait=0)
    assert fast.acquire(max_wait=5)  # waits for its slot
    assert _count("engram_llm_rate_wait_seconds_total") > waited
    assert _count("engram_llm_rate_refused_total") == refused + 1


def test_an_apply_refused_by_a_held_lease_is_counted(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        ctx = stack.worker_resources(dispatch=lambda _task, _args: None)
        receipt = stack.client.enqueue("busy_user", "I live in Tampa.")
        busy = _count("engram_apply_lease_busy_total")
        # Another writer holds the user's lease: the apply is put off, not run.
        with Lease(stack.client.redis, receipt.user_id, ttl=30, wait=0), pytest.raises(RetryLater):
            run_apply(ctx, receipt.user_id, receipt.message_id)
        assert _count("engram_apply_lease_busy_total") == busy + 1
        assert stack.client.redis.hget(keys.status(receipt.user_id, receipt.message_id), "state") == "queued"


def _reader_samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in registry.collect()
        if family.name.startswith("engram_reader_")
        for s in family.samples
    }


def test_the_reader_records_into_a_registry_only_when_given_one(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        url = stack.env["REDIS_URL"]
        plain = MemoryClient(settings=stack.settings, redis_url=url)
        default_before = _reader_samples(REGISTRY)
        plain.recall("metrics_user", "where do I live?")
        assert plain.reader.metrics is None
        assert _reader_samples(REGISTRY) == default_before  # not asked: nothing recorded anywhere

        remember(plain, "metrics_user", ["I live in Tampa."], T0)
        shutil.rmtree(stack.settings.index_dir)  # as on another host: the next reader rebuilds from the graph
        registry = CollectorRegistry()
        client = MemoryClient(settings=stack.settings, redis_url=url, metrics_registry=registry)
        assert _reader_samples(registry) == {}  # nothing registered before the reader is built
        client.recall("metrics_user", "where do I live?")
        client.recall("metrics_user", "where do I live?")  # the result cache answers
        with pytest.raises(InvalidInputError):
            client.recall("metrics_user", "where do I live?", k=0)
        samples = _reader_samples(registry)
        assert samples[("engram_reader_recall_seconds_count", frozenset({("cached", "false")}))] == 1
        assert samples[("engram_reader_recall_seconds_count", frozenset({("cached", "true")}))] == 1
        assert samples[("engram_reader_recall_errors_total", frozenset({("error", "InvalidInputError")}))] == 1
        loads = {dict(k[1])["how"]: v for k, v in samples.items() if k[0] == "engram_reader_index_loads_total"}
        assert loads == {"rebuild": 1}  # the first recall read the user's vectors from the graph

        # A second client on the same registry shares its metrics (registering the names again would raise).
        again = MemoryClient(settings=stack.settings, redis_url=url, metrics_registry=registry)
        again.recall("metrics_user", "something else")
        assert _reader_samples(registry)[("engram_reader_recall_seconds_count", frozenset({("cached", "false")}))] == 2
        # ENGRAM_READER_METRICS: the default registry, for an application that serves that one.
        asked = MemoryClient(settings=stack.settings.model_copy(update={"reader_metrics": True}), redis_url=url)
        assert asked.reader.metrics is reader_metrics(REGISTRY)
        before = REGISTRY.get_sample_value("engram_reader_recall_seconds_count", {"cached": "false"}) or 0
        asked.recall("metrics_user", "something new")
        assert REGISTRY.get_sample_value("engram_reader_recall_seconds_count", {"cached": "false"}) == before + 1
        for c in (plain, client, again, asked):
            c.close()
