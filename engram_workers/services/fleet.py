"""Who runs on a data directory: each ``engram up`` / ``engram demo`` (a *supervisor*) records itself and
every process it starts (embedded Redis, workers, Beat, Flower) in ``DATA_DIR/fleet/<pid>.json``.

Invariants:

- A process is named by (pid, start time in clock ticks since boot): a recycled pid is never taken
  for one of ours, so nothing here ever signals a stranger.
- Children started with ``die_with_parent`` get SIGTERM from the kernel when the supervisor's thread
  that started them dies, however it dies (SIGKILL, the OOM killer, a closed terminal): Redis flushes
  its AOF and exits, workers shut down warm. Leftovers exist only while they shut down, or when a
  child outlived that signal.
- A record whose supervisor is gone is leftovers: :func:`reap_leftovers` ends every process of it that
  still runs (SIGTERM to its process group, SIGKILL after a grace period) and deletes the record, and
  ``services.json`` when the dead supervisor owned the embedded Redis.

Linux only (``/proc`` and ``prctl``), like the embedded topology itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

__all__ = [
    "FleetRecord",
    "ProcessRef",
    "end_processes",
    "live_supervisors",
    "parent_death_signal",
    "reap_leftovers",
    "record_path",
    "save_record",
]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
FLEET_DIR = "fleet"


def _start_time(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None when it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # exited, waiting for its parent to reap it: gone for our purposes
        return None
    return int(fields[19])


class ProcessRef(BaseModel):
    name: str
    pid: int
    start_time: int
    # Children run in sessions of their own: their group holds a worker's pool processes too. A
    # supervisor shares its shell's group, which must never be signalled as a whole.
    leads_group: bool = False

    @classmethod
    def of(cls, name: str, pid: int, *, leads_group: bool = False) -> ProcessRef:
        started = _start_time(pid)
        if started is None:
            raise ProcessLookupError(f"{name} (pid {pid}) is not running")
        return cls(name=name, pid=pid, start_time=started, leads_group=leads_group)

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start_time


class FleetRecord(BaseModel):
    supervisor: ProcessRef
    children: list[ProcessRef] = []
    owns_redis: bool = False


def record_path(data_dir: Path, pid: int) -> Path:
    return data_dir / FLEET_DIR / f"{pid}.json"


def save_record(data_dir: Path, record: FleetRecord) -> None:
    """Written whole or not at all (a reader never sees half a record)."""
    path = record_path(data_dir, record.supervisor.pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(record.model_dump_json())
    partial.replace(path)


def _records(data_dir: Path) -> list[tuple[Path, FleetRecord]]:
    found = []
    for path in sorted((data_dir / FLEET_DIR).glob("*.json")):
        try:
            found.append((path, FleetRecord.model_validate_json(path.read_text())))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # a record cut short by a crash while it was written names no one
    return found


def live_supervisors(data_dir: Path) -> list[FleetRecord]:
    return [record for _, record in _records(data_dir) if record.supervisor.alive()]


def _signal(ref: ProcessRef, signum: int) -> None:
    """``signum`` to the process and, for a child leading its own group, the group (its pool children)."""
    if not ref.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if ref.leads_group and os.getpgid(ref.pid) == ref.pid:
            os.killpg(ref.pid, signum)
        else:
            os.kill(ref.pid, signum)


def end_processes(refs: Sequence[ProcessRef], *, grace_s: float) -> None:
    """SIGTERM to each (newest first), SIGKILL to whatever still runs after ``grace_s`` seconds."""
    for ref in reversed(refs):
        _signal(ref, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(ref.alive() for ref in refs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for ref in refs:
        _signal(ref, signal.SIGKILL)
    # SIGKILL cannot be refused; this waits for the kernel to finish it (bounded: a process we may not
    # signal, or one stuck in the kernel, must not hang the caller).
    deadline = time.monotonic() + 10.0
    while any(ref.alive() for ref in refs) and time.monotonic() < deadline:
        time.sleep(0.05)


def reap_leftovers(data_dir: Path, *, grace_s: float = 30.0) -> list[FleetRecord]:
    """End what dead supervisors left running on ``data_dir``; returns their records."""
    from engram_api.connections import SERVICES_FILE

    reaped = []
    for path, record in _records(data_dir):
        if record.supervisor.alive():
            continue
        end_processes(record.children, grace_s=grace_s)
        if record.owns_redis:
            (data_dir / SERVICES_FILE).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        reaped.append(record)
    return reaped


def parent_death_signal(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for Popen: the child gets ``signum`` when the thread that started it dies.

    The parent's pid is taken before the fork; a child whose parent died before prctl took effect
    (the race the kernel leaves open) exits at once instead of living on unsupervised.
    """
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)

    return arm
