"""The HTTP gateway through a real ``engram serve`` process on loopback, with a real worker fleet behind it.

Every endpoint answers; bad input of every kind gets a typed problem body and changes nothing; 1,000
randomized cross-namespace probes leak nothing; the same message id enqueued twice is applied once.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner

from engram_api import keys
from engram_api.models import DeadLetter, Envelope, utcnow
from engram_api.settings import load_settings
from engram_gateway.auth import AccessDeniedError, KeyRing
from engram_gateway.service import _DEPTH_TTL_S as DEPTH_TTL_S  # how long the gateway trusts a depth read
from engram_workers import cli
from tests.support.gateway import GatewayProcess, auth, footprint, gateway_process, mint_keys, serve_command, wait_state
from tests.support.stack import Stack, engram_stack


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, GatewayProcess, dict]]:
    secrets, entries = mint_keys()
    data = tmp_path_factory.mktemp("gateway")
    with engram_stack(redis_url=redis_url, data_dir=data, neo4j_uri=None, llm_url=None) as stack:
        env = {**stack.env, "ENGRAM_API_KEYS": entries, "ENGRAM_GATEWAY_MAX_BODY_BYTES": "65536"}
        with gateway_process(env, data / "logs") as gw:
            yield stack, gw, secrets


@pytest.fixture(scope="module")
def http(fleet: tuple[Stack, GatewayProcess, dict]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet[1].url, timeout=60) as client:
        yield client


def test_every_endpoint(fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client) -> None:
    stack, _, secrets = fleet
    a, op = auth(secrets, "a_rw"), auth(secrets, "a_op")
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    r = http.post("/v1/messages", headers=a, json={"user_id": uid, "messages": "I live in Austin", "message_id": "m1"})
    assert r.status_code == 202 and r.json()["duplicate"] is False
    r = http.post(
        "/v1/messages/batch",
        headers=a,
        json={"items": [{"user_id": uid, "messages": [{"role": "user", "content": "I work at Dell"}], "message_id": "m2",
                         "timestamp": "2024-05-01T10:00:00+00:00", "metadata": {"source": "web", "n": 1}}]},
    )  # fmt: skip
    assert r.status_code == 202 and [x["message_id"] for x in r.json()["receipts"]] == ["m2"]
    wait_state(http, a, uid, "m1")
    wait_state(http, a, uid, "m2")

    recall = http.post(f"/v1/users/{uid}/recall", headers=a, json={"query": "where does the user live?", "k": 5})
    assert recall.status_code == 200
    body = recall.json()
    assert any("Austin" in item["statement"] for item in body["items"]), body
    past = http.post(
        f"/v1/users/{uid}/recall",
        headers=a,
        json={"query": "where does the user live?", "as_of": "2000-01-01T00:00:00Z"},
    )
    assert past.status_code == 200 and past.json()["items"] == []
    # since / until filter by event time: m2 was said on 2024-05-01, m1 now; facts by validity.
    cut = "2024-06-01T00:00:00Z"
    later = http.post(f"/v1/users/{uid}/recall", headers=a, json={"query": "where does the user work?", "since": cut})
    earlier = http.post(f"/v1/users/{uid}/recall", headers=a, json={"query": "where does the user work?", "until": cut})
    assert later.status_code == 200 and earlier.status_code == 200
    # The Dell fact still holds after the cut (its validity overlaps it); the message saying it does not.
    said_later = [i["statement"] for i in later.json()["items"] if i["kind"] == "episode"]
    assert said_later == ["I live in Austin"], later.json()
    assert any("Dell" in i["statement"] for i in earlier.json()["items"]), earlier.json()
    assert all("Austin" not in i["statement"] for i in earlier.json()["items"]), earlier.json()
    search = http.post(f"/v1/users/{uid}/search", headers=a, json={"query": "Austin", "detail_level": "detailed"})
    assert search.status_code == 200 and search.json()["level"] == "detailed"
    ctx = http.post(f"/v1/users/{uid}/context", headers=a, json={"query": "where does the user live?"})
    assert ctx.status_code == 200 and "Austin" in ctx.json()["context"]
    hist = http.get(f"/v1/users/{uid}/history", headers=a, params={"subject": "user"})
    assert hist.status_code == 200 and any("Austin" in f["statement"] for f in hist.json())
    latest = http.get(f"/v1/users/{uid}/history", headers=a, params={"subject": "user", "limit": 1})
    assert latest.status_code == 200 and latest.json() == hist.json()[-1:]
    graph = http.get(f"/v1/users/{uid}/graph", headers=a, params={"page": 1, "page_size": 10})
    assert graph.status_code == 200 and graph.json()["total_facts"] >= 2
    stats = http.get(f"/v1/users/{uid}/stats", headers=a)
    assert stats.status_code == 200 and stats.json()["episodes"] == 2
    useful = [body["items"][0]["id"]]
    fb = http.post(f"/v1/users/{uid}/feedback", headers=a, json={"recall_id": body["recall_id"], "useful_ids": useful})
    assert fb.status_code == 200 and fb.json()["rows"] == len(body["items"])

    forgot = http.delete(f"/v1/users/{uid}/memories/m2", headers=a)
    assert forgot.status_code == 200 and forgot.json()["episodes"] == 1
    assert http.get(f"/v1/users/{uid}/stats", headers=a).json()["episodes"] == 1

    # Dead letters (operator): one written through the library's own store, then listed, replayed, dropped.
    letters = stack.client.producer.ledger.dead_letters
    for mid in ("d1", "d2"):
        env = Envelope(
            user_id=uid, message_id=mid, messages=[{"role": "user", "content": "I like tea"}], timestamp=utcnow()
        )
        letters.put(DeadLetter(user_id=uid, message_id=mid, stage="extract", reason="test", envelope=env))
    listed = http.get("/v1/dead-letters", headers=op, params={"user_id": uid})
    assert listed.status_code == 200 and sorted(d["message_id"] for d in listed.json()) == ["d1", "d2"]
    assert {d["message_id"] for d in http.get("/v1/dead-letters", headers=op).json()} >= {"d1", "d2"}
    assert http.post(f"/v1/dead-letters/{uid}/d1/replay", headers=op).status_code == 202
    wait_state(http, a, uid, "d1")
    assert http.delete(f"/v1/dead-letters/{uid}/d2", headers=op).json() == {"dropped": True}
    assert http.delete(f"/v1/dead-letters/{uid}/d2", headers=op).status_code == 404
    assert http.get("/v1/dead-letters", headers=op, params={"user_id": uid}).json() == []

    gone = http.delete(f"/v1/users/{uid}", headers=a)
    assert gone.status_code == 200 and gone.json()["episodes"] == 2
    assert http.get(f"/v1/users/{uid}/stats", headers=a).json()["facts"] == 0
    assert http.get(f"/v1/users/{uid}/messages/m1", headers=a).status_code == 404

    health = http.get("/v1/health")
    assert health.status_code == 200 and health.json()["ok"] is True
    metrics = http.get("/v1/metrics", headers=op)
    assert (
        metrics.status_code == 200
        and 'engram_gateway_requests_total{route="/v1/users/{user_id}/recall"' in metrics.text
    )
    assert uid not in metrics.text  # route templates, never user ids
    schema = http.get("/openapi.json", headers=a).json()
    assert {"/v1/messages", "/v1/users/{user_id}/recall", "/v1/dead-letters"} <= set(schema["paths"])
    assert "RecallResult" in schema["components"]["schemas"]


def test_same_message_id_twice_is_applied_once(fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client) -> None:
    stack, _, secrets = fleet
    a = auth(secrets, "a_rw")
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    payload = {"user_id": uid, "messages": "I have a dog named Rex", "message_id": "retry-1"}
    first = http.post("/v1/messages", headers=a, json=payload)
    second = http.post("/v1/messages", headers=a, json=payload)  # a client retry after a timeout
    assert first.status_code == 202
    assert second.status_code == 409
    assert second.json()["receipt"]["task_id"] == first.json()["task_id"]
    wait_state(http, a, uid, "retry-1")
    third = http.post("/v1/messages", headers=a, json=payload)  # a retry after it was applied
    assert third.status_code == 409
    batch = http.post("/v1/messages/batch", headers=a, json={"items": [payload]})
    assert batch.json()["receipts"][0]["duplicate"] is True
    stats = stack.client.stats(uid)
    assert stats.episodes == 1
    assert len(stack.client.get_graph(uid).facts) == stats.facts
    assert stack.client.redis.llen(keys.EXTRACT_QUEUE) == 0


def _reader_samples(http: httpx.Client, headers: dict[str, str]) -> dict[tuple[str, str], float]:
    """The reader's samples on the gateway's /v1/metrics: (sample name, its label values) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    scraped = http.get("/v1/metrics", headers=headers)
    assert scraped.status_code == 200
    return {
        (s.name, ",".join(s.labels.values())): s.value
        for family in text_string_to_metric_families(scraped.text)
        if family.name.startswith("engram_reader_")
        for s in family.samples
    }


def test_the_gateways_metrics_show_its_readers_recalls(
    fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client
) -> None:
    # The gateway's MemoryClient records into the gateway's own registry, so one scrape sees both.
    _, _, secrets = fleet
    a, op = auth(secrets, "a_rw"), auth(secrets, "a_op")
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    told = {"user_id": uid, "messages": "I live in Porto", "message_id": "m1"}
    assert http.post("/v1/messages", headers=a, json=told).status_code == 202
    wait_state(http, a, uid, "m1")
    before = _reader_samples(http, op)
    query = {"query": "where does the user live?"}
    for _ in range(2):  # the second recall of an unchanged user is answered by the result cache
        assert http.post(f"/v1/users/{uid}/recall", headers=a, json=query).status_code == 200
    after = _reader_samples(http, op)

    def grew(name: str, labels: str) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert grew("engram_reader_recall_seconds_count", "false") == 1
    assert grew("engram_reader_recall_seconds_count", "true") == 1
    assert uid not in http.get("/v1/metrics", headers=op).text


def _bad_requests(secrets: dict[str, str], uid: str) -> list[tuple[str, str, dict[str, Any], int, str | None]]:
    """(method, path, httpx kwargs, expected status, expected field)."""
    a, ro, b = auth(secrets, "a_rw"), auth(secrets, "a_read"), auth(secrets, "b_rw")
    ok = {"user_id": uid, "messages": "I live in Denver"}
    big = "x" * 70_000
    return [
        ("POST", "/v1/messages", {"json": {**ok, "messages": big}}, 413, None),
        ("POST", "/v1/messages", {"content": b"{" + b" " * 70_000, "headers": {"content-type": "application/json"}}, 413, None),
        ("POST", "/v1/messages", {"json": {**ok, "messages": 5}}, 400, "messages"),
        ("POST", "/v1/messages", {"json": {**ok, "colour": "red"}}, 400, "colour"),
        ("POST", "/v1/messages", {"json": {**ok, "messages": [{"role": "robot", "content": "x"}]}}, 400, "messages[0].role"),
        ("POST", "/v1/messages", {"json": {**ok, "user_id": "appA.bad id"}}, 400, "user_id"),
        ("POST", "/v1/messages", {"json": {**ok, "message_id": "no spaces"}}, 400, "message_id"),
        ("POST", "/v1/messages", {"json": {**ok, "timestamp": "2024-05-01T10:00:00"}}, 400, "timestamp"),
        ("POST", "/v1/messages", {"json": {**ok, "messages": "   "}}, 400, "messages"),
        ("POST", "/v1/messages", {"json": {**ok, "metadata": {"k": [1]}}}, 400, "metadata.k"),
        ("POST", "/v1/messages", {"content": b"not json", "headers": {**a, "content-type": "application/json"}}, 400, None),
        # The key is checked before the body is read: no key, nothing parsed.
        ("POST", "/v1/messages", {"content": b"not json", "headers": {"content-type": "application/json"}}, 401, None),
        ("POST", "/v1/messages/batch", {"json": {"items": [ok, {**ok, "messages": ""}]}}, 400, "items[1].messages"),
        ("POST", "/v1/messages/batch", {"json": {"items": [ok, {**ok, "user_id": "appB.x"}]}}, 403, "items[1].user_id"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "k": "5"}}, 400, "k"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "k": 0}}, 400, "k"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "as_of": "2024-01-01T00:00:00"}}, 400, "as_of"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "since": "2024-01-01T00:00:00"}}, 400, "since"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "until": "yesterday"}}, 400, "until"),
        ("POST", f"/v1/users/{uid}/recall", {"json": {"query": "x", "since": "2024-02-01T00:00:00Z",
                                                      "until": "2024-01-01T00:00:00Z"}}, 400, "until"),
        ("POST", f"/v1/users/{uid}/feedback", {"json": {"recall_id": "nope", "useful_ids": []}}, 400, "recall_id"),
        ("GET", f"/v1/users/{uid}/graph", {"params": {"page": "x"}}, 400, "page"),
        ("GET", f"/v1/users/{uid}/history", {"params": {"subject": "  "}}, 400, "subject"),  # blank; absent means "user"
        ("GET", f"/v1/users/{uid}/history", {"params": {"subject": "user", "limit": 1001}}, 400, "limit"),
        ("DELETE", f"/v1/users/{uid}/memories/bad%20id", {}, 400, "memory_id"),
        ("GET", f"/v1/users/{uid}/messages/nope", {}, 404, None),
        ("DELETE", f"/v1/dead-letters/{uid}/nope", {"headers": auth(secrets, "a_op")}, 404, None),
        ("POST", "/v1/messages", {"json": ok, "headers": {}}, 401, None),
        ("POST", "/v1/messages", {"json": ok, "headers": {"Authorization": "Bearer egk_wrong"}}, 401, None),
        ("POST", "/v1/messages", {"json": ok, "headers": {"X-API-Key": "egk_wrong"}}, 401, None),
        ("POST", "/v1/messages", {"json": ok, "headers": {"Authorization": "Basic abc"}}, 401, None),
        ("POST", "/v1/messages", {"json": ok, "headers": ro}, 403, None),
        ("DELETE", f"/v1/users/{uid}", {"headers": ro}, 403, None),
        ("GET", "/v1/dead-letters", {"headers": a}, 403, None),
        ("GET", "/v1/metrics", {"headers": a}, 403, None),
        ("POST", "/v1/messages", {"json": ok, "headers": b}, 403, "user_id"),
        ("DELETE", f"/v1/users/{uid}", {"headers": b}, 403, "user_id"),
        ("POST", "/v1/messages", {"json": {**ok, "user_id": "appAX.y"}}, 403, "user_id"),
        ("POST", "/v1/messages", {"json": {**ok, "user_id": "appA"}}, 403, "user_id"),
        ("GET", "/v1/nothing-here", {}, 404, None),
    ]  # fmt: skip


def test_bad_input_gets_a_typed_problem_and_changes_nothing(
    fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client
) -> None:
    stack, _, secrets = fleet
    a = auth(secrets, "a_rw")
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    assert http.post("/v1/messages", headers=a, json={"user_id": uid, "messages": "I live in Austin", "message_id": "m0"}).status_code == 202  # fmt: skip
    wait_state(http, a, uid, "m0")
    before = footprint(stack, [uid])
    for method, path, kwargs, status, field in _bad_requests(secrets, uid):
        headers = kwargs.pop("headers", a)
        r = http.request(method, path, headers=headers, **kwargs)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", (path, r.headers)
        problem = r.json()
        assert problem["status"] == status and problem["type"].startswith("urn:engram:problem:") and problem["detail"]
        if field is not None:
            assert problem["field"] == field, (path, problem)
        if status == 401:
            assert r.headers["www-authenticate"] == "Bearer"
    assert footprint(stack, [uid]) == before


def test_cross_namespace_probes_never_leak(fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client) -> None:
    """1,000 randomized requests with app B's keys at app A's users (and look-alike ids): 0 leaks."""
    stack, _, secrets = fleet
    a = auth(secrets, "a_rw")
    victims = [f"appA.v{uuid.uuid4().hex[:6]}" for _ in range(3)]
    secret_word = f"zebra{uuid.uuid4().hex[:6]}"
    for i, uid in enumerate(victims):
        r = http.post("/v1/messages", headers=a, json={"user_id": uid, "messages": f"I have a dog named {secret_word}", "message_id": f"s{i}"})  # fmt: skip
        assert r.status_code == 202
    for i, uid in enumerate(victims):
        wait_state(http, a, uid, f"s{i}")
    stack.client.producer.ledger.dead_letter(
        DeadLetter(user_id=victims[0], message_id="dl", stage="extract", reason=secret_word)
    )
    before = footprint(stack, victims)
    rng = random.Random(16)
    attackers = [auth(secrets, "b_rw"), auth(secrets, "b_op")]
    leaks, outcomes = [], {}
    for _ in range(1_000):
        uid = rng.choice([*victims, "appA.nobody", "appA", "appAB.x", "appB", "*", "appA.v..x"])
        mid = rng.choice(["s0", "s1", "s2", "dl", "m"])
        method, path, kwargs = rng.choice([
            ("POST", "/v1/messages", {"json": {"user_id": uid, "messages": "I live in Oslo", "message_id": f"x{rng.random()}"[:20].replace(".", "_")}}),
            ("POST", "/v1/messages/batch", {"json": {"items": [{"user_id": f"appB.me{rng.randrange(9)}", "messages": "hi"}, {"user_id": uid, "messages": "hi"}]}}),
            ("GET", f"/v1/users/{uid}/messages/{mid}", {}),
            ("POST", f"/v1/users/{uid}/recall", {"json": {"query": secret_word}}),
            ("POST", f"/v1/users/{uid}/search", {"json": {"query": "dog"}}),
            ("POST", f"/v1/users/{uid}/context", {"json": {"query": "dog"}}),
            ("GET", f"/v1/users/{uid}/history", {"params": {"subject": "user"}}),
            ("GET", f"/v1/users/{uid}/graph", {}),
            ("GET", f"/v1/users/{uid}/stats", {}),
            ("POST", f"/v1/users/{uid}/feedback", {"json": {"recall_id": "abc", "useful_ids": []}}),
            ("DELETE", f"/v1/users/{uid}/memories/{mid}", {}),
            ("DELETE", f"/v1/users/{uid}", {}),
            ("GET", "/v1/dead-letters", {"params": {"user_id": uid}}),
            ("GET", "/v1/dead-letters", {}),
            ("POST", f"/v1/dead-letters/{uid}/{mid}/replay", {}),
            ("DELETE", f"/v1/dead-letters/{uid}/{mid}", {}),
        ])  # fmt: skip
        r = http.request(method, path, headers=rng.choice(attackers), **kwargs)
        outcomes[r.status_code] = outcomes.get(r.status_code, 0) + 1
        # The only success allowed: listing the dead letters of the attacker's own (empty) namespace.
        own_listing = path == "/v1/dead-letters" and "params" not in kwargs and r.status_code == 200
        shown = secret_word in r.text or any(v in r.text for v in victims)
        if shown or (r.status_code < 400 and not (own_listing and r.json() == [])):
            leaks.append((method, path, r.status_code, r.text[:200]))
    assert leaks == []
    assert set(outcomes) <= {200, 400, 403}, outcomes
    assert outcomes.get(403, 0) > 500, outcomes
    assert footprint(stack, victims) == before


def test_back_pressure_and_store_unavailable(redis_url: str, tmp_path: Path) -> None:
    """429 with Retry-After once the extract queue is over the limit; 503 with Retry-After without Redis."""
    secrets, entries = mint_keys()
    a = auth(secrets, "a_rw")
    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path / "bp", neo4j_uri=None, llm_url=None, workers=False
    ) as stack:
        env = {**stack.env, "ENGRAM_API_KEYS": entries, "ENGRAM_GATEWAY_MAX_QUEUE_DEPTH": "2"}
        with gateway_process(env, tmp_path / "logs") as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
            codes = []
            for i in range(3):
                r = http.post("/v1/messages", headers=a, json={"user_id": "appA.u", "messages": "hello", "message_id": f"q{i}"})  # fmt: skip
                codes.append(r.status_code)
                time.sleep(DEPTH_TTL_S * 1.2)  # past the depth's cache life: a loaded machine only sleeps longer
            assert codes == [202, 202, 429]
            assert r.headers["retry-after"] and r.json()["type"] == "urn:engram:problem:back-pressure"
            assert stack.client.redis.llen(keys.EXTRACT_QUEUE) == 2
            assert stack.client.redis.hgetall(keys.status("appA.u", "q2")) == {}
    env = {**stack.env, "REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0", "ENGRAM_API_KEYS": entries}
    with gateway_process(env, tmp_path / "logs", name="gateway-noredis") as gw, httpx.Client(base_url=gw.url) as http:
        r = http.post("/v1/messages", headers=a, json={"user_id": "appA.u", "messages": "hello"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["type"] == "urn:engram:problem:store-unavailable"
        assert http.get("/v1/health").status_code == 503


def _closed_port() -> int:
    from tests.support.gateway import free_port

    return free_port()


def test_no_key_refuses_to_bind_beyond_loopback(tmp_path: Path) -> None:
    import os
    import subprocess

    env = {**os.environ, "ENGRAM_DATA_DIR": str(tmp_path), "ENGRAM_API_KEYS": "[]"}
    done = subprocess.run(
        serve_command("--host", "0.0.0.0", "--port", "1"), env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "ENGRAM_API_KEYS" in done.stderr and "127.0.0.1" in done.stderr


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("not json", "is not valid JSON"),
        ('[{"name": "shop"}]', "[0].sha256: Field required"),
        ('[{"name": "shop", "sha256": "abc", "scopes": ["read"], "namespace": "shop"}]', "[0].sha256: String should"),
        ('{"name": "shop"}', "Input should be a valid list"),
    ],
)
def test_malformed_api_keys_is_one_line_naming_the_variable(tmp_path: Path, value: str, problem: str) -> None:
    """A malformed ENGRAM_API_KEYS stops `engram serve` with one line naming the variable and what is wrong
    (not a traceback naming the settings field)."""
    import os
    import subprocess

    env = {**os.environ, "ENGRAM_DATA_DIR": str(tmp_path), "ENGRAM_API_KEYS": value}
    done = subprocess.run(serve_command("--port", "1"), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ENGRAM_API_KEYS: ") and problem in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "api_keys" not in done.stderr, done.stderr


def test_the_api_description_is_the_gateways_own_and_loads_offline(
    fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client
) -> None:
    """The schema says how to authenticate and which scope each operation needs, lists no 422 (validation
    errors are 400 problems), and /docs loads Swagger UI from the gateway itself, not a CDN."""
    a = auth(fleet[2], "a_rw")
    schema = http.get("/openapi.json", headers=a).json()
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    recall = schema["paths"]["/v1/users/{user_id}/recall"]["post"]
    assert recall["security"] == [{"bearer": []}, {"apiKey": []}] and recall["x-engram-scope"] == "read"
    assert schema["paths"]["/v1/dead-letters"]["get"]["x-engram-scope"] == "operator"
    assert recall["responses"]["400"]["content"] == {
        "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
    }
    health = schema["paths"]["/v1/health"]["get"]
    assert "security" not in health and not {"401", "403", "429"} & set(health["responses"])
    assert '"422"' not in json.dumps(schema) and "HTTPValidationError" not in json.dumps(schema)
    # What the schema promises is what a bad body gets: a 400 problem, not a 422.
    bad = http.post("/v1/users/appA.x/recall", headers=a, json={"query": "where?", "k": "ten"})
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/problem+json"

    page = http.get("/docs", headers=a)
    assert page.status_code == 200 and "/openapi.json" in page.text
    assert "http://" not in page.text and "https://" not in page.text, page.text  # nothing from the network
    for asset, media_type in (("swagger-ui-bundle.js", "text/javascript"), ("swagger-ui.css", "text/css")):
        assert f"/docs/assets/{asset}" in page.text
        served = http.get(f"/docs/assets/{asset}")  # a public file: no key needed
        assert served.status_code == 200 and served.headers["content-type"].startswith(media_type)
        assert len(served.content) > 10_000


def test_history_subject_defaults_to_the_user_as_the_cli_does(
    fleet: tuple[Stack, GatewayProcess, dict], http: httpx.Client
) -> None:
    a = auth(fleet[2], "a_rw")
    uid = f"appA.{uuid.uuid4().hex[:8]}"
    for mid, text in (("m1", "I live in Tampa."), ("m2", "I live in Austin.")):
        assert http.post("/v1/messages", headers=a, json={"user_id": uid, "messages": text, "message_id": mid}).status_code == 202  # fmt: skip
        wait_state(http, a, uid, mid)
    default = http.get(f"/v1/users/{uid}/history", headers=a, params={"predicate": "LIVES_IN"})
    named = http.get(f"/v1/users/{uid}/history", headers=a, params={"subject": "user", "predicate": "LIVES_IN"})
    assert default.status_code == 200 and default.json() == named.json()
    assert [f["object_name"] for f in default.json()] == ["Tampa", "Austin"]


def test_serve_follows_the_embedded_redis_when_engram_up_restarts_it_elsewhere(tmp_path: Path) -> None:
    """With the embedded default (no REDIS_URL), `engram serve` found Redis in services.json; when the fleet
    restarts on another port, the gateway follows it instead of answering 503 until restarted."""
    import os

    from engram_api.connections import write_services_file
    from engram_api.settings import Settings
    from engram_workers.services import RedisServer

    data = tmp_path / "data"
    settings = Settings(data_dir=data)
    first = RedisServer(data_dir=tmp_path / "redis-1", password="first-pass").start()
    write_services_file(settings, redis_url=first.url)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith(("ENGRAM_", "NEO4J_"))}
    env |= {"ENGRAM_DATA_DIR": str(data), "ENGRAM_API_KEYS": "[]"}
    second = RedisServer(data_dir=tmp_path / "redis-2", password="second-pass")
    try:
        with gateway_process(env, tmp_path / "logs") as gw, httpx.Client(base_url=gw.url, timeout=60) as http:
            body = {"user_id": "local.alice", "messages": "I live in Austin", "message_id": "m1"}
            assert http.get("/v1/health").status_code == 200
            assert http.post("/v1/messages", json=body).status_code == 202
            first.stop()  # `engram down`, then `engram up` starts Redis on another port
            second.start()
            assert second.url != first.url
            write_services_file(settings, redis_url=second.url)
            assert http.get("/v1/readyz").status_code == 200  # followed on this very check
            again = http.post("/v1/messages", json={**body, "message_id": "m2"})
            assert again.status_code == 202, again.text
            moved = redis.Redis.from_url(second.url, decode_responses=True)
            assert moved.hgetall(keys.status("local.alice", "m2"))["state"] == "queued"
            moved.close()
    finally:
        second.stop()
        first.stop()


def test_keys_new_prints_a_secret_once_and_an_entry_the_gateway_accepts_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`engram keys new`: the secret, and the ENGRAM_API_KEYS entry that authenticates exactly it, with the
    name, namespace and scopes asked for; the entry holds no secret. Bad options are typed errors."""
    args = ["keys", "new", "--name", "billing", "--namespace", "appB", "--scope", "write", "--scope", "read"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    key_line, entry_line = result.stdout.splitlines()
    key = key_line.removeprefix("key:").strip()
    entry = json.loads(entry_line.removeprefix("entry:").strip())
    assert key_line.startswith("key:   egk_") and entry_line.startswith("entry: ")
    assert entry == {"name": "billing", "sha256": entry["sha256"], "scopes": ["read", "write"], "namespace": "appB"}
    assert key not in entry_line

    # What the operator does next: the entry, appended to ENGRAM_API_KEYS, lets that secret in, and only it.
    monkeypatch.setenv("ENGRAM_API_KEYS", json.dumps([entry]))
    ring = KeyRing(load_settings().api_keys)
    caller = ring.principal(key)
    assert (caller.name, caller.scopes, caller.namespace) == ("billing", frozenset({"read", "write"}), "appB")
    assert caller.owns("appB.alice") and not caller.owns("appA.alice")
    again = CliRunner().invoke(cli.main, args).stdout.splitlines()[0].removeprefix("key:").strip()
    with pytest.raises(AccessDeniedError):
        ring.principal(again)  # each mint is a new secret

    bad = CliRunner().invoke(cli.main, ["keys", "new", "--name", "x", "--namespace", "a b"])
    assert bad.exit_code == 2 and "--namespace" in bad.stderr, bad.output
