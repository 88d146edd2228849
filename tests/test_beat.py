"""`engram beat` on a short schedule: every maintenance job fires and runs; two Beats started together
fire each job once per interval (RedBeat's Redis lock elects one), and the standby takes over when the
leader is SIGKILLed.

Evidence is the fleet's own Celery events: Beat publishes a task-sent event (with its pid) for every job
it fires (always), the maintenance worker a task-succeeded event for every job it ran (once asked for task
events, as Flower asks).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from beat_schedule import JOBS
from engram_workers.celery_config import BEAT_LOCK_TIMEOUT_S, BEAT_MAX_INTERVAL_S
from tests.support.operator_processes import EventLog, engram_process, wait_until
from tests.support.stack import Stack, engram_stack

pytestmark = pytest.mark.slow  # two Beats, a worker, a SIGKILL and a lock expiry

INTERVAL_S = 2
TASKS = [task for task, _ in JOBS.values()]
# Sends per job to observe with both Beats up: three intervals. Two schedulers would fire twice as often.
SENDS = 4


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    intervals = {field: INTERVAL_S for _, field in JOBS.values()}
    with engram_stack(
        redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("beat"),
        neo4j_uri=None,
        llm_url=None,
        workers=False,
        **intervals,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def events(stack: Stack) -> Iterator[EventLog]:
    """The maintenance worker (as `engram worker --stage maintenance`) and an event receiver."""
    worker = engram_process("maintenance", ["worker", "--stage", "maintenance"], env=stack.env, log_dir=stack.data_dir)
    with worker:
        worker.wait_for_log("ready.", timeout=90)
        log = EventLog(stack.settings, stack.env["REDIS_URL"]).start()
        assert log.ask_for_task_events() == {"maintenance"}
        try:
            yield log
        finally:
            log.stop()


def senders(events: EventLog, task: str) -> set[int]:
    return {e["pid"] for e in events.sent(task)}


def check_once_per_interval(sends: list[dict[str, Any]]) -> None:
    """One scheduler sends a job at most once per interval, so n sends span at least (n-1) intervals on
    Beat's own clock; +1 allows for a tick landing a hair early at either edge of the window. Two
    unsynchronised schedulers would send ~2x as many in the same span."""
    times = [float(e["timestamp"]) for e in sends]
    span = times[-1] - times[0]
    assert len(times) - 1 <= span / INTERVAL_S + 1, f"{len(times)} sends in {span:.1f}s: more than one scheduler"


def test_two_beats_fire_each_job_once_per_interval_and_the_standby_takes_over(
    stack: Stack, events: EventLog, tmp_path: Path
) -> None:
    beats = [engram_process(f"beat{i}", ["beat"], env=stack.env, log_dir=tmp_path) for i in (1, 2)]
    try:
        for beat in beats:
            beat.start()
        for beat in beats:
            beat.wait_for_log("beat: Starting", timeout=90)

        # Each job fired several times and the maintenance worker ran it to a clean report. (Runs that
        # waited longer than the interval are dropped by `expires`: not every send runs.)
        wait_until(
            lambda: all(len(events.sent(t)) >= SENDS for t in TASKS), timeout=60, what=f"{SENDS} sends of every job"
        )
        wait_until(lambda: all(events.succeeded(t) for t in TASKS), timeout=30, what="every job to succeed")
        for task in TASKS:
            assert all("'failed': []" in e["result"] for e in events.succeeded(task)), task

        # Both Beats were up the whole time, yet one process sent everything, at one scheduler's rate.
        by_pid = {beat.pid: beat for beat in beats}
        fired_by = set().union(*(senders(events, task) for task in TASKS))
        assert len(fired_by) == 1, f"jobs sent by {fired_by}, Beats are {sorted(by_pid)}"
        leader = by_pid[fired_by.pop()]
        (standby,) = [beat for beat in beats if beat is not leader]
        for task in TASKS:
            check_once_per_interval(events.sent(task))
        assert "beat: Acquired lock" in leader.log_path.read_text()
        assert "Sending due task" not in standby.log_path.read_text()

        # A crash: the lock is not released, it expires; the standby polls for it every max interval.
        leader.kill()
        wait_until(
            lambda: all(len([e for e in events.sent(t) if e["pid"] == standby.pid]) >= 2 for t in TASKS),
            timeout=BEAT_LOCK_TIMEOUT_S + BEAT_MAX_INTERVAL_S + 2 * INTERVAL_S + 15,  # + slack for a loaded machine
            what="the standby Beat to fire every job twice",
        )
        for task in TASKS:
            check_once_per_interval(events.sent(task))  # across the hand-over too: no job fired twice
        assert "beat: Acquired lock" in standby.log_path.read_text()
        assert not events.of_type("task-failed"), events.of_type("task-failed")
    finally:
        for beat in beats:
            beat.stop()
