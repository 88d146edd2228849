"""The services the suite runs on are the real thing: Neo4j over Bolt, Redis with AOF, an HTTP LLM that
litellm talks to, and Celery tasks executed by a separate worker process through Redis."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from neo4j import GraphDatabase

from engram_testing import LLMStandin, Neo4jServer, Reply
from engram_testing.llm_standin import approx_tokens
from engram_workers.services import RedisServer
from tests.support.celery_ping_app import QUEUE, make_app

REPO_ROOT = Path(__file__).resolve().parents[1]

# --- Neo4j -------------------------------------------------------------------------------------------


def test_neo4j_writes_and_reads_nodes_and_relationships(neo4j_uri: str, user_id: str) -> None:
    with GraphDatabase.driver(neo4j_uri, auth=None) as driver:
        driver.execute_query(
            "CREATE (u:SvcUser {id: $uid, name: 'Ada'})-[:LIVES_IN {since: 2021}]->(:SvcCity {name: 'Tampa', uid: $uid})",
            uid=user_id,
        )
        records, _, _ = driver.execute_query(
            "MATCH (u:SvcUser {id: $uid})-[r:LIVES_IN]->(c:SvcCity) RETURN u.name AS name, r.since AS since, c.name AS city",
            uid=user_id,
        )
        assert [r.data() for r in records] == [{"name": "Ada", "since": 2021, "city": "Tampa"}]
        info = driver.get_server_info()
        assert info.agent.startswith("Neo4j/5.")
        driver.execute_query("MATCH (n) WHERE n.id = $uid OR n.uid = $uid DETACH DELETE n", uid=user_id)


def test_neo4j_vector_index_answers_nearest_neighbours(neo4j_uri: str, user_id: str) -> None:
    # A label and an index of this test's own: queryNodes ranks over the whole index, so sharing one
    # with other tests would let their nodes crowd ours out of the top k.
    label, index = f"SvcVec_{user_id}", f"svc_vec_{user_id}"
    vectors = {"east": [1.0, 0.0, 0.0, 0.0], "mostly_east": [0.9, 0.1, 0.0, 0.0], "north": [0.0, 1.0, 0.0, 0.0]}
    with GraphDatabase.driver(neo4j_uri, auth=None) as driver:
        try:
            driver.execute_query(
                f"CREATE VECTOR INDEX {index} IF NOT EXISTS FOR (n:{label}) ON n.embedding "
                "OPTIONS {indexConfig: {`vector.dimensions`: 4, `vector.similarity_function`: 'cosine'}}"
            )
            driver.execute_query("CALL db.awaitIndexes(120)")
            driver.execute_query(
                f"UNWIND $rows AS row CREATE (:{label} {{name: row.name, embedding: row.embedding}})",
                rows=[{"name": k, "embedding": v} for k, v in vectors.items()],
            )
            records, _, _ = driver.execute_query(
                "CALL db.index.vector.queryNodes($index, 3, $q) YIELD node, score "
                "RETURN node.name AS name, score ORDER BY score DESC",
                index=index,
                q=[1.0, 0.0, 0.0, 0.0],
            )
            assert [r["name"] for r in records] == ["east", "mostly_east", "north"]
            # Neo4j's cosine score is (1 + cos) / 2: identical 1.0, orthogonal 0.5.
            scores = [r["score"] for r in records]
            assert scores[0] == pytest.approx(1.0, abs=1e-4)
            assert scores[1] == pytest.approx((1 + 0.9 / (0.82**0.5)) / 2, abs=1e-3)
            assert scores[2] == pytest.approx(0.5, abs=1e-4)
        finally:
            driver.execute_query(f"DROP INDEX {index} IF EXISTS")
            driver.execute_query(f"MATCH (n:{label}) DELETE n")


@pytest.mark.slow
def test_neo4j_outlives_no_parent_and_keeps_its_data(tmp_path: Path) -> None:
    """The JVM exits when the process that started it is SIGKILLed (stdin EOF), and a new server on the
    same data directory and port finds the data."""
    data_dir = tmp_path / "neo4j"
    script = f"""
import sys, time
from pathlib import Path
from neo4j import GraphDatabase
from engram_testing import Neo4jServer
s = Neo4jServer(data_dir=Path({str(data_dir)!r})).start()
with GraphDatabase.driver(s.uri, auth=None) as d:
    d.execute_query("CREATE (:Survivor {{name: 'kept'}})")
print(s.pid, s.port, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        assert len(line) == 2, f"child failed to start Neo4j (exit {parent.poll()})"
        jvm_pid, port = int(line[0]), int(line[1])
    finally:
        parent.kill()
        parent.wait()

    deadline = time.monotonic() + 60
    while _alive(jvm_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(jvm_pid), "the Neo4j JVM outlived its parent"

    with Neo4jServer(data_dir=data_dir, port=port) as server:
        assert server.uri == f"bolt://127.0.0.1:{port}"
        with GraphDatabase.driver(server.uri, auth=None) as driver:
            records, _, _ = driver.execute_query("MATCH (n:Survivor) RETURN n.name AS name")
        assert [r["name"] for r in records] == ["kept"]
    assert not server.running


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# --- Redis -------------------------------------------------------------------------------------------


def test_redis_answers_and_is_durable(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        assert client.ping() is True
        assert client.set("svc:greeting", "hello") is True
        assert client.get("svc:greeting") == "hello"
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("bind")["bind"] == "127.0.0.1"
    finally:
        client.close()


def test_redis_client_fixture_works_on_the_session_redis(redis_client: redis.Redis, user_id: str) -> None:
    key = f"svc:{user_id}:n"
    assert redis_client.incr(key) == 1
    assert redis_client.incrby(key, 41) == 42
    assert redis_client.get(key) == "42"
    redis_client.delete(key)


def _files(root: Path) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file()]


@pytest.mark.parametrize("how", ["graceful", "sigkill"])
def test_redis_restart_keeps_data_through_the_aof(tmp_path: Path, how: str) -> None:
    with RedisServer(data_dir=tmp_path / "redis") as server:
        url, pid = server.url, server.pid
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            client.rpush("svc:queue", *[f"task-{i}" for i in range(100)])
            client.set("svc:last", "written just before the crash")
            # appendfsync everysec: Redis may hold a write back up to 2 s while an fsync is slow (a loaded
            # machine); what this test promises is that what reached the AOF survives the kill.
            deadline = time.monotonic() + 30
            while not any(b"written just before the crash" in f.read_bytes() for f in _files(tmp_path / "redis")):
                assert time.monotonic() < deadline, "the write never reached the AOF"
                time.sleep(0.05)
            if how == "graceful":
                server.restart()
            else:
                server.kill()
                assert not server.running
                server.start()
            assert server.url == url and server.pid != pid
            assert client.lrange("svc:queue", 0, -1) == [f"task-{i}" for i in range(100)]
            assert client.get("svc:last") == "written just before the crash"
        finally:
            client.close()
    assert not server.running


# --- LLM stand-in through litellm --------------------------------------------------------------------


def _complete(standin: LLMStandin, text: str, *, timeout: float = 5.0) -> Any:
    import litellm  # imported here: a second of import time only for the tests that need it

    return litellm.completion(
        model="openai/standin",
        api_base=standin.url,
        api_key="test-key",
        messages=[{"role": "system", "content": "Extract facts."}, {"role": "user", "content": text}],
        num_retries=0,
        timeout=timeout,
    )


def test_litellm_gets_the_scripted_json_and_usage(llm_standin: LLMStandin) -> None:
    extraction = {"entities": [{"ref": "e1", "name": "Tampa"}], "facts": [{"predicate": "LIVES_IN"}]}
    llm_standin.script(
        lambda req: Reply.json(extraction) if "Tampa" in req["messages"][-1]["content"] else None,
    )
    response = _complete(llm_standin, "I live in Tampa.")
    content = response.choices[0].message.content
    assert json.loads(content) == extraction
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.prompt_tokens == approx_tokens("Extract facts.I live in Tampa.")
    assert response.usage.completion_tokens == approx_tokens(content)
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens

    # No rule answers: the default is an empty extraction.
    assert json.loads(_complete(llm_standin, "Nothing here.").choices[0].message.content) == {
        "entities": [],
        "facts": [],
    }
    assert llm_standin.calls == 2
    first = llm_standin.requests[0]
    assert first.model == "standin"
    assert first.messages[-1] == {"role": "user", "content": "I live in Tampa."}


@pytest.mark.parametrize(
    ("reply", "error_name"),
    [
        (Reply.error(500), "InternalServerError"),
        (Reply.error(503), "ServiceUnavailableError"),
        (Reply.rate_limited(retry_after=1), "RateLimitError"),
        (Reply.malformed(), "InternalServerError"),
        (Reply(truncate=True), "InternalServerError"),
    ],
    ids=["500", "503", "429", "malformed", "truncated"],
)
def test_litellm_raises_for_scripted_failures(llm_standin: LLMStandin, reply: Reply, error_name: str) -> None:
    import litellm

    llm_standin.script(lambda req: reply)
    with pytest.raises(getattr(litellm, error_name)):
        _complete(llm_standin, "anything")
    assert llm_standin.calls == 1  # num_retries=0 really means one request


def test_litellm_times_out_on_a_hanging_answer(llm_standin: LLMStandin) -> None:
    import litellm

    llm_standin.script(lambda req: Reply(hang=True))  # hangs for hang_s (600 s) unless the client gives up
    with pytest.raises(litellm.Timeout):
        _complete(llm_standin, "anything", timeout=1.0)
    assert llm_standin.calls == 1


def test_standin_http_routes_headers_and_latency(llm_standin: LLMStandin) -> None:
    base = llm_standin.url.removesuffix("/v1")
    assert _get_json(f"{base}/health") == {"status": "ok"}
    assert [m["id"] for m in _get_json(f"{llm_standin.url}/models")["data"]] == ["standin"]

    llm_standin.script(lambda req: Reply.rate_limited(retry_after=2))
    status, headers, body = _post_chat(llm_standin.url)
    assert status == 429 and headers["Retry-After"] == "2"
    assert json.loads(body)["error"]["type"] == "rate_limit_error"

    llm_standin.script(lambda req: Reply(content="x" * 1000, truncate=True))
    with pytest.raises(http.client.IncompleteRead):
        _post_chat(llm_standin.url)

    llm_standin.script(lambda req: "plain text answer")
    llm_standin.latency_s = 60  # a client that waits 1 s gets nothing: the latency is really served
    with pytest.raises(TimeoutError):
        _post_chat(llm_standin.url, timeout=1)
    llm_standin.latency_s = 0
    status, _, body = _post_chat(llm_standin.url)
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "plain text answer"


def test_standin_random_failures_follow_the_seed(llm_standin: LLMStandin) -> None:
    def run() -> list[int]:
        llm_standin.inject_failures(0.5, mix=[Reply.error(500)], seed=7)
        return [_post_chat(llm_standin.url)[0] for _ in range(40)]

    first = run()
    assert set(first) == {200, 500}
    assert run() == first
    assert llm_standin.failures_injected == 2 * first.count(500)


def test_standin_reset_restores_every_setting(llm_standin: LLMStandin) -> None:
    fresh = LLMStandin()
    llm_standin.script(lambda req: "scripted")
    llm_standin.responder = lambda req: "responder"
    llm_standin.inject_failures(1.0, mix=[Reply.error(503)], seed=3)
    assert _post_chat(llm_standin.url)[0] == 503
    llm_standin.latency_s, llm_standin.hang_s = 5.0, 1.0
    llm_standin.reset()
    settings = ("_rules", "responder", "latency_s", "hang_s", "failure_rate", "failure_mix", "failures_injected")
    assert {name: getattr(llm_standin, name) for name in settings} == {name: getattr(fresh, name) for name in settings}
    assert (llm_standin.requests, llm_standin.errors) == ([], [])


def test_standin_runs_standalone() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "engram_testing.llm_standin", "--port", "0", "--latency", "60"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with pytest.raises(TimeoutError):  # --latency 60: no answer within a client's 1 s
            _post_chat(url, timeout=1)
        health = urllib.request.urlopen(f"{url.removesuffix('/v1')}/health", timeout=10).read()
        assert json.loads(health) == {"status": "ok"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _post_chat(base_url: str, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps({"model": "standin", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# --- Celery through Redis, executed by a worker process ----------------------------------------------


@pytest.mark.slow
def test_celery_task_runs_in_a_real_worker_process(redis_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.celery_ping_app", "worker",
             "--pool", "prefork", "-c", "1", "-Q", QUEUE, "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=REPO_ROOT,
            env={**os.environ, "REDIS_URL": redis_url},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the worker and its pool child are stopped as one group
        )  # fmt: skip
    app = make_app(redis_url)
    try:
        result = app.send_task("ping", args=[41], queue=QUEUE)
        try:
            assert result.get(timeout=120) == 42
        except Exception:
            pytest.fail(f"no result from the worker; its log:\n{log_path.read_text(errors='replace')[-3000:]}")
        assert result.state == "SUCCESS"
        assert worker.poll() is None
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        app.close()
    log_text = log_path.read_text(errors="replace")
    assert f"Task ping[{result.id}] succeeded" in log_text
