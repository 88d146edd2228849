"""The hosts bench's apply part: one write through ``UserWrites`` when writes alternate two hosts (each its
own data directory) against all writes on one host, in alternated rounds, with each write's steps timed.

Writes alternate hosts pair by pair: a host whose copy is one write behind (the other host wrote last)
writes ("alternating hosts"), then writes again at once, its copy now current ("one host"); the next pair
is the other host's. So each pair's two writes are adjacent in time and see the same load, and every host
writes as often in both modes. A round is ``pairs`` pairs; the figure is the median over rounds of each
round's p50 ratio, with each round's ratio listed, so one run says something on a loaded machine where a
single loop's p50 moves by tens of per cent from run to run.

Each write is written as the apply stage writes a message of one new fact (``write_one``: the plan reads the
writer's index, the fence is on the published stamp), and its steps are timed by wrapping the methods that
run them: ``index`` (``UserWrite.index``: the plan's copy of the index, caught up when behind), ``graph
write`` (``GraphStore.apply``, the write transaction), ``feed read`` (``UserWrite._feed_entry``: what the
write changed, for the change feed), ``finish other`` (the rest of ``UserWrite.finish``: the index delta,
the published stamp) and ``open`` (the rest: lease, fence, release).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

from benchlib import dist, ratio
from snapshot_refresh import write_one

__all__ = ["STEPS", "apply_rounds", "timed_feed_reads"]

STEPS = ("open", "index", "graph write", "feed read", "finish other")


@contextlib.contextmanager
def _timed_steps(graph_type: type, into: dict[str, float]) -> Iterator[None]:
    """Adds each wrapped method's milliseconds to ``into`` (under its step's name) while open."""
    from engram_api.storage.writer.userwrite import UserWrite

    wrapped = {"index": (UserWrite, "index"), "graph write": (graph_type, "apply")}
    wrapped |= {"feed read": (UserWrite, "_feed_entry"), "finish": (UserWrite, "finish")}
    originals = {step: getattr(owner, name) for step, (owner, name) in wrapped.items()}

    def timing(step: str, real: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                into[step] = into.get(step, 0.0) + (time.perf_counter() - start) * 1e3

        return timed

    for step, (owner, name) in wrapped.items():
        setattr(owner, name, timing(step, originals[step]))
    try:
        yield
    finally:
        for step, (owner, name) in wrapped.items():
            setattr(owner, name, originals[step])


def timed_feed_reads(into: list[float]) -> Any:
    """Time each write's read for its change-feed entry (``UserWrite._feed_entry``, inside the apply's
    time); returns the undo."""
    from engram_api.storage.writer.userwrite import UserWrite

    real = UserWrite._feed_entry

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(self, *args, **kwargs)
        finally:
            into.append((time.perf_counter() - start) * 1e3)

    UserWrite._feed_entry = timed  # type: ignore[method-assign]
    return lambda: setattr(UserWrite, "_feed_entry", real)


def _steps(total: float, timed: dict[str, float]) -> dict[str, float]:
    finish = timed.get("finish", 0.0)
    feed = timed.get("feed read", 0.0)
    parts = {"index": timed.get("index", 0.0), "graph write": timed.get("graph write", 0.0), "feed read": feed}
    parts["finish other"] = finish - feed
    parts["open"] = total - parts["index"] - parts["graph write"] - finish
    return {step: parts[step] for step in STEPS}


def apply_rounds(a: Any, b: Any, user_id: str, *, rounds: int, pairs: int, first_n: int) -> dict[str, Any]:
    """``rounds`` rounds of ``pairs`` pairs (a write by the host behind, then again by it) of ``user_id`` by
    the clients ``a`` and ``b`` (see the module docstring); fact numbers from ``first_n`` on."""
    n = first_n
    timed: dict[str, float] = {}
    ms: dict[str, list[float]] = {"alternating hosts": [], "one host": []}
    steps: dict[str, list[dict[str, float]]] = {"alternating hosts": [], "one host": []}
    round_ratios: list[float] = []
    this_round: dict[str, list[float]] = {}

    def write(client: Any, mode: str | None) -> None:
        nonlocal n
        timed.clear()
        total = write_one(client, user_id, n, read_index=True, published=True)
        n += 1
        if mode is not None:
            this_round[mode].append(total)
            steps[mode].append(_steps(total, timed))

    with _timed_steps(type(a.graph), timed):
        write(a, None)  # a wrote last: b's copy is one write behind
        for _ in range(rounds):
            this_round = {"alternating hosts": [], "one host": []}
            for i in range(pairs):
                host = (b, a)[i % 2]  # the host that did not write last
                write(host, "alternating hosts")
                write(host, "one host")
            if pairs % 2:
                write(a, None)  # b wrote last: a's next round starts with b behind again
            for mode, values in this_round.items():
                ms[mode].extend(values)
            round_ratios.append(
                ratio(statistics.median(this_round["alternating hosts"]), statistics.median(this_round["one host"]))
            )
    return {
        "rounds": rounds,
        "pairs": pairs,
        "ratio_median_of_rounds": statistics.median(round_ratios),
        "round_ratios": round_ratios,
        "ms": {mode: dist(values) for mode, values in ms.items()},
        "steps_p50_ms": {
            mode: {step: statistics.median(row[step] for row in rows) for step in STEPS} for mode, rows in steps.items()
        },
    }
