"""Container-aware worker sizing: the cgroup CPU quota (v2 and v1, read from files laid out as the kernel
does) or ENGRAM_CPU_LIMIT decides how many prefork children an apply worker forks, not the node's cores;
and children are recycled after ENGRAM_WORKER_MAX_TASKS_PER_CHILD tasks. Workers are real processes."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from engram_api import keys
from engram_workers.celery_config import make_celery
from engram_workers.cpus import cgroup_cpu_quota, usable_cpus
from engram_workers.probes import heartbeat_path
from tests.support.operator_processes import engram_process, wait_until
from tests.support.stack import engram_stack

CORES = min(os.cpu_count() or 1, len(os.sched_getaffinity(0)))


def v2_tree(tmp_path: Path, limits: dict[str, str], cgroup: str = "/") -> tuple[Path, Path]:
    """A cgroup v2 mount at tmp_path/cgroup with ``cpu.max`` per directory, and a /proc/self/cgroup naming ``cgroup``."""
    root = tmp_path / "cgroup"
    for relative, text in limits.items():
        directory = root / relative.strip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{cgroup}\n")
    return root, proc


def test_v2_quota_of_the_containers_own_cgroup(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"/": "200000 100000"})
    assert cgroup_cpu_quota(root, proc) == 2.0


def test_v2_unlimited_is_no_quota(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"/": "max 100000"})
    assert cgroup_cpu_quota(root, proc) is None
    assert usable_cpus(root=root, proc_cgroup=proc) == CORES


def test_v2_the_tightest_limit_on_the_way_to_the_root_wins(tmp_path: Path) -> None:
    # Without a cgroup namespace the process sits deep in the hierarchy; a parent's quota applies too.
    limits = {"/": "max 100000", "/kubepods/pod1": "150000 100000", "/kubepods/pod1/ctr": "400000 100000"}
    root, proc = v2_tree(tmp_path, limits, cgroup="/kubepods/pod1/ctr")
    assert cgroup_cpu_quota(root, proc) == 1.5
    assert usable_cpus(root=root, proc_cgroup=proc) == 1  # rounded down: never throttled


def test_v1_quota_and_period(tmp_path: Path) -> None:
    cpu = tmp_path / "cgroup" / "cpu,cpuacct"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:cpu,cpuacct:/\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", proc) == 0.5
    assert usable_cpus(root=tmp_path / "cgroup", proc_cgroup=proc) == 1  # at least one child
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "unlimited"
    assert cgroup_cpu_quota(tmp_path / "cgroup", proc) is None


def test_no_cgroup_files_fall_back_to_affinity_and_cores(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent-proc") is None
    assert usable_cpus(root=tmp_path / "absent", proc_cgroup=tmp_path / "absent-proc") == CORES


def test_an_explicit_limit_wins_over_the_quota(tmp_path: Path) -> None:
    root, proc = v2_tree(tmp_path, {"/": "100000 100000"})
    assert usable_cpus(6.0, root=root, proc_cgroup=proc) == 6
    assert usable_cpus(2.9, root=root, proc_cgroup=proc) == 2


def pool_children(pid: int) -> list[int]:
    return [child.pid for child in psutil.Process(pid).children()]


@pytest.mark.parametrize("limit", [1, 2])
def test_an_apply_worker_forks_one_child_per_allowed_cpu(redis_url: str, tmp_path: Path, limit: int) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        env = {**stack.env, "ENGRAM_CPU_LIMIT": str(limit), "TMPDIR": str(tmp_path)}
        with engram_process("apply", ["worker", "--stage", "apply"], env=env, log_dir=tmp_path) as worker:
            worker.wait_for_log("ready.", timeout=120)
            assert len(pool_children(worker.pid)) == limit
            assert (tmp_path / heartbeat_path("apply").name).exists()
        # A clean exit removes the heartbeat (`engram probe live` fails until a new process runs).
        assert not (tmp_path / heartbeat_path("apply").name).exists()


def test_children_are_recycled_after_max_tasks(redis_url: str, tmp_path: Path) -> None:
    with engram_stack(redis_url=redis_url, data_dir=tmp_path, neo4j_uri=None, llm_url=None, workers=False) as stack:
        env = {**stack.env, "ENGRAM_WORKER_MAX_TASKS_PER_CHILD": "1", "TMPDIR": str(tmp_path)}
        args = ["worker", "--stage", "maintenance"]  # prefork x1; a redelivery sweep of an empty stack is cheap
        with engram_process("maintenance", args, env=env, log_dir=tmp_path) as worker:
            worker.wait_for_log("ready.", timeout=120)
            (first,) = pool_children(worker.pid)
            celery = make_celery(stack.settings, stack.env["REDIS_URL"])
            celery.send_task(keys.REDELIVER_TASK, queue=keys.MAINTENANCE_QUEUE, routing_key=keys.MAINTENANCE_QUEUE)
            worker.wait_for_log("succeeded", timeout=120)
            # The child that ran the task is replaced by a fresh one (the pool keeps its size).
            replaced = wait_until(
                lambda: (kids := pool_children(worker.pid)) and first not in kids and kids,
                timeout=60,
                what="the pool child to be replaced",
            )
            assert len(replaced) == 1


def test_memory_recycling_is_given_to_celery_in_kib(redis_url: str) -> None:
    from engram_api.settings import load_settings
    from engram_workers.celery_config import celery_config

    off = celery_config(load_settings(), redis_url)
    assert off["worker_max_tasks_per_child"] is None and off["worker_max_memory_per_child"] is None
    on = celery_config(load_settings(worker_max_tasks_per_child=7, worker_max_memory_per_child_mb=512), redis_url)
    assert on["worker_max_tasks_per_child"] == 7 and on["worker_max_memory_per_child"] == 512 * 1024
