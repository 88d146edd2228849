"""What a benchmark reads besides its own clock: the machine it runs on, a process's memory and CPU
seconds (from /proc), and Redis's command counts.

Each reading is a snapshot of counters that only grow (CPU ticks, command calls), so a cost is always the
difference of two readings taken around what is measured; CPU counts a process's threads and its
descendants, reaped ones included. Where /proc is missing the figures are NaN, never zero. Imported
through ``benchlib``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores, CPU model, RAM, and the load averages right now (other
    processes share the two cores: a high load makes absolute times meaningless, ratios less so)."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = float("nan")
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024**2, 1)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "loadavg_1_5_15min": list(os.getloadavg()),
    }


def proc_memory(pid: int) -> dict[str, float]:
    """Peak and current resident set size of a process in MiB (VmHWM/VmRSS from /proc), plus its unique
    set size (USS: memory freed if it exited) when psutil is installed."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) / 1024
    out = {"peak_rss_mib": fields.get("VmHWM", float("nan")), "rss_mib": fields.get("VmRSS", float("nan"))}
    out["uss_mib"] = float("nan")
    try:
        import psutil
    except ImportError:
        return out
    with contextlib.suppress(OSError, psutil.Error):
        out["uss_mib"] = psutil.Process(pid).memory_full_info().uss / 2**20
    return out


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in children.read_text().split()]
    return out


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) of one process so far, from one read of /proc/<pid>/stat:
    cheap enough to take around every store call (``cpu_seconds`` walks the process tree). NaN without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def command_calls(client: Any, *, since: Mapping[str, int] | None = None) -> collections.Counter[str]:
    """Calls per Redis command (``INFO commandstats``: a pipeline counts each of its commands, a script one
    ``evalsha`` plus what it calls), since the server started or since an earlier reading."""
    stats = client.info("commandstats")
    calls = collections.Counter({name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()})
    calls.subtract(since or {})
    return calls


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU seconds (user + system, all threads) used so far by ``pids`` and all their descendants, from
    /proc/<pid>/stat. Reaped children count through their parent's cutime/cstime, so a pool child that
    exits between two readings is not lost. NaN where /proc is not available."""
    if not Path("/proc/self/stat").exists():
        return float("nan")
    ticks = 0
    for root in pids:
        for pid in _tree(root):
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
                ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime (fields 14-17)
    return ticks / _CLK_TCK
