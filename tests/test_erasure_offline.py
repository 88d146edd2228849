"""Erasure with the embedded fleet stopped: `engram forget-user` and `engram forget` reach the queue and the
dead letters kept in the embedded Redis's files (they start that Redis for the command), so the next
`engram up` applies, lists and recalls nothing of what was erased; the library refuses instead of erasing
half. Real Redis (the embedded one, on its own files in the data directory), SQLite, workers, LLM stand-in.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engram_api import MemoryClient, keys
from engram_api.errors import StoreUnavailableError
from engram_api.models import DeadLetter
from engram_api.settings import Settings
from engram_testing.llm_standin import Reply
from engram_workers import cli
from engram_workers.services import RedisServer
from engram_workers.services.celery_worker import APPLY_WORKER, EXTRACT_WORKER
from tests.support.memory import apply_in_process
from tests.support.stack import SETTLE_S, engram_stack

T0 = datetime(2024, 7, 1, 9, 0, tzinfo=UTC)
SECRET = "My private medical note: I have asthma."


def stopped_fleet_env(data: Path) -> dict[str, str | None]:
    """The embedded default with `engram up` not running: no REDIS_URL, no services.json."""
    return {"REDIS_URL": None, "ENGRAM_DATA_DIR": str(data), "NEO4J_URI": None, "LLM_MODEL": None}


def drained(client: MemoryClient, timeout: float) -> None:
    """Until no task waits in a queue or runs unacknowledged (Celery's Redis transport keeps those in
    ``unacked``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pipe = client.redis.pipeline()
        pipe.llen(keys.EXTRACT_QUEUE).llen(keys.APPLY_QUEUE).hlen("unacked")
        if not any(pipe.execute()):
            return
        time.sleep(0.2)
    raise AssertionError("the queues did not drain")


def test_forget_with_the_fleet_stopped_reaches_the_queue_and_the_dead_letters(tmp_path: Path, llm_standin: Any) -> None:
    data, suffix = tmp_path / "data", uuid.uuid4().hex[:8]
    gina, hank, ivy = f"gina{suffix}", f"hank{suffix}", f"ivy{suffix}"
    llm_standin.script(lambda req: Reply.json({"entities": [], "facts": []}))
    server = RedisServer(data_dir=data / "redis", appendonly=True)  # where `engram up` keeps its Redis
    server.start()
    try:
        with engram_stack(
            redis_url=server.url, data_dir=data, neo4j_uri=None, llm_url=llm_standin.url, workers=False, database=0
        ) as stack:
            client = stack.client
            apply_in_process(client, gina, f"{gina}-m0", "I live in Tampa.", T0)
            client.enqueue(gina, SECRET, message_id=f"{gina}-m1")  # queued: no worker runs
            letter = DeadLetter(user_id=gina, message_id=f"{gina}-m2", stage="extract", reason="LLM failed")
            assert client.producer.ledger.dead_letter(letter)
            client.enqueue(hank, "I like chess.", message_id=f"{hank}-m1")
            server.stop()  # the fleet is stopped

            # The library cannot reach Redis: it refuses, and erases nothing.
            offline = MemoryClient(settings=Settings(data_dir=data, redis_url=None))
            with pytest.raises(StoreUnavailableError, match="forget needs Redis"):
                offline.forget_user(gina)
            assert offline.stats(gina).episodes == 1
            offline.close()

            # The CLI starts the embedded Redis for the erasure, and stops it after.
            runner, env = CliRunner(), stopped_fleet_env(data)
            done = runner.invoke(cli.main, ["forget-user", gina, "--yes"], env=env)
            assert done.exit_code == 0 and done.stdout.startswith(f"erased {gina}: 1 episode,"), done.output
            done = runner.invoke(cli.main, ["forget", hank, f"{hank}-m1"], env=env)
            assert done.exit_code == 0 and done.stdout.startswith(f"forgot message {hank}-m1"), done.output
            assert not (data / "services.json").exists()

            server.start()  # `engram up`: the AOF brings the queue back
            stack.start_worker("extract", EXTRACT_WORKER, concurrency=2)
            stack.start_worker("apply", APPLY_WORKER)
            sentinel = client.enqueue(ivy, "I like tea.", message_id=f"{ivy}-m1")
            assert client.wait([sentinel], timeout=SETTLE_S).applied == [f"{ivy}-m1"]
            drained(client, SETTLE_S)

            assert client.dead_letters(gina) == [] and client.dead_letters() == []
            assert client.stats(gina).episodes == 0 and client.stats(hank).episodes == 0
            assert not client.graph.is_applied(hank, f"{hank}-m1")
            assert client.recall(gina, "asthma medical note").items == []
            asked = [str(r.messages) for r in llm_standin.requests]
            assert len(asked) == 1 and "I like tea." in asked[0]  # the erased messages never reached the LLM
    finally:
        server.stop()
