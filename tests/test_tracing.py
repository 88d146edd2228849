"""OpenTelemetry traces through the real stack: a gateway process and extract and apply worker processes
(``ENGRAM_TRACING=true``) on the real Redis and SQLite store, the LLM stand-in, every process exporting over
OTLP/HTTP to an in-memory collector in this test (``tests/support/otlp.py``).

One message's trace, continuing the caller's ``traceparent``: the gateway's HTTP span -> ``engram.enqueue``
-> the extract worker's ``run/engram.extract`` (its parent read from the task message's headers, which the
enqueue script wrote) -> ``engram.extract`` -> ``engram.llm``, and -> Celery's publish of the apply task ->
``run/engram.apply`` -> ``engram.apply``. The recall that finds the message, in the caller's other trace,
carries a link to the message's ``engram.extract`` span. A message parked behind its user's earlier one (an
extraction turn) stays in its trace: the task that wakes it is a child of the parked run's extract span.
With tracing off (the default) nothing is written.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from engram_api import keys, tracing
from engram_testing.llm_standin import LLMStandin
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.gateway import GatewayProcess, auth, gateway_process, mint_keys, wait_state
from tests.support.otlp import OtlpCollector, Span
from tests.support.stack import SETTLE_S, SOURCE_ROOT, Stack, engram_stack

TEXT = "I moved to Lisbon last spring and I work at a small bakery near the river."


@pytest.fixture(scope="module")
def traced_fleet(
    redis_url: str, llm_server: LLMStandin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, GatewayProcess, dict[str, str], OtlpCollector]]:
    data = tmp_path_factory.mktemp("tracing")
    key_secrets, entries = mint_keys()
    with (
        OtlpCollector() as collector,
        engram_stack(
            redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=llm_server.url, workers=False
        ) as stack,
    ):
        # Only the fleet's processes trace: this test process keeps no tracer provider of its own.
        stack.env.update(
            ENGRAM_TRACING="true", OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint, OTEL_BSP_SCHEDULE_DELAY="200"
        )
        stack.start_worker("extract", EXTRACT_WORKER, concurrency=4)
        stack.start_worker("apply", APPLY_WORKER)
        with gateway_process({**stack.env, "ENGRAM_API_KEYS": entries}, data / "logs") as gw:
            yield stack, gw, key_secrets, collector


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _one(spans: list[Span], name: str, trace_id: str) -> Span:
    found = [s for s in spans if s.name == name and s.trace_id == trace_id]
    assert len(found) == 1, f"{name}: {len(found)} spans in trace {trace_id}"
    return found[0]


def _lineage(span: Span, spans: list[Span]) -> list[Span]:
    """``span``'s ancestors in its trace, nearest first."""
    by_id = {s.span_id: s for s in spans if s.trace_id == span.trace_id}
    found, parent = [], span.parent
    while parent in by_id:
        found.append(by_id[parent])
        parent = by_id[parent].parent
    return found


def _ancestors(span: Span, spans: list[Span]) -> list[str]:
    """The names of ``span``'s ancestors in its trace, nearest first."""
    return [s.name for s in _lineage(span, spans)]


@pytest.mark.slow  # a fleet of processes
def test_one_trace_from_enqueue_to_recall(
    traced_fleet: tuple[Stack, GatewayProcess, dict[str, str], OtlpCollector], llm_server: LLMStandin
) -> None:
    _, gw, key_secrets, collector = traced_fleet
    llm_server.reset()
    headers = auth(key_secrets, "a_rw")
    uid, mid = f"appA.{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    enqueue_parent, message_trace, caller_span = _traceparent()
    recall_parent, recall_trace, _ = _traceparent()

    with httpx.Client(base_url=gw.url, timeout=60) as http:
        body = {"user_id": uid, "message_id": mid, "messages": [{"role": "user", "content": TEXT}]}
        r = http.post("/v1/messages", json=body, headers={**headers, "traceparent": enqueue_parent})
        assert r.status_code == 202, r.text
        wait_state(http, headers, uid, mid)
        r = http.post(
            f"/v1/users/{uid}/recall",
            json={"query": "Where does the user live?", "k": 5},
            headers={**headers, "traceparent": recall_parent},
        )
        assert r.status_code == 200, r.text
        assert any(mid in item["source_ids"] for item in r.json()["items"])
    assert llm_server.calls >= 1

    # Every span asserted on below, the parents included: a child span ends, and is exported, before its
    # parent (the gateway's HTTP span ends after the response is sent), so waiting for the children alone
    # can read the collector before the parents arrive.
    wanted = {"engram.enqueue", "engram.extract", "engram.llm", "engram.apply", "engram.recall"} | {
        "POST /v1/messages", "POST /v1/users/{user_id}/recall",
        f"run/{keys.EXTRACT_TASK}", f"run/{keys.APPLY_TASK}", f"apply_async/{keys.APPLY_TASK}",
    }  # fmt: skip
    spans = collector.wait_for(
        lambda got: wanted <= {s.name for s in got if s.trace_id in (message_trace, recall_trace)}, SETTLE_S
    )

    # The message's trace continues the caller's: the gateway's HTTP span is the child of its traceparent.
    http_span = _one(spans, "POST /v1/messages", message_trace)
    assert http_span.parent == caller_span and http_span.service == "engram-gateway"
    enqueue = _one(spans, "engram.enqueue", message_trace)
    assert "POST /v1/messages" in _ancestors(enqueue, spans)
    assert enqueue.attributes["engram.message_id"] == mid

    # The worker's run span's parent came through the task message on Redis.
    run_extract = _one(spans, f"run/{keys.EXTRACT_TASK}", message_trace)
    assert run_extract.parent == enqueue.span_id and run_extract.service == "engram-worker"
    extract = _one(spans, "engram.extract", message_trace)
    assert extract.parent == run_extract.span_id
    llm = _one(spans, "engram.llm", message_trace)
    assert "engram.extract" in _ancestors(llm, spans)
    assert llm.attributes["gen_ai.request.model"] == "openai/standin"

    # Extract published the apply task inside its span: Celery's instrumentation carried the context on.
    apply = _one(spans, "engram.apply", message_trace)
    assert _ancestors(apply, spans)[:4] == [
        f"run/{keys.APPLY_TASK}", f"apply_async/{keys.APPLY_TASK}", "engram.extract", f"run/{keys.EXTRACT_TASK}"
    ]  # fmt: skip
    assert _ancestors(apply, spans)[4:6] == ["engram.enqueue", "POST /v1/messages"]

    # The recall is in the caller's other trace, under its HTTP span, linked to the message's extract span.
    recall = _one(spans, "engram.recall", recall_trace)
    assert "POST /v1/users/{user_id}/recall" in _ancestors(recall, spans)
    assert (message_trace, extract.span_id) in recall.links

    # Spans carry ids, never what was said or asked.
    text = json.dumps([s.attributes for s in spans])
    assert "Lisbon" not in text and "Where does" not in text


@pytest.mark.slow  # a fleet of processes
def test_a_message_parked_behind_its_users_earlier_one_keeps_its_trace(
    traced_fleet: tuple[Stack, GatewayProcess, dict[str, str], OtlpCollector], llm_server: LLMStandin
) -> None:
    """Two messages of one user back to back: the second's extract task finds the first holding the turn
    and parks; the first's pass-on wakes it with a fresh task, which carries the context it parked with,
    so its extract, LLM and apply spans are in the trace of its own enqueue."""
    _, gw, key_secrets, collector = traced_fleet
    llm_server.reset()
    llm_server.latency_s = 1.0  # the first holds the turn through its model call while the second arrives
    headers = auth(key_secrets, "a_rw")
    uid, first, second = f"appA.{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, uuid.uuid4().hex
    first_parent, first_trace, _ = _traceparent()
    second_parent, second_trace, _ = _traceparent()

    with httpx.Client(base_url=gw.url, timeout=60) as http:
        for mid, parent in ((first, first_parent), (second, second_parent)):
            body = {"user_id": uid, "message_id": mid, "messages": [{"role": "user", "content": TEXT}]}
            r = http.post("/v1/messages", json=body, headers={**headers, "traceparent": parent})
            assert r.status_code == 202, r.text
        wait_state(http, headers, uid, second)
    assert llm_server.calls >= 2

    def second_complete(got: list[Span]) -> bool:
        """Every process has exported its spans of the second message (each on its own schedule)."""
        mine = [s for s in got if s.trace_id == second_trace]
        extracts = sum(s.name == "engram.extract" for s in mine)
        first_enqueued = any(s.name == "engram.enqueue" and s.trace_id == first_trace for s in got)
        return (
            first_enqueued
            and extracts >= 2
            and {"engram.enqueue", "engram.llm", "engram.apply"} <= {s.name for s in mine}
        )

    spans = collector.wait_for(second_complete, SETTLE_S)
    assert _one(spans, "engram.enqueue", first_trace).attributes["engram.message_id"] == first

    # It really parked: its first extract run ended "waiting", a child of its own enqueue.
    enqueue = _one(spans, "engram.enqueue", second_trace)
    assert enqueue.attributes["engram.message_id"] == second
    runs = [s for s in spans if s.name == "engram.extract" and s.trace_id == second_trace]
    extracts = {s.attributes["engram.outcome"]: s for s in runs}
    assert len(runs) == 2 and sorted(extracts) == ["llm", "waiting"], [s.attributes for s in runs]
    parked, woken = extracts["waiting"], extracts["llm"]
    assert [s.span_id for s in _lineage(parked, spans)][1] == enqueue.span_id
    assert all(s.attributes["engram.message_id"] == second for s in runs)

    # The woken task's run is a child of the parked run's extract span: one trace from the enqueue on.
    assert _ancestors(woken, spans)[:4] == [
        f"run/{keys.EXTRACT_TASK}", "engram.extract", f"run/{keys.EXTRACT_TASK}", "engram.enqueue"
    ]  # fmt: skip
    assert [s.span_id for s in _lineage(woken, spans)][1:4:2] == [parked.span_id, enqueue.span_id]
    assert woken.span_id in [s.span_id for s in _lineage(_one(spans, "engram.llm", second_trace), spans)]
    apply = _one(spans, "engram.apply", second_trace)
    assert apply.attributes["engram.outcome"] == "applied"
    assert {woken.span_id, enqueue.span_id} <= {s.span_id for s in _lineage(apply, spans)}
    # The wake read and removed what the parking kept.
    assert not traced_fleet[0].client.redis.exists(keys.parked_traces(uid))


def test_tracing_off_writes_no_context(stack_off: Stack) -> None:
    """The default: no trace context in the task message or the status hash, whatever the process does."""
    client = stack_off.client
    assert not client.settings.tracing and not tracing.enabled()
    receipt = client.enqueue(f"u{uuid.uuid4().hex[:8]}", TEXT)
    raw = client.redis.lindex(keys.queue_for(keys.EXTRACT_TASK), 0)
    headers = json.loads(raw)["headers"]
    assert "traceparent" not in headers and headers["id"] == receipt.task_id
    assert tracing.carrier() == {} and tracing.status_fields() == {}
    with tracing.span("engram.enqueue") as span:
        assert not span.is_recording()
    # A message parked behind an earlier one keeps no context either.
    later = client.enqueue(receipt.user_id, TEXT)
    turns = client.producer.ledger.turns
    assert turns.take(receipt.user_id, receipt.message_id, 1.0).granted
    assert turns.take(receipt.user_id, later.message_id, 2.0) == (False, receipt.message_id)
    assert client.redis.sismember(keys.parked(receipt.user_id), later.message_id)
    assert not client.redis.exists(keys.parked_traces(receipt.user_id))


def test_tracing_on_without_the_extra_is_a_config_error_naming_the_setting() -> None:
    """In a child process (a tracer provider is process-wide): the SDK missing, as without ``engram[tracing]``."""
    script = (
        "import sys; sys.modules['opentelemetry.sdk'] = None\n"
        "from engram_api import tracing\n"
        "from engram_api.errors import ConfigError\n"
        "from engram_api.settings import Settings\n"
        "try:\n    tracing.configure(Settings(tracing=True))\n"
        "except ConfigError as exc:\n    print(exc.variable, '|', exc.problem)\n"
        "print('enabled' if tracing.enabled() else 'off')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=SOURCE_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ENGRAM_TRACING | is on but opentelemetry.sdk"), lines
    assert "pip install 'engram[tracing]'" in lines[0] and lines[1] == "off"


@pytest.fixture
def stack_off(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("off"), neo4j_uri=None, llm_url=None, workers=False
    ) as stack:
        yield stack
