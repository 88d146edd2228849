"""On a shared host the embedded default keeps its data to its user: the embedded Redis wants a password
(new at every start, in a services.json only the user can read), the data directory is 0700, the files
Redis and SQLite write are 0600, and so is an export file. Real Redis and SQLite."""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from engram_api import MemoryClient
from engram_api.settings import Settings
from engram_workers import cli
from engram_workers.cli._local import LocalStack
from tests.support.memory import apply_in_process

T0 = datetime(2024, 9, 1, 9, 0, tzinfo=UTC)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[LocalStack, Path]]:
    data = tmp_path / "data"
    stack = LocalStack(Settings(data_dir=data, redis_url=None))
    stack.start_redis(reuse=False)
    yield stack, data
    stack.stop()


def test_the_embedded_redis_wants_its_generated_password(embedded: tuple[LocalStack, Path]) -> None:
    stack, data = embedded
    url = json.loads((data / "services.json").read_text())["redis_url"]
    assert stack.redis_server is not None and stack.redis_server.password and stack.redis_server.password in url
    bare = redis.Redis(host="127.0.0.1", port=stack.redis_server.port)
    with pytest.raises(redis.AuthenticationError):
        bare.ping()
    with pytest.raises(redis.AuthenticationError):
        bare.config_set("dir", "/tmp")  # the way a file was written anywhere the engram user can write
    bare.close()
    # A client of this user finds it (services.json) and gets in.
    with MemoryClient(settings=Settings(data_dir=data, redis_url=None)) as client:
        assert client.redis.ping()


def test_the_data_directory_and_what_redis_and_sqlite_write_are_the_users_only(
    embedded: tuple[LocalStack, Path],
) -> None:
    _, data = embedded
    user = f"p_{uuid.uuid4().hex[:10]}"
    with MemoryClient(settings=Settings(data_dir=data, redis_url=None)) as client:
        apply_in_process(client, user, f"{user}-m0", "I live in Tampa.", T0)
        client.enqueue(user, "I like hiking.", message_id=f"{user}-m1")  # into the AOF
        client.redis.bgrewriteaof()
        client.forget(user, f"{user}-m1")  # the purge waits for rewrites: files of both kinds exist
        assert mode(data) == 0o700
        for name in ("services.json", "graph.sqlite3", "graph.sqlite3-wal", "redis/redis.conf"):
            assert mode(data / name) == 0o600, name
    redis_files = [p for p in (data / "redis").rglob("*") if p.is_file()]
    assert any(".aof" in p.name for p in redis_files), redis_files
    assert {p.name: mode(p) for p in redis_files} == {p.name: 0o600 for p in redis_files}


def test_an_export_file_is_readable_by_its_user_only(embedded: tuple[LocalStack, Path], tmp_path: Path) -> None:
    _, data = embedded
    user = f"p_{uuid.uuid4().hex[:10]}"
    with MemoryClient(settings=Settings(data_dir=data, redis_url=None)) as client:
        apply_in_process(client, user, f"{user}-m0", "I live in Tampa.", T0)
    out = tmp_path / "backup.jsonl"
    out.write_text("")
    out.chmod(0o644)  # an existing file is made private too
    done = CliRunner().invoke(
        cli.main, ["export", user, "-o", str(out)], env={"ENGRAM_DATA_DIR": str(data), "REDIS_URL": None}
    )
    assert done.exit_code == 0, done.output
    assert mode(out) == 0o600 and json.loads(out.read_text().splitlines()[0])["episodes"] == 1
