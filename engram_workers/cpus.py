"""How many CPUs this process may really use: the container's CPU quota, not the node's core count.

Python 3.11's ``os.cpu_count()`` counts the machine's cores, so a prefork worker in a 2-CPU pod on a
64-core node would fork 64 children. ``usable_cpus`` takes the smallest of: the explicit
``ENGRAM_CPU_LIMIT`` (which, when set, wins over everything else), the cgroup CPU quota (v2 ``cpu.max``
of this process's cgroup and its ancestors, or v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``), the CPU
affinity mask, and the core count. A fractional quota is rounded down (1.5 CPUs: one child, never
throttled), with at least one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cgroup_cpu_quota", "usable_cpus"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # missing (not this cgroup version) or unreadable: no limit from this file
        return None


def _v2_quota(text: str) -> float | None:
    """``cpu.max`` holds "<quota> <period>" in microseconds, or "max <period>" when unlimited."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def _v2_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """This process's cgroup v2 directory and its ancestors up to ``root`` (a limit anywhere above applies).

    Inside a container with a cgroup namespace the path is "/" and ``root`` itself is the container's cgroup.
    """
    relative = "/"
    for line in (_read(proc_cgroup) or "").splitlines():
        if line.startswith("0::"):
            relative = line[3:] or "/"
    here = root / relative.lstrip("/")
    dirs = [here, *here.parents]
    return [d for d in dirs if d == root or root in d.parents]


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (2.0 for "200000 100000"); None when unlimited."""
    quotas = []
    for directory in _v2_dirs(root, proc_cgroup):
        text = _read(directory / "cpu.max")
        quota = _v2_quota(text) if text else None
        if quota is not None:
            quotas.append(quota)
    for v1 in ("cpu", "cpu,cpuacct"):
        quota_us, period_us = _read(root / v1 / "cpu.cfs_quota_us"), _read(root / v1 / "cpu.cfs_period_us")
        if quota_us and period_us and int(quota_us) > 0 and int(period_us) > 0:
            quotas.append(int(quota_us) / int(period_us))
    return min(quotas) if quotas else None


def usable_cpus(explicit: float | None = None, *, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Whole CPUs this process may use (>= 1): ``explicit`` if given, else the quota, affinity and core count."""
    if explicit is not None:
        return max(1, math.floor(explicit))
    limits: list[float] = [os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):  # Linux; elsewhere the core count is all there is
        limits.append(len(os.sched_getaffinity(0)))
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        limits.append(quota)
    return max(1, math.floor(min(limits)))
