"""The hosts bench's reader host in a process of its own, beside the in-process readers of the same run.

Why: the hosts bench runs its five "hosts" as ``MemoryClient``s in ONE process, so the reader it measures
shares its interpreter (the GIL, the garbage collector) with the other four and their reader threads,
while on many hosts every process is its own host. This reader is a child process (this file run as a
script, JSON lines on its stdin and stdout) holding one ``MemoryClient`` with its own data directory, not
listening for stamps (as the in-process "catch-up" reader), and the parent asks it, write after write, the
same questions it asks that reader: a recall right after another host's write, a second recall with no
write since, and the floor (query embedding + FAISS search, top 30) of the same loop. Every time is taken
in the child around the call itself, so the pipe's round trip is in none of them; so is the child's CPU
time and its wait for a core for each answer (``last_cpu_ms``, ``last_wait_ms``: the process's, the reader
being all it runs; ``hosts_pairs.process_meter``).

    reader = ChildReader.start(env, data_dir)      # the parent: the stack's environment, a data directory
    reader.recall(user_id, query) -> (ms, timings_ms)
    reader.floor(user_id, query) -> ms
    reader.last_cpu_ms, reader.last_wait_ms        # the last recall's or floor's, in the child
    reader.timed_recall(user_id, query) -> Timed   # the same, as one ``hosts_pairs.Timed``
    reader.timed_floor(user_id, query) -> Timed
    reader.stats() -> {"rebuilds": ..., "from_feed": ...}
    reader.close()

"Separate host" (``separate_core``, optional): the child pinned to one core and this process, Neo4j and
Redis to the other(s), as a reader host does not share its cores with the graph or the apply hosts. It
emulates that the reader's CPU is its own: nothing of this run competes with it for its core. It does not
emulate a host: the reader's encoder and its Python (the recall's thread, its pool) share that ONE core
where a host has several (so the query's embedding and the keyword search no longer overlap), the
machine's other processes (other users' jobs) are not pinned and still run on both cores (the reader's
wait for a core, measured, says how much: most right after a write in loaded runs), the two
cores share their caches and memory, and Redis and Neo4j answer over loopback, not a network. So its CPU
figures are the child's; its wall figures are no isolated host's on a shared machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hosts_pairs import Pairs, Timed, process_meter, timed_floor, timed_recall
from snapshot_refresh import write_one

__all__ = ["ChildReader", "separate_core", "separate_host"]


class ChildReader:
    """The parent's handle on the reader process (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.last_cpu_ms = float("nan")  # the child's CPU for its last recall or floor
        self.last_wait_ms = float("nan")  # and its threads' wait for a core

    @classmethod
    def start(cls, env: Mapping[str, str], data_dir: Path) -> ChildReader:
        """A reader process on the stack's services (``env``: its ``REDIS_URL``, graph store and settings)
        with ``data_dir`` its own; returns once its client is open."""
        child_env = {**os.environ, **env, "ENGRAM_DATA_DIR": str(data_dir)}
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env, bufsize=1,
        )  # fmt: skip
        reader = cls(proc)
        reader._ask({"op": "ready"})
        return reader

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reader process ended (exit code {self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the reader process failed: {answer['error']}")
        return answer

    def recall(self, user_id: str, query: str) -> tuple[float, dict[str, float]]:
        """One recall of ``query`` (k=10, never a cached answer): its milliseconds and ``timings_ms``."""
        got = self._ask({"op": "recall", "user": user_id, "query": query})
        self.last_cpu_ms, self.last_wait_ms = got["cpu_ms"], got["wait_ms"]
        return got["ms"], got["parts"]

    def floor(self, user_id: str, query: str) -> float:
        """The floor's milliseconds: ``query`` embedded (no cache) and the user's index held searched (top 30;
        ``hosts_pairs.timed_floor``)."""
        got = self._ask({"op": "floor", "user": user_id, "query": query})
        self.last_cpu_ms, self.last_wait_ms = got["cpu_ms"], got["wait_ms"]
        return float(got["ms"])

    def timed_recall(self, user_id: str, query: str) -> Timed:
        """``recall``'s milliseconds and the child's CPU and wait for it."""
        return Timed(self.recall(user_id, query)[0], self.last_cpu_ms, self.last_wait_ms)

    def timed_floor(self, user_id: str, query: str) -> Timed:
        """``floor``'s milliseconds and the child's CPU and wait for it."""
        return Timed(self.floor(user_id, query), self.last_cpu_ms, self.last_wait_ms)

    def stats(self) -> dict[str, int]:
        """The child's whole reads of a user's vectors (``IndexKeeper.rebuilds``) and catch-ups the change
        feed answered (``CatchUps.from_feed``)."""
        got = self._ask({"op": "stats"})
        return {"rebuilds": got["rebuilds"], "from_feed": got["from_feed"]}

    def close(self) -> None:
        """Close the child's client and wait for it to exit."""
        if self.proc.poll() is None:
            self._ask({"op": "close"})
            self.proc.wait(timeout=60)


def _serve() -> None:
    """The child: answer the parent's requests, one JSON line each, until "close"."""
    from engram_api import MemoryClient

    client = MemoryClient()
    client.reader  # noqa: B018  (made now: a client's reader starts the stamp listener, stopped at once)
    client.signals.stop()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = _answer(client, request)
        except Exception as exc:  # reported to the parent, which stops the bench
            answer = {"error": repr(exc)}
        print(json.dumps(answer), flush=True)
        if request["op"] == "close":
            return


def _answer(client: Any, request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "ready":
        return {}
    if op == "close":
        client.close()
        return {}
    if op == "stats":
        return {"rebuilds": client.reader.keeper.rebuilds, "from_feed": client.reader.catchups.from_feed}
    user_id, query = request["user"], request["query"]
    if op == "recall":
        timed, got = timed_recall(client, user_id, query, process_meter())
        if got.cached:
            raise RuntimeError(f"recall of {query!r} came from the result cache")
        return {"ms": timed.ms, "parts": got.timings_ms, "cpu_ms": timed.cpu_ms, "wait_ms": timed.wait_ms}
    if op == "floor":
        timed = timed_floor(client, user_id, query, process_meter())
        return {"ms": timed.ms, "cpu_ms": timed.cpu_ms, "wait_ms": timed.wait_ms}
    raise ValueError(f"unknown request {op!r}")


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (a process's affinity is per thread; threads made later
    inherit their maker's)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended since the listing
            os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def separate_core(child: ChildReader, others: Sequence[int]) -> Iterator[dict[str, Any] | None]:
    """While open, ``child`` alone on the last core this process may use, this process and ``others`` (the
    run's Redis and Neo4j) on the rest (see the module docstring for what that emulates); every thread of
    them back on the cores it had when it closes. Yields what was pinned where, or None (and pins
    nothing) with fewer than two cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield None
        return
    reader_cores, rest = {cores[-1]}, set(cores[:-1])
    pids = [os.getpid(), *others]
    had = {pid: os.sched_getaffinity(pid) for pid in [child.proc.pid, *pids]}
    try:
        _pin(child.proc.pid, reader_cores)
        for pid in pids:
            _pin(pid, rest)
        yield {"reader_cores": sorted(reader_cores), "other_cores": sorted(rest), "other_pids": pids}
    finally:
        for pid, cpus in had.items():
            with contextlib.suppress(FileNotFoundError):  # a process that ended
                _pin(pid, cpus)


def separate_host(
    reader: ChildReader, writers: tuple[Any, Any], user_id: str, queries: list[str], servers: list[int]
) -> dict[str, Any] | None:
    """The "separate host" rows: ``reader`` alone on one core, this process and ``servers`` (pids) on the
    other(s) (``separate_core``); one write a query, by ``writers`` in turn (clients in this process, one
    fact each, as the apply stage writes), and after each the reader's recall right after the write and
    again with no write since, each paired with its floor (``hosts_pairs.Pairs``). None, and nothing
    measured, with fewer than two cores."""
    pairs = Pairs()
    rebuilds = reader.stats()["rebuilds"]
    with separate_core(reader, servers) as pinned:
        if pinned is None:
            return None
        for i, query in enumerate(queries):
            write_one(writers[i % 2], user_id, 5 * len(queries) + i, read_index=True)
            for label, text in (("catch-up", query), ("no write since", f"again {query}")):
                pairs.measure(
                    f"separate host: {label}", i, lambda text=text: reader.timed_recall(user_id, text),
                    lambda text=text: reader.timed_floor(user_id, text),
                )  # fmt: skip
    return {
        "cores": pinned,
        "writes": len(queries),
        "pairs": pairs.summary(),
        "rebuilds": reader.stats()["rebuilds"] - rebuilds,
    }


if __name__ == "__main__":
    _serve()
