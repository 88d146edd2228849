"""One writer per user, really: versions never reused across a user's lifetimes, the write fenced on
the stamp its plan was built on, the lease renewed, and readers never see an index change under them.

The pipeline runs in this process with the real stage functions (``run_extract`` with the offline rule
extractor, ``run_apply``) on real Redis and a real graph store (Neo4j and SQLite); each ``WorkerResources``
stands for one worker process (its own index cache, its own store connections). One "process"'s store
is wrapped with a gate that holds its commit after planning, the way a commit stuck in retries does.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from engram_api import keys
from engram_api.models import MessageState
from engram_api.storage.faiss.files import VectorStore
from engram_api.storage.writer.lease import Lease
from engram_api.versions import Stamp, read_stamp
from engram_workers.stages.apply import run_apply
from engram_workers.stages.extract import run_extract
from tests.support.fencing import T0, StalledGraph, deliver, graph_ids, index_ids, new_user, process
from tests.support.fencing import stack as stack  # the fixture (Neo4j, then SQLite), brought in by name
from tests.support.operator_processes import wait_until
from tests.support.stack import Stack


# ------------------------------------------------------------------------------------------ finding 1
def test_a_forgotten_lifetime_never_comes_back_through_another_process_cache(stack: Stack) -> None:
    """Process 2 caches alice at v1, forget_user, process 1 applies a new message (v1 again), process 2
    applies the next: its stale v1 must not be taken for the new lifetime's v1."""
    one, two, user = process(stack), process(stack), new_user()
    deliver(two, stack, user, "I live in Paris.", 0)
    forgotten = graph_ids(stack, user)
    stack.client.forget_user(user)

    deliver(one, stack, user, "I work at Acme.", 1)
    deliver(two, stack, user, "I have a dog named Rex.", 2)

    on_disk, in_graph = index_ids(stack, user), graph_ids(stack, user)
    assert on_disk == in_graph
    # The user's own node has a stable id and comes back legitimately; nothing else of the old life may.
    assert not (on_disk & forgotten) - {i for i in in_graph if i in forgotten and i.startswith("ent_")}
    hits = stack.client.recall(user, "where does the user live?", k=10).items
    assert not [h for h in hits if "Paris" in h.statement]


# ------------------------------------------------------------------------------------------ finding 5
def _chain(stack: Stack, user: str) -> list[tuple[str | None, datetime, datetime | None]]:
    return [(f.object_name, f.valid_from, f.valid_until) for f in stack.client.graph.history(user, "user", "LIVES_IN")]


def _shape(stack: Stack, user: str) -> tuple[Any, ...]:
    stats = stack.client.graph.stats(user)
    return (_chain(stack, user), stats.entities, stats.facts, stats.current_facts, stats.episodes)


def test_two_appliers_whose_leases_overlap_end_as_a_sequential_run(stack: Stack) -> None:
    """Applier A plans, stalls before its commit and loses its lease; B applies another message of the
    same user meanwhile. A's write must be refused and planned again: the state equals a sequential run."""
    a, b = process(stack), process(stack)
    gate = StalledGraph(a.graph)
    a.__dict__["graph"] = gate
    user, sequential = new_user(), new_user()
    for u in (user, sequential):
        deliver(b, stack, u, "I have a dog named Rex.", 0)

    first = stack.client.enqueue(user, "I live in Paris.", timestamp=T0 + timedelta(days=1))
    run_extract(a, user, first.message_id)
    gate.close()
    # A daemon: should the test fail while it is gated, it must not hold the session's exit (up to the gate's
    # 120 s, then its retries against the stopped Redis).
    stalled = threading.Thread(target=run_apply, args=(a, user, first.message_id), daemon=True)
    stalled.start()
    assert gate.waiting.wait(timeout=120), "A never reached its commit"
    # A's lease expires while it is stalled (what a TTL lapse looks like to the holder).
    assert stack.client.redis.delete(keys.apply_lock(user)) == 1
    deliver(b, stack, user, "I moved to Berlin.", 2)
    gate.open()
    stalled.join(timeout=120)
    assert stack.client.redis.hget(keys.status(user, first.message_id), "state") == MessageState.APPLIED

    deliver(b, stack, sequential, "I moved to Berlin.", 2)
    deliver(b, stack, sequential, "I live in Paris.", 1)

    assert _shape(stack, user) == _shape(stack, sequential)
    assert [until is None for _, _, until in _chain(stack, user)].count(True) == 1
    assert index_ids(stack, user) == graph_ids(stack, user)


class RenewalClock:
    """Stands in for the lease's stop event, so the test, not the wall clock, says when a renewal is due:
    ``wait`` (the renewer's pause between renewals) returns False ("renew now") once per ``tick``, and True
    ("stop") once the lease is released."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due = 0
        self._stopped = False

    def tick(self) -> None:
        with self._cond:
            self._due += 1
            self._cond.notify_all()

    def set(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._stopped = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._due or self._stopped)
            if self._stopped:
                return True
            self._due -= 1
            return False


def test_the_lease_is_renewed_while_its_holder_works(stack: Stack) -> None:
    """Each renewal gives the lease its full TTL again. Time is the test's: the key's expiry is pulled in
    (as if most of the TTL had passed), a renewal is made due, and the key must be back to the full TTL,
    still with the holder's token; a loaded machine can only make the test wait longer."""
    user, r = new_user(), stack.client.redis
    ttl_ms, almost_gone_ms = 60_000, 20_000
    lease = Lease(r, user, ttl=ttl_ms / 1000, wait=0)
    clock = RenewalClock()
    lease.__dict__["_stop"] = clock
    with lease:
        for n in range(1, 4):
            assert r.pexpire(keys.apply_lock(user), almost_gone_ms)
            clock.tick()
            wait_until(lambda n=n: lease.renewals == n, timeout=60, what=f"renewal {n}")
            assert r.pttl(keys.apply_lock(user)) > almost_gone_ms  # renewed to the full TTL
            assert r.get(keys.apply_lock(user)) == lease.token  # by its holder
    assert not r.exists(keys.apply_lock(user))


class CountingStamps:
    """The real graph store, counting ``user_stamp`` reads (everything else passes through)."""

    def __init__(self, real: Any) -> None:
        self._real, self.asked = real, 0

    def user_stamp(self, user_id: str) -> Stamp:
        self.asked += 1
        return self._real.user_stamp(user_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_first_apply_is_fenced_on_the_published_stamp_and_a_stale_one_only_costs_a_replan(stack: Stack) -> None:
    """A first apply takes the stamp writers published (no graph read). When that stamp trails the graph (a
    writer died between its commit and its publish), the fence refuses the write, the re-plan reads the
    graph's stamp, and the message, the index and the published stamp all end at the graph's state."""
    user = new_user()
    ctx = process(stack)
    reads = CountingStamps(ctx.graph)
    ctx.__dict__["graph"] = reads  # before the keeper and the user writes take the real store
    deliver(ctx, stack, user, "I live in Oslo.", 0)

    def first_apply(text: str, day: int) -> None:
        receipt = stack.client.enqueue(user, text, timestamp=T0 + timedelta(days=day))
        run_extract(ctx, user, receipt.message_id)
        result = run_apply(ctx, user, receipt.message_id, first_start=True)
        assert ctx.redis.hget(keys.status(user, receipt.message_id), "state") == MessageState.APPLIED, result

    reads.asked = 0
    first_apply("I work at Acme.", 1)
    assert reads.asked == 0
    graph = stack.client.graph
    assert read_stamp(ctx.redis, user) == graph.user_stamp(user)

    now = graph.user_stamp(user)
    ctx.redis.set(keys.user_version(user), str(Stamp(now.epoch, now.version - 1)))  # the lost publish
    first_apply("I moved to Bergen.", 2)
    assert reads.asked == 1  # the re-plan's
    after = graph.user_stamp(user)
    assert after.version == now.version + 1
    assert read_stamp(ctx.redis, user) == after
    store = VectorStore(root=stack.settings.index_dir, dim=stack.client.reader.embedder.dim)
    assert store.file_stamp(user) == after
    assert index_ids(stack, user) == graph_ids(stack, user)
    assert [f.statement for f in graph.history(user, "user", "LIVES_IN")][-1] == "User lives in Bergen"


# ------------------------------------------------------------------------------------------ finding 6
def test_concurrent_recalls_and_writes_in_one_process_never_see_an_index_change(stack: Stack) -> None:
    """Readers hold the index they search; a write (forget, feedback) in the same process swaps in a new
    one instead of changing the held one, so every search sees one whole version."""
    worker, reader, user = process(stack), stack.client.reader, new_user()
    texts = ["I live in Paris.", "I work at Acme.", "I have a dog named Rex.", "I like jazz.", "I play chess."]
    ids = [deliver(worker, stack, user, text, day) for day, text in enumerate(texts)]
    held = reader.keeper.current(user, reader.graph.user_stamp(user))
    held_rows, held_stamp = dict(held.rows), held.stamp

    errors: list[BaseException] = []
    stop = threading.Event()

    def recall_loop() -> None:
        while not stop.is_set():
            try:
                result = reader.recall(user, "what does the user do?", k=5)
                assert all(item.id for item in result.items)
            except BaseException as exc:  # collected, asserted empty below
                errors.append(exc)
                return

    with ThreadPoolExecutor(max_workers=4) as pool:
        loops = [pool.submit(recall_loop) for _ in range(3)]
        for message_id in ids[:3]:
            reader.forget(user, message_id)
        stop.set()
        for loop in loops:
            loop.result()

    assert not errors, errors
    assert (dict(held.rows), held.stamp) == (held_rows, held_stamp)
    assert index_ids(stack, user) == graph_ids(stack, user)
