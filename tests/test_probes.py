"""Liveness vs readiness, as Kubernetes would probe them, on real processes: a worker (`engram probe live|ready`)
and a gateway (/v1/livez, /v1/readyz). Each test owns its Redis and stops it: an outage of a dependency
makes the process unready and never unlive, so it is taken out of rotation, not restarted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engram_workers.probes import ROLES
from engram_workers.services import RedisServer
from tests.support.gateway import gateway_process
from tests.support.operator_processes import engram_process, wait_until
from tests.support.stack import SOURCE_ROOT, engram_stack


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def probe(kind: str, role: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "engram_workers.cli", "probe", kind, "--role", role]
    return subprocess.run(argv, env=env, cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=120)


def test_a_worker_is_live_without_its_dependencies_and_ready_only_with_them(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    with engram_stack(
        redis_url=str(own_redis.url), data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False
    ) as s:
        # TMPDIR: this test's heartbeat, not one of another worker on the machine.
        env = {**s.env, "TMPDIR": str(tmp_path)}
        assert probe("live", "apply", env).returncode == 1  # nothing runs yet: no heartbeat
        with engram_process("worker", ["worker", "--stage", "apply", "-c", "1"], env=env, log_dir=tmp_path) as worker:
            worker.wait_for_log("ready.", timeout=120)
            live, ready = probe("live", "apply", env), probe("ready", "apply", env)
            assert live.returncode == 0, live.stdout + live.stderr
            assert ready.returncode == 0, ready.stdout + ready.stderr
            assert {line.split(":")[0] for line in ready.stdout.splitlines()} == {
                "ok   heartbeat",
                "ok   redis",
                "ok   graph_store",
            }
            own_redis.stop()  # the broker goes away: the worker keeps running, reconnecting
            not_ready = probe("ready", "apply", env)
            assert not_ready.returncode == 1 and "FAIL redis" in not_ready.stdout
            assert probe("live", "apply", env).returncode == 0  # never restarted for an outage
            assert worker.alive()


def test_probe_roles_are_the_stages_and_beat() -> None:
    from engram_workers.cli.ops import STAGES

    assert set(ROLES) == {*STAGES, "beat"}


def unready(http: httpx.Client) -> httpx.Response | None:
    response = http.get("/v1/readyz")
    return response if response.status_code == 503 else None


def test_the_gateway_is_live_without_its_dependencies_and_ready_only_with_them(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    with (
        engram_stack(redis_url=str(own_redis.url), data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as s,
        gateway_process(s.env, tmp_path / "logs") as gw,
        httpx.Client(base_url=gw.url, timeout=60) as http,
    ):
        assert http.get("/v1/livez").json() == {"ok": True, "checks": {}}
        ready = http.get("/v1/readyz")
        assert ready.status_code == 200 and ready.json() == {
            "ok": True,
            "checks": {"redis": True, "graph_store": True},
        }
        own_redis.stop()
        down = wait_until(lambda: unready(http), timeout=60, what="readyz to answer 503")
        assert down.json()["checks"]["redis"] is False and down.json()["checks"]["graph_store"] is True
        assert http.get("/v1/livez").status_code == 200


def test_beat_readiness_needs_redis_not_the_graph(redis_url: str, tmp_path: Path) -> None:
    # No Beat runs with this TMPDIR: not live, hence not ready, whatever Redis says; Neo4j is never asked.
    env = {**os.environ, "REDIS_URL": redis_url, "NEO4J_URI": "bolt://127.0.0.1:9", "TMPDIR": str(tmp_path)}
    result = probe("ready", "beat", env)
    assert result.returncode == 1
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == ["FAIL heartbeat", "ok   redis"]
