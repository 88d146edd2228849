"""Many hosts: recall on a reader host right after another host wrote, apply with writes alternating hosts,
and what a catch-up reads from the graph; no shared index files.

Topology (one Redis, one graph store): two apply "hosts" and two reader "hosts", each a ``MemoryClient``
with its OWN data directory (its own ``IndexKeeper`` and FAISS files), in this process. One user is
bulk-loaded (2K facts quick; 10K and 100K full). Then, write after write (alternating between the two
apply hosts, one new fact each through ``UserWrites``, as the apply stage writes), each reader host answers
a fresh query right after the write:

- "catch-up": this code (the reader's copies read only what changed since their version: from the
  writers' change feed in Redis, ``engram_api.storage.faiss.feed``);
- "graph catch-up": the same reader code with the change feed refused, so the copies read what changed
  from the graph (``GraphStore.user_changes``): what this code did before the feed;
- "rebuild": the same reader code with the catch-up refused, so a copy behind the graph is read whole
  again: what a host without the writer's files did before (``IndexKeeper.apply`` answering None); it
  answers the first ``rebuild_writes(size)`` writes only (a whole read of a 100K-fact user takes minutes);
- "after a signal": a third reader host that listens for writers' stamps (``engram_api.reader.signals``)
  answers ``SIGNAL_PAUSE_S`` after the write (a chat user's next turn comes seconds later), so its copies
  were caught up in the background. The first two do not listen: their figure is the recall's own
  catch-up (one read, started before the query is embedded);
- "own process": the "catch-up" reader's code in a process of its own (``hosts_process``: one host, one
  process, as on many hosts), asked the same questions right after the in-process reader, each time and
  its floor taken in that process: what sharing one interpreter with four other hosts adds to the
  in-process figures.

All as a ratio to the floor measured in the same loop (the readers answer each write in an order that
alternates write by write) (query embedding + FAISS search of the user, top
30): p50(recall) / p50(floor), the bench's first figure. On this 2-core machine that figure measures the
sitting as much as the reader: the Neo4j JVM's CPU right after a write and other users' jobs land on the
recall and not on floors taken elsewhere in the loop (one tree gave 1.09x to 1.81x in six full 10K runs
within 50 minutes), where a reader host in a deployment shares its cores with neither. So beside it:

- paired (``hosts_pairs``): every measured recall paired with a floor of the same reader measured right
  next to it (the same query text; the floor first every other write), reported as the median of the
  pairs' ratios with p25 / p75: what the moment's load adds to both sides cancels in each pair;
- CPU: each side's CPU time, the reader's own (in this process: the calling thread and the reader's
  pool threads; in its own process: that process), as a median of the pairs' CPU ratios: a figure other
  processes' CPU cannot inflate;
- "separate host" (``HOSTS_BENCH_SEPARATE_HOST=1``, off by default, its own rows after the others): once
  the loop is done, the reader process pinned alone on one core and this process, Neo4j and Redis on the
  other, one write a question, paired as above (``hosts_process.separate_core``: what that does and does
  not emulate).

Apply: the ``UserWrites.run`` time of one write when consecutive writes alternate hosts (each write
finds its host's copy one write behind and catches up) against writes all on one host (a delta append),
interleaved (every write also reads what it changed for the feed). Bytes: what the graph sent for one
``GraphStore.vector_changes`` one write behind, against one ``stamped_vectors`` (a whole read): the bytes
the Neo4j driver's Bolt sockets received, plus ``/proc/self/io`` ``rchar`` (file reads: SQLite's pages);
and the size of one write's change-feed entry (what a reader reads from Redis instead).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchlib import BenchContext, BenchResult, Table, dist, ratio
from bulk import bulk_load
from corpus import queries
from hosts_apply import STEPS, apply_rounds, timed_feed_reads
from hosts_pairs import Pairs, Timed, add_paired_rows, paired_table, reader_meter, timed_floor, timed_recall
from hosts_process import ChildReader, separate_host
from hosts_removals import Received, add_rows, removal_rounds, removal_table
from snapshot_refresh import write_one

__all__ = ["run"]


def _write(client: Any, user_id: str, n: int) -> float:
    """One fact through ``client``'s UserWrites, the plan reading the writer's copy; the write's ms."""
    return write_one(client, user_id, n, read_index=True)


# The users' sizes of a full run (facts); ``HOSTS_BENCH_SIZES=100000`` runs some of them only.
FULL_SIZES = (10_000, 100_000)

# How long after a write the listening reader answers (its background catch-up has run by then).
SIGNAL_PAUSE_S = 0.1

# The "rebuild" reader answers only the first writes: each answer is a whole read of the user (minutes at
# 100K facts on a loaded machine): all of a quick run's writes, 12 at 10K facts, 3 at 100K.
REBUILD_READ_FACTS = 300_000


# The in-process readers' labels and the host that answers each.
LABEL_HOST = {
    "catch-up": "reader", "graph catch-up": "reader-graph", "rebuild": "reader-rebuild",
    "after a signal": "reader-signalled", "no write since": "reader",
}  # fmt: skip


def rebuild_writes(size: int) -> int:
    """How many of the writes the "rebuild" reader answers for a user of ``size`` facts."""
    return max(3, min(12, REBUILD_READ_FACTS // size))


def _hosts(ctx: BenchContext, stack: Any, size: int) -> dict[str, Any]:
    from engram_api import MemoryClient

    out = {}
    for name in ("apply-a", "apply-b", "reader", "reader-graph", "reader-rebuild", "reader-signalled"):
        settings = stack.settings.model_copy(update={"data_dir": ctx.workdir / f"hosts-{size}" / name})
        out[name] = MemoryClient(settings=settings, redis_url=stack.env["REDIS_URL"])
    # Apply hosts stand for workers (which do not listen); the first two readers answer right after the
    # write with no help. Made now: a client's reader starts the listener, stopped at once.
    for name in ("apply-a", "apply-b", "reader", "reader-graph", "reader-rebuild"):
        out[name].reader  # noqa: B018
        out[name].signals.stop()
    # The "before the feed" reader: its catch-ups never read the change feed, only the graph.
    out["reader-graph"].reader.catchups.redis = None
    # The "before" reader: a copy behind the graph is never caught up, only read whole again.
    out["reader-rebuild"].reader.keeper.apply = lambda user_id, index, changes: None
    return out


def _measure(ctx: BenchContext, stack: Any, size: int, writes: int) -> dict[str, Any]:
    from engram_api import keys

    hosts = _hosts(ctx, stack, size)
    a, b, reader, graph_reader, before, signalled = (
        hosts[n] for n in ("apply-a", "apply-b", "reader", "reader-graph", "reader-rebuild", "reader-signalled")
    )
    uid = ctx.uid(f"hosts-{size}")
    ctx.log(f"hosts: bulk-loading {size:,} facts (apply host a's copy)")
    started = time.perf_counter()
    bulk_load(a.graph, a.reader.keeper, a.reader.embedder, a.redis, uid, size, seed=str(size), out=ctx.out)
    load_s = time.perf_counter() - started
    ctx.log(f"hosts: loaded in {load_s:.0f} s; every other host's first read of the user")
    qs = queries(f"hosts-{size}", 4 * writes + 4)
    started = time.perf_counter()
    own = ChildReader.start(stack.env, ctx.workdir / f"hosts-{size}" / "reader-process")
    _write(b, uid, -1)  # every other host's first load of the user: a rebuild each
    for n, client in enumerate((reader, graph_reader, before, signalled)):
        client.recall(uid, f"warm-up {qs[n % 4]}", k=10)
    for n in range(2):  # as the in-process reader: a rebuild, then (at its second recall) its snapshot
        own.recall(uid, f"warm-up {n} {qs[0]}")
    # The listening reader recalls once a write: a second recall now loads its snapshot (the others load
    # theirs at their first "no write since" recall), which its signals then keep current.
    signalled.recall(uid, f"warm-up again {qs[2]}", k=10)
    signalled.reader.flush()
    first_reads_s = time.perf_counter() - started
    ctx.log(f"hosts: first reads in {first_reads_s:.0f} s; {writes} writes")
    loads = {name: hosts[name].reader.keeper.rebuilds for name in hosts}
    own_loads = own.stats()["rebuilds"]
    recall: dict[str, list[float]] = {
        "catch-up": [], "graph catch-up": [], "rebuild": [], "no write since": [], "after a signal": [],
        "own process: catch-up": [], "own process: no write since": [],
    }  # fmt: skip
    index_ms: dict[str, list[float]] = {"catch-up": [], "graph catch-up": [], "rebuild": []}
    parts: dict[str, list[dict[str, float]]] = {"catch-up": [], "no write since": []}
    floor_ms: list[float] = []
    own_floor_ms: list[float] = []
    apply: dict[str, list[float]] = {"alternating hosts": [], "one host": []}
    feed_reads: list[float] = []
    undo = timed_feed_reads(feed_reads)
    pairs = Pairs()
    meters = {name: reader_meter(client) for name, client in hosts.items()}

    def in_process(label: str, client: Any, query: str) -> Timed:
        timed, got = timed_recall(client, uid, query, meters[LABEL_HOST[label]])
        recall[label].append(timed.ms)
        if label in index_ms:
            index_ms[label].append(got.timings_ms["index"])
        parts.setdefault(label, []).append(got.timings_ms)
        assert not got.cached
        return timed

    def own_process(label: str, query: str) -> Timed:
        ms, got_parts = own.recall(uid, query)  # its time and parts as taken in that process
        recall[label].append(ms)
        parts.setdefault(label, []).append(got_parts)
        return Timed(ms, own.last_cpu_ms, own.last_wait_ms)

    def paired(label: str, turn: int, query: str) -> None:
        """``label``'s recall of ``query`` and its floor (the same text), in the order of ``turn``."""
        if label.startswith("own process"):
            pairs.measure(label, turn, lambda: own_process(label, query), lambda: own.timed_floor(uid, query))
            return
        client = hosts[LABEL_HOST[label]]
        pairs.measure(
            label, turn, lambda: in_process(label, client, query),
            lambda: timed_floor(client, uid, query, meters[LABEL_HOST[label]]),
        )  # fmt: skip

    for i in range(writes):
        # One host: its second write in a row finds its copy current (a delta append). Alternating: the other
        # host writes next, its copy one write behind (a catch-up, then the append).
        host, other = (a, b)[i % 2], (b, a)[i % 2]
        _write(host, uid, 3 * i)
        apply["one host"].append(_write(host, uid, 3 * i + 1))
        apply["alternating hosts"].append(_write(other, uid, 3 * i + 2))
        written = time.perf_counter()
        order = ["catch-up", "graph catch-up", "rebuild"]
        order = order[i % 3 :] + order[: i % 3]  # each reader first, second and third in turn
        if i >= rebuild_writes(size):
            order.remove("rebuild")
        slot = i % (len(order) + 1)  # the reader in its own process first, second, ... and last in turn
        queries_of = {label: qs[4 + 3 * i + n] for n, label in enumerate(order)}
        queries_of["own process: catch-up"] = f"own {qs[4 + 3 * i]}"
        # Each reader's recall right after the write paired with its floor, which first alternating write by write.
        for label in [*order[:slot], "own process: catch-up", *order[slot:]]:
            paired(label, i, queries_of[label])
        time.sleep(max(0.0, SIGNAL_PAUSE_S - (time.perf_counter() - written)))
        paired("after a signal", i, qs[4 + 3 * writes + i])
        # The same reader again, nothing written since (its steady state); in its own process too, each
        # first in turn, and so the two floors.
        for turn in ((i + n) % 2 for n in range(2)):
            if turn:
                paired("own process: no write since", i, f"own again {qs[4 + 3 * i]}")
            else:
                paired("no write since", i, f"again {qs[4 + 3 * i]}")
        # The graph reader recalls again too, unmeasured: its snapshot loads and is kept as the feed reader's.
        graph_reader.recall(uid, f"again {qs[4 + 3 * i + 1]}", k=10)
        # The floors of the ratio of p50s (the bench's first figure), at the end of the loop as before.
        for turn in ((i + n) % 2 for n in range(2)):
            if turn:
                own_floor_ms.append(own.floor(uid, f"own {qs[4 + 3 * i]}"))
            else:
                floor_ms.append(timed_floor(reader, uid, qs[4 + 3 * i], meters["reader"]).ms)
    undo()
    own_stats = own.stats()
    signalled.signals.stop()  # its catch-ups' reads would count in the bytes below
    separate = None
    if os.environ.get("HOSTS_BENCH_SEPARATE_HOST") == "1":
        ctx.log("hosts: the reader process alone on a core (HOSTS_BENCH_SEPARATE_HOST)")
        pinned_qs = queries(f"hosts-{size}-separate", writes)
        separate = separate_host(own, (a, b), uid, pinned_qs, list(ctx.services.server_pids().values()))
    own.close()
    ctx.log("hosts: apply rounds")
    rounds = apply_rounds(a, b, uid, rounds=ctx.size(7, 9), pairs=8, first_n=10 * writes)
    received, catchup_bytes, both_bytes, feed_bytes = Received().install(), [], [], []
    for i in range(3):
        since = a.graph.user_stamp(uid).version
        _write(b, uid, 3 * writes + i)
        feed_bytes.append(sum(map(len, a.redis.zrangebyscore(keys.change_feed(uid), f"({since}", "+inf"))))
        catchup_bytes.append(received.of(lambda since=since: a.graph.vector_changes(uid, since)))
        both_bytes.append(received.of(lambda since=since: a.graph.user_changes(uid, since)))
    whole_bytes = received.of(lambda: a.graph.stamped_vectors(uid))
    extra = {
        name: hosts[name].reader.keeper.rebuilds - loads[name]
        for name in ("apply-a", "apply-b", "reader", "reader-graph", "reader-signalled")
    }
    ctx.log("hosts: removal rounds")
    removals = removal_rounds(hosts, uid, rounds=ctx.size(8, 16), received=received, pause_s=SIGNAL_PAUSE_S)
    signalled_catchups = signalled.reader.catchups.signalled
    from_feed = reader.reader.catchups.from_feed
    keeper = reader.reader.keeper
    for client in hosts.values():
        client.close()
    floor_d, own_floor_d = dist(floor_ms), dist(own_floor_ms)
    return {
        "facts": size,
        "writes": writes,
        "bulk_load_s": load_s,
        "first_reads_s": first_reads_s,
        "recall_ms": {k: dist(v) for k, v in recall.items()},
        "floor_ms": floor_d,
        "ratio_p50": {
            k: ratio(dist(v)["p50"], (own_floor_d if k.startswith("own process") else floor_d)["p50"])
            for k, v in recall.items()
        },
        "own_process_floor_ms": own_floor_d,
        "index_ms": {k: dist(v) for k, v in index_ms.items()},
        "parts_p50_ms": {
            # every part any recall had (a snapshot's refresh is not in the first recall's)
            label: {
                part: statistics.median(t.get(part, 0.0) for t in rows)
                for part in dict.fromkeys(p for t in rows for p in t)
            }
            for label, rows in parts.items()
            if label != "rebuild"
        },
        # A recall's time outside its parts (its parts end where its result is built): on a loaded machine,
        # mostly waits for the GIL or a core that the parts' own clocks do not see.
        "unattributed_p50_ms": {
            label: statistics.median(
                ms - sum(v for part, v in t.items() if part != "catchup")  # "index" includes the catch-up's wait
                for ms, t in zip(recall[label], rows, strict=True)
            )
            for label, rows in parts.items()
        },
        "apply_ms": {k: dist(v) for k, v in apply.items()},
        "apply_ratio_p50": ratio(dist(apply["alternating hosts"])["p50"], dist(apply["one host"])["p50"]),
        "feed_read_ms": dist(feed_reads),
        "apply_rounds": rounds,
        "catchup_bytes_p50": statistics.median(catchup_bytes),
        "user_changes_bytes_p50": statistics.median(both_bytes),
        "feed_entry_bytes_p50": statistics.median(feed_bytes),
        "whole_read_bytes": whole_bytes,
        "rebuilds_after_first_load": {**extra, "reader-process": own_stats["rebuilds"] - own_loads},
        "own_process_catchups_from_feed": own_stats["from_feed"],
        "paired": pairs.summary(),
        "separate_host": separate,
        "reader_catchups": keeper.catchups,
        "signalled_catchups": signalled_catchups,
        "catchups_from_feed": from_feed,
        "removals": removals,
    }


def run(ctx: BenchContext) -> BenchResult:
    chosen = os.environ.get("HOSTS_BENCH_SIZES", "")
    sizes = [2_000] if ctx.quick else [int(n) for n in chosen.split(",") if n] or list(FULL_SIZES)
    writes = ctx.size(12, 40)
    recall = Table(
        "recall on a reader host right after another host's write (ms); floor = query embedding + FAISS search",
        [
            "facts",
            "catch-up p50",
            "catch-up p95",
            "index step p50",
            "graph catch-up p50",
            "rebuild p50",
            "index step p50",
            "no write since p50",
            "after a signal p50",
            "floor p50",
            "catch-up / floor",
            "graph catch-up / floor",
            "rebuild / floor",
            "no write / floor",
            "after a signal / floor",
        ],
    )
    own = Table(
        "the same reader code in a process of its own (one host, one process) beside the in-process reader, "
        "same loop: ratio to each process's own floor",
        [
            "facts",
            "in process: catch-up / floor",
            "no write / floor",
            "floor p50",
            "own process: catch-up p50",
            "no write p50",
            "floor p50",
            "catch-up / floor",
            "no write / floor",
            "catch-ups from the feed",
        ],
    )
    apply = Table(
        "apply (one write through UserWrites, ms): writes alternating two hosts vs all on one host; in the "
        "recall loop, then alternated rounds (ratio: median of the rounds' p50 ratios)",
        [
            "facts",
            "loop: alternating p50",
            "one host p50",
            "ratio p50",
            "of which the feed entry's read p50",
            "rounds x writes",
            "rounds: alternating p50",
            "one host p50",
            "ratio (median of rounds)",
            "each round's ratio",
        ],
    )
    steps = Table(
        "apply rounds: each step's p50 (ms) by mode (open = lease, fence, release)",
        ["facts", "mode", *STEPS],
    )
    reads = Table(
        "read from the graph (bytes this process read: /proc/self/io rchar)",
        [
            "facts",
            "one catch-up (one write behind)",
            "index + snapshot catch-up",
            "change-feed entry (Redis)",
            "one whole read",
            "rebuilds after first load (a, b, reader, graph reader, signalled, reader process)",
        ],
    )
    removal = removal_table()
    paired = paired_table()
    summary: dict[str, Any] = {"load_avg_1min": os.getloadavg()[0], "store": ctx.store, "sizes": []}
    with ctx.stack("hosts", llm=False) as stack:
        for size in sizes:
            got = _measure(ctx, stack, size, writes)
            summary["sizes"].append(got)
            r, f = got["recall_ms"], got["floor_ms"]
            ix = got["index_ms"]
            recall.add(
                size, r["catch-up"]["p50"], r["catch-up"]["p95"], ix["catch-up"]["p50"], r["graph catch-up"]["p50"],
                r["rebuild"]["p50"], ix["rebuild"]["p50"], r["no write since"]["p50"], r["after a signal"]["p50"],
                f["p50"], got["ratio_p50"]["catch-up"], got["ratio_p50"]["graph catch-up"], got["ratio_p50"]["rebuild"],
                got["ratio_p50"]["no write since"], got["ratio_p50"]["after a signal"],
            )  # fmt: skip
            rp, of = got["ratio_p50"], got["own_process_floor_ms"]
            own.add(
                size, rp["catch-up"], rp["no write since"], f["p50"], r["own process: catch-up"]["p50"],
                r["own process: no write since"]["p50"], of["p50"], rp["own process: catch-up"],
                rp["own process: no write since"], got["own_process_catchups_from_feed"],
            )  # fmt: skip
            ap = got["apply_ms"]
            ar = got["apply_rounds"]
            apply.add(
                size, ap["alternating hosts"]["p50"], ap["one host"]["p50"], got["apply_ratio_p50"],
                got["feed_read_ms"]["p50"], f"{ar['rounds']} x {2 * ar['pairs']}",
                ar["ms"]["alternating hosts"]["p50"], ar["ms"]["one host"]["p50"], ar["ratio_median_of_rounds"],
                " ".join(f"{x:.2f}" for x in ar["round_ratios"]),
            )  # fmt: skip
            for mode, by_step in ar["steps_p50_ms"].items():
                steps.add(size, mode, *(by_step[step] for step in STEPS))
            extra = got["rebuilds_after_first_load"]
            reads.add(
                size, got["catchup_bytes_p50"], got["user_changes_bytes_p50"], got["feed_entry_bytes_p50"],
                got["whole_read_bytes"], tuple(extra.values()),
            )  # fmt: skip
            add_rows(removal, size, got["removals"])
            add_paired_rows(paired, size, got)
    return BenchResult(
        bench="hosts",
        summary=summary,
        tables=[recall, own, apply, steps, reads, removal, paired],
        notes=[
            f"store {ctx.store}; every host its own data directory, no shared files; load average "
            f"{summary['load_avg_1min']:.1f} (1 min) at the start; ratios are within one loop",
            "rebuild = this code with the catch-up refused: a copy behind the graph read whole again, what a "
            "host without the writer's files did before (the first 12 writes only; 3 at 100K facts)",
            f"after a signal = a reader listening for writers' stamps, answering {SIGNAL_PAUSE_S:.1f} s after the "
            "write; catch-up, graph catch-up and rebuild do not listen",
            "catch-up reads the writers' change feed (Redis); graph catch-up = the same reader with the feed "
            "refused (reads GraphStore.user_changes, as before the feed)",
            "paired: the load of the moment weighs on a recall and the floor next to it alike, so the median of "
            "the pairs' ratios moves less between sittings than the ratio of p50s; CPU: in this process the "
            "calling thread's and the reader's pool's, in the reader's own process that process's",
            "separate host (HOSTS_BENCH_SEPARATE_HOST=1): the reader process alone on one core, this process, "
            "Neo4j and Redis on the other; its encoder and its Python share that core, other users' processes "
            "are not pinned",
        ],
    )
