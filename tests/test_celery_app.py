"""Plain ``celery -A engram_workers.app worker|beat`` (no ``engram`` CLI involved) runs with Engram's runtime
configuration: Beat is RedBeat with its leader lock in Redis, a worker never mingles and sizes its pool to the
usable CPUs. (``engram beat``'s leader election itself: test_beat.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from beat_schedule import JOBS
from engram_api import keys
from engram_workers.celery_config import (
    BEAT_LOCK_TIMEOUT_S,
    BEAT_MAX_INTERVAL_S,
    stage_defaults,
)
from engram_workers.services.celery_worker import ManagedProcess
from tests.support.stack import SOURCE_ROOT, own_database, redis_db_url

CELERY = [sys.executable, "-m", "celery", "-A", "engram_workers.app"]

# What `celery -A engram_workers.app ...` loads, read in a fresh interpreter: the app's config and whether
# anything of the CLI was imported on the way.
_READ_CONF = """
import json, sys
from engram_workers.app import app
conf = app.conf
print(json.dumps({
    **{k: conf[k] for k in (
        "beat_scheduler", "beat_max_loop_interval", "redbeat_redis_url", "redbeat_key_prefix",
        "redbeat_lock_key", "redbeat_lock_timeout", "worker_pool", "worker_concurrency", "task_send_sent_event",
    )},
    "beat_schedule": sorted(conf.beat_schedule),
    "cli_imported": any(m.startswith("engram_workers.cli") for m in sys.modules),
}))
"""


@pytest.fixture
def env(redis_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The project's settings for a fresh process: its own Redis database and data directory, one CPU."""
    with own_database() as number:
        url = redis_db_url(redis_url, number)
        redis.Redis.from_url(url).flushdb()
        yield {"REDIS_URL": url, "ENGRAM_DATA_DIR": str(tmp_path / "data"), "ENGRAM_CPU_LIMIT": "1"}


def _celery_process(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> ManagedProcess:
    return ManagedProcess(name=name, argv=[*CELERY, *args], env=env, log_dir=log_dir, cwd=SOURCE_ROOT)


def test_the_app_config_is_redbeat_with_the_leader_lock_without_the_cli(env: dict[str, str]) -> None:
    paths = [str(SOURCE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [sys.executable, "-c", _READ_CONF],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(paths)},
        cwd=SOURCE_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    conf: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert conf == {
        "beat_scheduler": "redbeat.RedBeatScheduler",
        "beat_max_loop_interval": BEAT_MAX_INTERVAL_S,
        "redbeat_redis_url": env["REDIS_URL"],
        "redbeat_key_prefix": keys.BEAT_PREFIX,
        "redbeat_lock_key": keys.BEAT_LOCK,
        "redbeat_lock_timeout": BEAT_LOCK_TIMEOUT_S,
        # A worker started without a stage is stage "all", sized to ENGRAM_CPU_LIMIT.
        "worker_pool": "prefork",
        "worker_concurrency": stage_defaults("all", 1)[2],
        # Workers send "sent" events only when asked (ENGRAM_TASK_EVENTS); Beat always (set when Beat starts).
        "task_send_sent_event": False,
        "beat_schedule": sorted(f"engram-{name}" for name in JOBS),
        "cli_imported": False,
    }


def test_plain_celery_beat_takes_the_leader_lock_and_keeps_the_schedule_in_redis(
    env: dict[str, str], tmp_path: Path
) -> None:
    client = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    with _celery_process("beat", ["beat", "--loglevel", "INFO"], env, tmp_path) as beat:
        beat.wait_for_log("beat: Acquired lock", timeout=120)
        log = beat.log_path.read_text()
        assert "redbeat.schedulers.RedBeatScheduler" in log  # the banner's scheduler line
        assert 0 < client.ttl(keys.BEAT_LOCK) <= BEAT_LOCK_TIMEOUT_S
        entries = {key.removeprefix(keys.BEAT_PREFIX) for key in client.scan_iter(f"{keys.BEAT_PREFIX}*")}
        assert {f"engram-{name}" for name in JOBS} <= entries


def test_plain_celery_worker_never_mingles_and_sizes_its_pool_to_the_usable_cpus(
    env: dict[str, str], tmp_path: Path
) -> None:
    with _celery_process("worker", ["worker", "--loglevel", "INFO"], env, tmp_path) as worker:
        worker.wait_for_log("ready.", timeout=180)
        log = worker.log_path.read_text()
    assert "concurrency: 1 (prefork)" in log
    # Mingle logs its search for neighbours when it runs; the app turned it (and gossip) off.
    assert "mingle:" not in log


def test_a_process_whose_first_look_at_the_config_found_no_redis_publishes_to_redis_later(
    redis_url: str, tmp_path: Path
) -> None:
    """Celery drops a lazy configuration that raised: the stages' publishing seam resolves it again, so a
    process that first read the app's config with no Redis to find never publishes to Celery's default
    AMQP broker once Redis is there."""
    code = f"""
import os
from engram_api.errors import ConfigError
from engram_workers.app import app
try:
    app.conf.broker_url
    raise SystemExit("no Redis was resolvable: the config should have raised")
except ConfigError:
    pass
os.environ["REDIS_URL"] = {redis_url!r}
from engram_workers.dispatch import send
send("engram.apply", ("probe-user", "probe-message"))
print(app.conf.broker_url)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "NEO4J_URI")}
    env.update(ENGRAM_DATA_DIR=str(tmp_path / "no-fleet"), PYTHONPATH=str(SOURCE_ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("redis://"), done.stdout
    client = redis.Redis.from_url(redis_url)
    queued = [json.loads(m) for m in client.lrange(keys.APPLY_QUEUE, 0, -1)]
    assert any(m["headers"]["argsrepr"] == "('probe-user', 'probe-message')" for m in queued), queued
    client.delete(keys.APPLY_QUEUE)
