"""The hosts bench's removal part: recall on a reader host right after ANOTHER host removed records (a forget
of one fact, a forget of one message), as a ratio to the floor measured in the same loop; what a catch-up of
a removal reads; and the whole reads after each host's first load, which must stay 0. Each answer is also
paired with a floor of its reader measured right next to it, with both sides' CPU (``hosts_pairs``: why).

Round after round (the apply hosts alternating): one host writes one message (one new fact, ids known) and
the readers catch it up unmeasured; then the OTHER host forgets one bulk-loaded fact (``Reader.forget`` of
a fact id: the fact, its vector, the supersession chain it was in repaired), and each reader answers a fresh
query at once; then the first host forgets the message it wrote (``Reader.forget`` of a message id: its
episode, chunks, the fact only it stated and their vectors), and each reader answers again. Readers:

- "catch-up": the reader code as it is (its copies caught up from the writers' change feed in Redis: the
  removal's entry lists the removed ids, ``engram_api.storage.faiss.feed``);
- "graph catch-up": the same code with the feed refused, so the removal's ids are read from the graph
  (``GraphStore.user_changes``: the removal records);
- "after a signal": the listening reader, answering ``SIGNAL_PAUSE_S`` after the removal.

Each pair also counts the thread CPU the reader's threads spent folding its held snapshot in the pair's window
(``UserSnapshot.merged``, timed by a wrapper: the fold a removal's catch-up starts, which ``Reader.flush`` in
``timed_recall`` waits for, so it lands in the recall's CPU wherever it runs): the removal table shows the CPU
ratio with it and without it, and the fold's CPU, so a change of when the fold runs is told from one of what the
recall costs.

After each removal the "catch-up" reader's FAISS copy and held snapshot are checked to hold none of the
removed ids, and no reader's answer any of them (the bench stops if one does). Bytes: the removal's change-feed entry (Redis, what the reader
reads) and one ``user_changes`` one write behind the removal (what the graph sends a reader without the
feed), counted as ``bench_hosts`` counts a catch-up. Whole reads: full reads of the user's vectors
(``IndexKeeper.rebuilds``) on every host and whole snapshot loads (``GraphStore.snapshot``) on every reader,
counted over the removal rounds only (each host has loaded the user already).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import Table, dist, ratio
from corpus import queries
from hosts_pairs import Pairs, Timed, quartiles, reader_meter, timed_floor, timed_recall
from snapshot_refresh import write_one

__all__ = ["REMOVALS", "Received", "add_rows", "removal_rounds", "removal_table"]

REMOVALS = ("fact forget", "message forget")
READERS = ("catch-up", "graph catch-up", "after a signal")


class Received:
    """Bytes the Neo4j driver's Bolt sockets received since ``install``, and this process's file reads."""

    def __init__(self) -> None:
        self.socket = 0

    def install(self) -> Received:
        from neo4j._async_compat.network._bolt_socket import BoltSocketBase

        original = BoltSocketBase.recv_into
        received = self

        def counting(sock: Any, buffer: Any, nbytes: int) -> int:
            n = original(sock, buffer, nbytes)
            received.socket += n
            return n

        BoltSocketBase.recv_into = counting  # type: ignore[method-assign]
        return self

    def total(self) -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return self.socket + int(line.split()[1])
        raise RuntimeError("no rchar in /proc/self/io")

    def of(self, call: Any) -> int:
        """Bytes read while ``call()`` ran (less what reading /proc itself costs)."""
        mark = self.total()
        idle = self.total() - mark  # one read of /proc/self/io, itself counted in rchar
        mark += idle
        call()
        return self.total() - mark - idle


def _counting_snapshots(clients: dict[str, Any]) -> tuple[dict[str, int], Callable[[], None]]:
    """Count each reader's whole snapshot loads (``GraphStore.snapshot``) from now on; returns the counts
    and the undo."""
    counts = dict.fromkeys(clients, 0)
    graphs = {name: client.reader.graph for name, client in clients.items()}
    for name, graph in graphs.items():
        real = graph.snapshot

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kwargs)

        graph.snapshot = counted  # an instance attribute over the method: ``undo`` deletes it

    def undo() -> None:
        for graph in graphs.values():
            del graph.snapshot

    return counts, undo


def _counting_folds() -> tuple[dict[int, float], Callable[[], None]]:
    """The thread CPU seconds spent in ``UserSnapshot.merged`` (a fold) from now on, by thread ident; returns
    the counts and the undo."""
    from engram_api.storage.snapshot.graph import UserSnapshot

    spent: dict[int, float] = {}
    real = UserSnapshot.merged

    def counted(snapshot: Any) -> Any:
        start = time.thread_time()
        try:
            return real(snapshot)
        finally:
            ident = threading.get_ident()
            spent[ident] = spent.get(ident, 0.0) + time.thread_time() - start

    UserSnapshot.merged = counted  # type: ignore[method-assign]

    def undo() -> None:
        UserSnapshot.merged = real  # type: ignore[method-assign]

    return spent, undo


def _folds_cpu_s(client: Any, spent: dict[int, float]) -> float:
    """The fold CPU seconds ``spent`` on ``client``'s reader threads (its pool, and the calling thread)."""
    held = client.reader._threads._held
    idents = {threading.get_ident(), *(() if held is None else (t.ident for t in held.pool._threads))}
    return sum(spent.get(i, 0.0) for i in idents)


def _without_folds(rows: list[tuple[Timed, Timed]], folds_ms: list[float]) -> dict[str, Any]:
    """The pairs' CPU ratios with each pair's fold CPU taken out of its recall's (``rows`` and ``folds_ms`` in
    the same order), and the folds' CPU."""
    return {
        "cpu_ratio": quartiles(
            [r.cpu_ms - f for (r, _), f in zip(rows, folds_ms, strict=True)], [b.cpu_ms for _, b in rows]
        ),
        "fold_cpu_ms": dist(folds_ms),
    }


def _holds_none(client: Any, user_id: str, gone: set[str]) -> bool:
    """True when the reader's FAISS copy and held snapshot of the user hold none of ``gone``."""
    index = client.reader.keeper.held(user_id)
    snapshot = client.reader.snapshots.peek(user_id)
    in_index = index is not None and not gone.isdisjoint(index.node_ids())
    in_snapshot = snapshot is not None and not (
        gone.isdisjoint(snapshot.facts.rows()) and gone.isdisjoint(snapshot.chunks.rows())
    )
    return not in_index and not in_snapshot


def removal_rounds(
    hosts: dict[str, Any], user_id: str, *, rounds: int, received: Any, pause_s: float
) -> dict[str, Any]:
    """The removal rounds over ``hosts`` (``bench_hosts._hosts``; the user loaded on each), ``received``
    counting the graph's bytes (``Received``); see the module docstring."""
    from engram_api import keys
    from engram_api.reader.signals import StampSignals

    a, b = hosts["apply-a"], hosts["apply-b"]
    readers = {"catch-up": hosts["reader"], "graph catch-up": hosts["reader-graph"], "after a signal": hosts["reader-signalled"]}  # fmt: skip
    signalled = readers["after a signal"]
    listener = StampSignals(signalled.redis, signalled.reader.catchups.signalled_stamp).start()
    listener.subscribed.wait(5.0)
    loads = {name: client.reader.keeper.rebuilds for name, client in hosts.items()}
    snapshot_loads, undo = _counting_snapshots(readers)
    fold_spent, undo_folds = _counting_folds()
    folds_ms: dict[str, list[float]] = {}
    doomed = [f.id for f in a.graph.page(user_id, 1, rounds).facts]  # bulk-loaded facts, one a round
    qs = queries(f"hosts-removals-{user_id}", 11 * rounds)  # a round: 3 settle, 6 measured, 2 floors
    recall: dict[tuple[str, str], list[float]] = {(r, n): [] for r in REMOVALS for n in READERS}
    index_ms: dict[str, list[float]] = {r: [] for r in REMOVALS}
    feed_bytes: dict[str, list[int]] = {r: [] for r in REMOVALS}
    graph_bytes: dict[str, list[int]] = {r: [] for r in REMOVALS}
    floor: list[float] = []
    pairs = Pairs()
    meters = {name: reader_meter(client) for name, client in readers.items()}
    q = iter(qs)
    reader = readers["catch-up"]

    def paired(label: str, name: str, turn: int, gone: set[str]) -> None:
        """``name``'s answer to a fresh query right after the removal ``label``, paired with its floor of the
        same text (``hosts_pairs``); no removed id may be in it."""
        query, client = next(q), readers[name]

        def answer() -> Timed:
            timed, got = timed_recall(client, user_id, query, meters[name])
            recall[(label, name)].append(timed.ms)
            assert not got.cached and gone.isdisjoint(item.id for item in got.items)
            if name == "catch-up":
                index_ms[label].append(got.timings_ms["index"])
            return timed

        folded = _folds_cpu_s(client, fold_spent)
        pairs.measure(f"{label} / {name}", turn, answer, lambda: timed_floor(client, user_id, query, meters[name]))
        folds_ms.setdefault(f"{label} / {name}", []).append((_folds_cpu_s(client, fold_spent) - folded) * 1e3)

    for i in range(rounds):
        writer, other = (a, b)[i % 2], (b, a)[i % 2]
        tag = f"removal-{user_id}-{i}-{time.time_ns()}"
        write_one(writer, user_id, 10_000 + i, read_index=True, tag=tag)
        for client in readers.values():  # unmeasured: every reader at the write, one removal behind next
            client.recall(user_id, f"settle {next(q)}", k=10)
            client.reader.flush()
        removals = {"fact forget": (other, doomed[i]), "message forget": (writer, f"probe-ep-{tag}")}
        for label, (host, memory_id) in removals.items():
            since = a.graph.user_stamp(user_id).version
            result = host.reader.forget(user_id, memory_id)
            gone = {*result.removed_fact_ids, *result.removed_chunk_ids, *result.removed_entity_ids}
            removed = time.perf_counter()
            order = [name for name in READERS if name != "after a signal"]
            order = order[i % 2 :] + order[: i % 2]
            for name in order:
                paired(label, name, i, gone)
            time.sleep(max(0.0, pause_s - (time.perf_counter() - removed)))
            paired(label, "after a signal", i, gone)
            assert _holds_none(reader, user_id, gone), f"{label}: a removed record still held"
            raw = a.redis.zrangebyscore(keys.change_feed(user_id), f"({since}", "+inf")
            feed_bytes[label].append(sum(map(len, raw)))
            graph_bytes[label].append(received.of(lambda since=since: a.graph.user_changes(user_id, since)))
            floor.append(timed_floor(reader, user_id, next(q), meters["catch-up"]).ms)
    listener.stop()
    undo()
    undo_folds()
    floor_d = dist(floor)
    whole = {
        name: client.reader.keeper.rebuilds - loads[name] for name, client in hosts.items() if name != "reader-rebuild"
    }
    return {
        "rounds": rounds,
        "recall_ms": {f"{r} / {n}": dist(v) for (r, n), v in recall.items()},
        "ratio_p50": {f"{r} / {n}": ratio(dist(v)["p50"], floor_d["p50"]) for (r, n), v in recall.items()},
        "floor_ms": floor_d,
        "index_ms": {r: dist(v) for r, v in index_ms.items()},
        "feed_entry_bytes_p50": {r: statistics.median(v) for r, v in feed_bytes.items()},
        "graph_catchup_bytes_p50": {r: statistics.median(v) for r, v in graph_bytes.items()},
        "vector_rebuilds_after_first_load": whole,
        "snapshot_whole_loads": snapshot_loads,
        "paired": pairs.summary(),
        "without_folds": {label: _without_folds(pairs.rows[label], ms) for label, ms in folds_ms.items()},
    }


def removal_table() -> Table:
    return Table(
        "recall on a reader host right after another host's removal (ms); floor = query embedding + FAISS search",
        [
            "facts",
            "removal",
            "catch-up p50",
            "catch-up p95",
            "index step p50",
            "graph catch-up p50",
            "after a signal p50",
            "floor p50",
            "catch-up / floor",
            "graph catch-up / floor",
            "after a signal / floor",
            "feed entry (B)",
            "graph catch-up (B)",
            "whole reads after first load (vectors, snapshots)",
            "catch-up: paired ratio p50",
            "p25",
            "p75",
            "CPU ratio p50",
            "CPU ratio without the fold p50",
            "fold CPU p50 (ms)",
        ],
    )


def add_rows(table: Table, size: int, got: dict[str, Any]) -> None:
    """One row a removal kind of ``removal_rounds``' result ``got``."""
    r, x = got["recall_ms"], got["ratio_p50"]
    whole = (sum(got["vector_rebuilds_after_first_load"].values()), sum(got["snapshot_whole_loads"].values()))
    for label in REMOVALS:
        paired, apart = got["paired"][f"{label} / catch-up"], got["without_folds"][f"{label} / catch-up"]
        table.add(
            size, label, r[f"{label} / catch-up"]["p50"], r[f"{label} / catch-up"]["p95"],
            got["index_ms"][label]["p50"], r[f"{label} / graph catch-up"]["p50"],
            r[f"{label} / after a signal"]["p50"], got["floor_ms"]["p50"], x[f"{label} / catch-up"],
            x[f"{label} / graph catch-up"], x[f"{label} / after a signal"], got["feed_entry_bytes_p50"][label],
            got["graph_catchup_bytes_p50"][label], whole, paired["ratio"]["p50"], paired["ratio"]["p25"],
            paired["ratio"]["p75"], paired["cpu_ratio"]["p50"], apart["cpu_ratio"]["p50"], apart["fold_cpu_ms"]["p50"],
        )  # fmt: skip
