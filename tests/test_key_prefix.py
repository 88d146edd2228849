"""Two deployments on ONE Redis database, apart by their key prefix (ENGRAM_REDIS_KEY_PREFIX, issue 45 item 7):
each runs a message end to end (the operator's `engram enqueue --wait` -> its own Celery workers -> its own
store), a recall, its own Beat leader lock; erasing a user in one leaves the other's keys of the SAME user id
untouched; each deployment's processes run as the ACL users docs/operations.md gives them, their key and channel
patterns carrying the prefix, with nothing refused; and every key and channel in Redis carries one of the two prefixes (kombu's queues, ``unacked``,
bindings and pidbox through its ``global_keyprefix``, RedBeat's through its key prefix, Engram's through
``engram_api.keys``). Without the setting keys are exactly what they were.

A process serves one deployment (the prefix is read once, when ``engram_api.keys`` is imported), so both
deployments run in child processes here; this process, unprefixed, only inspects Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from engram_api import keys
from engram_api.errors import ConfigError
from engram_api.settings import load_settings
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER, ManagedProcess, worker_command
from engram_workers.services.redis_server import RedisServer
from tests.support.acl import documented_acl
from tests.support.operator_processes import clean_env, engram_process
from tests.support.stack import SETTLE_S, SOURCE_ROOT

DEPLOYMENTS = ("alpha", "beta")
USER = "shared_user"  # the same user id in both deployments: only the prefix keeps them apart


def test_without_a_prefix_the_keys_are_what_they_were() -> None:
    assert keys.DEPLOYMENT_PREFIX == "" and load_settings().redis_key_prefix == ""
    assert keys.status("u", "m") == "engram:status:u:m"
    assert keys.stamps_channel() == "engram:stamps"
    assert keys.queue_lists(keys.EXTRACT_QUEUE)[0] == "engram.extract"
    assert (keys.kombu_unacked(), keys.BEAT_LOCK) == ("unacked", "engram:beat:lock")


@pytest.mark.parametrize(("name", "problem"), [("a*", "letters, digits"), ("-x", "starting with"), ("beta", "one")])
def test_a_bad_or_second_prefix_is_refused_naming_the_setting(name: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        load_settings(redis_key_prefix=name)  # "beta": this process already serves the unprefixed keys
    assert caught.value.variable == "ENGRAM_REDIS_KEY_PREFIX"


def test_a_process_started_with_a_malformed_prefix_stops_naming_it() -> None:
    env = {**clean_env(), "ENGRAM_REDIS_KEY_PREFIX": "two words", "PYTHONPATH": str(SOURCE_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", "import engram_api.keys"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "ENGRAM_REDIS_KEY_PREFIX: must be 1-64 letters" in done.stderr


def _engram(env: dict[str, str], *args: str) -> object:
    """``engram <args> --json`` in a child process of the deployment ``env`` describes; its JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "engram_workers.cli", *args, "--json"],
        env=env, cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=SETTLE_S + 60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@contextmanager
def deployment(name: str, server: RedisServer, admin: redis.Redis, base: Path) -> Iterator[dict[str, str]]:
    """Deployment ``name``, each process kind as the ACL user the docs give it, with the prefix in its key
    patterns: its workers and Beat running; yields the environment of its client commands."""
    url = {}
    for user, rules in documented_acl(0, name).items():
        admin.execute_command("ACL", "SETUSER", *rules)
        url[user.removeprefix(f"{name}-")] = f"redis://{user}:{user}-pw@127.0.0.1:{server.port}/0"
    env = clean_env(
        ENGRAM_DATA_DIR=str(base / name), ENGRAM_REDIS_KEY_PREFIX=name, ENGRAM_VISIBILITY_TIMEOUT_S="60",
        PYTHONPATH=os.pathsep.join([str(SOURCE_ROOT), os.environ.get("PYTHONPATH", "")]),
    )  # fmt: skip
    workers = {**env, "REDIS_URL": url["engram-worker"]}
    with ExitStack() as running:
        for stage, spec in (("extract", EXTRACT_WORKER), ("apply", APPLY_WORKER)):
            argv = worker_command(queues=spec["queues"], pool=str(spec["pool"]), concurrency=2, name=f"{name}-{stage}")
            worker = ManagedProcess(
                name=f"{name}-{stage}", argv=argv, env=workers, log_dir=base / "logs", cwd=SOURCE_ROOT
            )
            running.enter_context(worker)
            worker.wait_for_log("ready.", timeout=90)
        beat_env = {**env, "REDIS_URL": url["engram-beat"]}
        beat = running.enter_context(engram_process(f"{name}-beat", ["beat"], env=beat_env, log_dir=base / "logs"))
        beat.wait_for_log("beat: Acquired lock", timeout=90)
        yield {**env, "REDIS_URL": url["engram-client"]}


def _user_keys(r: redis.Redis, name: str) -> set[str]:
    """Deployment ``name``'s keys of ``USER``: its prefix before the unprefixed patterns of ``keys``."""
    return {k for pattern in keys.user_keys_pattern(USER) for k in r.scan_iter(match=f"{name}:{pattern}", count=1000)}


def _channels_published(pubsub: redis.client.PubSub) -> set[str]:
    """The channels of every message ``pubsub`` (subscribed to the pattern "*") received so far."""
    seen = set()
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        if message["type"] == "pmessage":
            seen.add(message["channel"])
    return seen


@pytest.mark.slow  # a Redis, two deployments' workers and Beats (six processes), the CLI's commands
def test_two_deployments_share_one_database_apart(tmp_path: Path) -> None:
    with (
        RedisServer(data_dir=tmp_path / "redis", appendonly=True, password="admin-pw") as server,
        ExitStack() as running,
    ):
        r = redis.Redis.from_url(server.url, decode_responses=True)
        published = r.pubsub()
        published.psubscribe("*")  # every channel anything publishes on (stamps, Celery's broadcasts)
        envs = {name: running.enter_context(deployment(name, server, r, tmp_path)) for name in DEPLOYMENTS}
        for name, env in envs.items():
            said = f"My name is Ada and I live in {'Lisbon' if name == 'alpha' else 'Porto'}."
            result = _engram(env, "enqueue", USER, said, "--timestamp", "2024-05-01T10:00:00Z", "--wait")
            assert len(result["wait"]["applied"]) == 1 and not result["wait"]["pending"], result  # type: ignore[index]
        for name, city, other in (("alpha", "Lisbon", "Porto"), ("beta", "Porto", "Lisbon")):
            context = _engram(envs[name], "context", USER, "where do I live?")["context"]  # type: ignore[index]
            assert city in context and other not in context  # each reads its own store and keys only
            # Each Beat leads its own deployment: both locks are held at once.
            assert r.exists(f"{name}:{keys.BEAT_LOCK}") and r.exists(f"{name}:{keys.user_version(USER)}")

        beta_before = _user_keys(r, "beta")
        assert any(":status:" in k for k in beta_before) and _user_keys(r, "alpha")
        _engram(envs["alpha"], "forget-user", USER, "--yes")
        assert not any(":status:" in k for k in _user_keys(r, "alpha"))
        assert _user_keys(r, "beta") == beta_before  # nothing of beta's same-named user was touched
        assert "Porto" in _engram(envs["beta"], "context", USER, "where do I live?")["context"]  # type: ignore[index]

        # Every key and channel carries one of the two prefixes: Engram's, kombu's and RedBeat's.
        everything = set(r.scan_iter(count=1000))
        channels = set(r.pubsub_channels()) | _channels_published(published)
        assert {k for k in everything | channels if not k.startswith(("alpha:", "beta:"))} == set()
        for name in DEPLOYMENTS:  # premise: each kind of key and channel was there to be checked
            own = {k.removeprefix(f"{name}:") for k in everything | channels}
            assert {"_kombu.binding.engram.extract", keys.BEAT_LOCK, keys.MAINTENANCE_SEQUENCE} <= own
            assert keys.stamps_channel() in own
        assert r.execute_command("ACL", "LOG") == []  # no process needed a key or channel outside its prefix
