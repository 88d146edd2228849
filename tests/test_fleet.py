"""`engram up` killed hard leaves nothing behind: its children die with it (parent-death signal), the next
`engram up` on the same data directory ends whatever is left and carries on with the queued work (what the
killed workers held comes back within the visibility timeout plus one restore interval,
``celery_config.redelivery_bound_s``), and `engram down` stops a running fleet. Real processes throughout:
embedded Redis, workers, SQLite graph.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram_api import MemoryClient, keys
from engram_api.models import MessageState, Receipt
from engram_api.settings import Settings
from engram_workers.celery_config import redelivery_bound_s
from engram_workers.services.fleet import FleetRecord, ProcessRef, record_path
from tests.support.operator_processes import clean_env

BURST = 60


def _start_up(env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "engram_workers.cli", "up", "--no-beat", "--extract-concurrency", "2",
             "--apply-concurrency", "1"],
            env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _wait_up(proc: subprocess.Popen[str], log: Path, *, runs: int) -> None:
    """Until the log says "Engram is up" ``runs`` times (the log is shared by both runs)."""
    deadline = time.monotonic() + 240
    while log.read_text().count("Engram is up") < runs:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def _client(data_dir: Path) -> MemoryClient:
    url = json.loads((data_dir / "services.json").read_text())["redis_url"]
    return MemoryClient(settings=Settings(data_dir=data_dir), redis_url=url)


def _record(data_dir: Path, pid: int) -> FleetRecord:
    return FleetRecord.model_validate_json(record_path(data_dir, pid).read_text())


def _applied(client: MemoryClient, receipts: list[Receipt]) -> int:
    states = client.producer.states([(r.user_id, r.message_id) for r in receipts])
    return sum(state == MessageState.APPLIED for state in states)


def _alive(refs: list[ProcessRef]) -> list[str]:
    return [f"{ref.name} (pid {ref.pid})" for ref in refs if ref.alive()]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two fleet starts, the bound, and a burst on a loaded machine
@pytest.mark.parametrize("pod", [False, True], ids=["up", "pod"])
def test_a_killed_up_leaves_no_process_and_the_next_up_applies_every_message_once(tmp_path: Path, pod: bool) -> None:
    """``pod``: every process of the fleet is SIGKILLed at once (a container killed past its grace period), so
    none of them hands back what it held: only the visibility timeout brings it back."""
    data_dir = tmp_path / "data"
    env = clean_env(ENGRAM_DATA_DIR=str(data_dir))  # the defaults: the bound checked is the documented one
    log = tmp_path / "up.log"
    first = _start_up(env, log)
    second: subprocess.Popen[str] | None = None
    try:
        _wait_up(first, log, runs=1)
        first_run = _record(data_dir, first.pid)
        assert {c.name for c in first_run.children} == {"redis", "extract", "apply"}
        (apply,) = [c for c in first_run.children if c.name == "apply"]
        with _client(data_dir) as client:
            receipts = [client.enqueue(f"fleet-{os.getpid()}-0", "I live in Austin.")]
            deadline = time.monotonic() + 180
            while not _applied(client, receipts):
                assert time.monotonic() < deadline, "nothing applied"
                time.sleep(0.1)
            # The apply worker (its whole group, pool included) is frozen before the rest of the burst is
            # sent, so the kill lands mid-burst however fast or slow the machine: one message applied, the
            # rest queued or in flight.
            os.killpg(apply.pid, signal.SIGSTOP)
            receipts += [client.enqueue(f"fleet-{os.getpid()}-{i}", "I live in Austin.") for i in range(1, BURST)]
            applied_before = _applied(client, receipts)
            held = set(client.redis.hkeys(keys.kombu_unacked()))  # what the workers hold: back after the bound
            first.send_signal(signal.SIGKILL)
            for child in first_run.children if pod else ():
                os.killpg(child.pid, signal.SIGKILL)  # each leads its own group: a worker with its pool
            killed_at, killed_wall = time.monotonic(), time.time()
        first.wait()
        with contextlib.suppress(ProcessLookupError):  # gone already: nothing to wake
            os.killpg(apply.pid, signal.SIGCONT)  # let it see its supervisor is gone, as a running worker would
        assert applied_before == 1

        second = _start_up(env, log)
        _wait_up(second, log, runs=2)
        up_s = time.monotonic() - killed_at
        assert not _alive(first_run.children), "processes of the killed run still run"
        assert not record_path(data_dir, first.pid).exists()

        with _client(data_dir) as client:
            # Held at the kill: back on a queue (or delivered again) within the bound, counted from the kill
            # or, if the fleet came back later than that, from its return; twice it, for a loaded machine.
            bound = redelivery_bound_s(client.settings)
            back_by = time.monotonic() + 2 * bound
            while True:
                index = dict(client.redis.zrange("unacked_index", 0, -1, withscores=True))
                if all(index.get(tag, killed_wall + 1) > killed_wall for tag in held):
                    back_s = time.monotonic() - killed_at
                    break
                assert time.monotonic() < back_by, f"held at the kill and not back: {len(held)}"
                time.sleep(0.2)
            result = client.wait(receipts, timeout=240)
            applied_s = time.monotonic() - killed_at
            assert result.done and not result.dead_lettered, result
            for receipt in receipts:
                (fact,) = client.graph.page(receipt.user_id, 1, 10).facts  # applied once: one fact
                assert fact.statement == "User lives in Austin"
                assert fact.source_ids == [receipt.message_id]  # one provenance link, not two
                assert [e.id for e in client.graph.episodes(receipt.user_id)] == [receipt.message_id]
        print(f"\nengram up SIGKILL: {len(held)} held; up again {up_s:.1f}s, back {back_s:.1f}s (bound "
              f"{bound:.1f}s), all {BURST} applied {applied_s:.1f}s after the kill")  # fmt: skip

        second_run = _record(data_dir, second.pid)
        down = subprocess.run(
            [sys.executable, "-m", "engram_workers.cli", "down"], env=env, capture_output=True, text=True, timeout=180
        )
        assert down.returncode == 0, down.stderr
        assert "stopped." in down.stderr
        assert second.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert not _alive(second_run.children)
        assert not list((data_dir / "fleet").glob("*.json"))
        assert not (data_dir / "services.json").exists()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_down_with_nothing_running_says_so(tmp_path: Path) -> None:
    env = clean_env(ENGRAM_DATA_DIR=str(tmp_path / "data"))
    down = subprocess.run([sys.executable, "-m", "engram_workers.cli", "down"], env=env, capture_output=True, text=True)
    assert down.returncode == 0 and "nothing runs on" in down.stderr
