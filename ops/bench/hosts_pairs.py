"""The hosts bench's paired view: each measured recall beside a floor measured right next to it (the same
reader, adjacent in time, which of the two first alternating pair by pair), and the reader's own CPU time
for both.

Why: the bench's first figure, p50(recall) / p50(floor), divides two medians each taken over a whole loop.
On a 2-core machine what else runs moves them apart: the Neo4j JVM takes 1-4 ms of CPU in a recall's
window right after a write, other engineers' jobs come and go, and six full 10K runs of one tree within 50
minutes gave 1.09x to 1.81x. A pair's recall and floor are a few milliseconds apart in the same process on
the same reader, so the load of the moment weighs on both, and the median of the pairs' ratios (with its
quartiles) cancels what a sitting adds to both. What lands on the recall alone (the JVM's work right after
the write competing for the two cores) pairing cannot cancel; the CPU view leaves the wall clock out: the
reader's own CPU time per recall over its floor's, which other processes' CPU does not inflate (it still
carries what they cost through shared caches and memory bandwidth). Beside it, the time the reader's threads
sat runnable waiting for a core (the scheduler's run delay, summed over the threads): how much of a wall
figure the machine's other work put there.

Invariants:
- a pair is one recall and one floor of one reader with nothing of the bench between them; the floor
  (query embedding + FAISS search, top 30) embeds the recall's own query text (``Embedder.encode``, never
  cached, so neither warms the other's vector) and searches the copy the reader holds
  (``IndexKeeper.held``: nothing caught up, so a floor before a recall leaves the recall its catch-up);
- the order alternates (``floor_first``), so neither side always runs second on warm caches;
- a reader's CPU and wait in this process are those of the calling thread and of the reader's own pool
  (``ReaderThreads``), read from their per-thread counters once the recall's work left behind (its log
  write) is done: the other hosts' threads here are not counted (``reader_meter``). In the reader's own
  process (``hosts_process``) they are the process's, the reader being all that process runs
  (``process_meter``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import Table, dist, percentile, ratio

__all__ = [
    "Meter", "Pairs", "Timed", "add_paired_rows", "floor_first", "paired_table", "process_meter", "quartiles",
    "reader_meter", "timed_floor", "timed_recall",
]  # fmt: skip

# A counter of seconds that only grows (CPU time, time waiting for a core).
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Timed:
    """One measured call: its wall milliseconds, the CPU milliseconds and the milliseconds waiting for a core
    its meter counted (``Meter``)."""

    ms: float
    cpu_ms: float
    wait_ms: float = float("nan")


def floor_first(turn: int) -> bool:
    """Whether the floor of pair number ``turn`` runs before its recall (every other pair)."""
    return turn % 2 == 0


def quartiles(tops: Sequence[float], bottoms: Sequence[float]) -> dict[str, float]:
    """p25, p50 and p75 of the per-pair ratios ``tops[i] / bottoms[i]`` (pairs with a bottom <= 0 are
    dropped), and n: the pairs kept. NaN quartiles for no pairs."""
    if len(tops) != len(bottoms):
        raise ValueError(f"{len(tops)} tops against {len(bottoms)} bottoms: not pairs")
    each = [top / bottom for top, bottom in zip(tops, bottoms, strict=True) if bottom > 0]
    return {"n": len(each), "p25": percentile(each, 25), "p50": percentile(each, 50), "p75": percentile(each, 75)}


class Pairs:
    """Each reader's pairs (by label): the recall and the floor measured next to it."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Timed, Timed]]] = {}

    def measure(self, label: str, turn: int, recall: Callable[[], Timed], floor: Callable[[], Timed]) -> None:
        """Run ``recall`` and ``floor`` back to back, the floor first on every other ``turn``; keep the pair."""
        if floor_first(turn):
            below = floor()
            above = recall()
        else:
            above = recall()
            below = floor()
        self.rows.setdefault(label, []).append((above, below))

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per label: the median of the pairs' wall ratios with p25 / p75 (``ratio``), the same of their CPU
        ratios (``cpu_ratio``), and the distributions of both sides' wall and CPU milliseconds."""
        out = {}
        for label, rows in self.rows.items():
            recalls, floors = [r for r, _ in rows], [f for _, f in rows]
            out[label] = {
                "ratio": quartiles([r.ms for r in recalls], [f.ms for f in floors]),
                "cpu_ratio": quartiles([r.cpu_ms for r in recalls], [f.cpu_ms for f in floors]),
                "recall_ms": dist([r.ms for r in recalls]),
                "floor_ms": dist([f.ms for f in floors]),
                "recall_cpu_ms": dist([r.cpu_ms for r in recalls]),
                "floor_cpu_ms": dist([f.cpu_ms for f in floors]),
                "recall_wait_ms": dist([r.wait_ms for r in recalls]),
                "floor_wait_ms": dist([f.wait_ms for f in floors]),
            }
        return out


@dataclass(frozen=True, slots=True)
class Meter:
    """What one reader spends beside the wall clock, as counters that only grow: ``cpu()`` its CPU seconds,
    ``waits()`` the seconds its threads sat runnable waiting for a core (the scheduler's ``run_delay``,
    ``/proc/self/task/<tid>/schedstat``; NaN where it is missing), summed over the threads: a recall whose
    calling thread and pool threads wait at once counts each, so its wait can exceed its wall time. For one
    thread (the floor) wall time is about its CPU + its wait + what it waited on otherwise (a store's
    answer, the GIL, a lock)."""

    cpu: Clock
    waits: Clock


def _run_delay_s(tids: Iterable[int]) -> float:
    total = 0
    for tid in tids:
        try:
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[1])
        except FileNotFoundError:  # a thread that ended: its wait is gone with it
            continue
        except (OSError, IndexError, ValueError):
            return float("nan")
    return total / 1e9


def reader_meter(client: Any) -> Meter:
    """The calling thread and ``client``'s reader pool threads (per-thread clocks): what one in-process reader
    spends, the other hosts' threads left out. A pool thread made between two readings starts at 0, so the
    difference counts all of it."""
    threads = client.reader._threads  # the reader's ReaderThreads: its pool, made at first use

    def pool() -> list[Any]:
        held = threads._held
        return [] if held is None else list(held.pool._threads)

    def cpu() -> float:
        return time.thread_time() + sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in pool())

    def waits() -> float:
        return _run_delay_s([threading.get_native_id(), *(t.native_id for t in pool())])

    return Meter(cpu, waits)


def process_meter() -> Meter:
    """This whole process (for the reader in a process of its own, which runs nothing else)."""
    return Meter(time.process_time, lambda: _run_delay_s(int(t.name) for t in Path("/proc/self/task").iterdir()))


def timed_recall(client: Any, user_id: str, query: str, meter: Meter) -> tuple[Timed, Any]:
    """One recall (k=10) by ``client``: its wall time (the call itself), and its CPU and wait for a core on
    ``meter`` until the work it left behind is done (``Reader.flush``: the recall log); and the result. Each
    counter is read outside the others' intervals."""
    wait, cpu = meter.waits(), meter.cpu()
    start = time.perf_counter()
    got = client.recall(user_id, query, k=10)
    ms = (time.perf_counter() - start) * 1e3
    client.reader.flush()
    return Timed(ms, (meter.cpu() - cpu) * 1e3, (meter.waits() - wait) * 1e3), got


def timed_floor(client: Any, user_id: str, query: str, meter: Meter) -> Timed:
    """The floor of ``client``'s reader: ``query`` embedded (no cache) and the user's copy it holds (or, with
    none held, its current one) searched, top 30; measured as ``timed_recall`` measures."""
    reader = client.reader
    index = reader.keeper.held(user_id) or reader.keeper.current(user_id, client.graph.user_stamp(user_id))
    wait, cpu = meter.waits(), meter.cpu()
    start = time.perf_counter()
    index.search(reader.embedder.encode([query])[0], 30)
    ms = (time.perf_counter() - start) * 1e3
    return Timed(ms, (meter.cpu() - cpu) * 1e3, (meter.waits() - wait) * 1e3)


# The in-process and own-process readers whose pairs the table shows (the "rebuild" reader's are in the JSON).
SHOWN = (
    "catch-up", "graph catch-up", "after a signal", "no write since", "own process: catch-up",
    "own process: no write since",
)  # fmt: skip


def paired_table() -> Table:
    return Table(
        "paired: each recall over a floor (query embedding + FAISS search) of the same reader measured next to "
        "it, which first alternating; median of the pairs' ratios [p25, p75] beside the ratio of p50s; CPU: "
        "the reader's own CPU time per recall over its floor's; waited for a core: its threads' run-queue time",
        [
            "facts",
            "reader",
            "pairs",
            "ratio of p50s",
            "paired ratio p50",
            "p25",
            "p75",
            "recall CPU p50 (ms)",
            "floor CPU p50 (ms)",
            "CPU ratio p50",
            "p25",
            "p75",
            "waited for a core p50 (ms, summed over threads): recall",
            "floor",
        ],
    )


def add_paired_rows(table: Table, size: int, got: dict[str, Any]) -> None:
    """The rows of one size: ``got`` is ``bench_hosts``' result (its ``ratio_p50`` the ratio of p50s to the
    loop's floor); the "separate host" rows, when measured, against their own paired floors."""
    rows = [(label, got["paired"][label], got["ratio_p50"][label]) for label in SHOWN]
    separate = got.get("separate_host")
    if separate:
        for label, pairs in separate["pairs"].items():
            rows.append((label, pairs, ratio(pairs["recall_ms"]["p50"], pairs["floor_ms"]["p50"])))
    for label, pairs, of_p50s in rows:
        wall, cpu = pairs["ratio"], pairs["cpu_ratio"]
        table.add(
            size, label, wall["n"], of_p50s, wall["p50"], wall["p25"], wall["p75"], pairs["recall_cpu_ms"]["p50"],
            pairs["floor_cpu_ms"]["p50"], cpu["p50"], cpu["p25"], cpu["p75"], pairs["recall_wait_ms"]["p50"],
            pairs["floor_wait_ms"]["p50"],
        )  # fmt: skip
