"""The hosts bench's reader host in a process of its own, beside the in-process readers of the same run.

Why: the hosts bench runs its five "hosts" as ``MemoryClient``s in ONE process, so the reader it measures
shares its interpreter (the GIL, the garbage collector) with the other four and their reader threads,
while on many hosts every process is its own host. This reader is a child process (this file run as a
script, JSON lines on its stdin and stdout) holding one ``MemoryClient`` with its own data directory, not
listening for stamps (as the in-process "catch-up" reader), and the parent asks it, write after write, the
same questions it asks that reader: a recall right after another host's write, a second recall with no
write since, and the floor (query embedding + FAISS search, top 30) of the same loop. Every time is taken
in the child around the call itself, so the pipe's round trip is in none of them.

    reader = ChildReader.start(env, data_dir)      # the parent: the stack's environment, a data directory
    reader.recall(user_id, query) -> (ms, timings_ms)
    reader.floor(user_id, query) -> ms
    reader.stats() -> {"rebuilds": ..., "from_feed": ...}
    reader.close()
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ChildReader"]


class ChildReader:
    """The parent's handle on the reader process (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

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
        return got["ms"], got["parts"]

    def floor(self, user_id: str, query: str) -> float:
        """The floor's milliseconds: ``query`` embedded (no cache) and the user's index searched (top 30)."""
        return float(self._ask({"op": "floor", "user": user_id, "query": query})["ms"])

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
        start = time.perf_counter()
        got = client.recall(user_id, query, k=10)
        ms = (time.perf_counter() - start) * 1e3
        if got.cached:
            raise RuntimeError(f"recall of {query!r} came from the result cache")
        return {"ms": ms, "parts": got.timings_ms}
    if op == "floor":
        reader = client.reader
        index = reader.keeper.current(user_id, client.graph.user_stamp(user_id))
        start = time.perf_counter()
        index.search(reader.embedder.encode([query])[0], 30)
        return {"ms": (time.perf_counter() - start) * 1e3}
    raise ValueError(f"unknown request {op!r}")


if __name__ == "__main__":
    _serve()
