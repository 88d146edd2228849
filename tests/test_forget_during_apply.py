"""forget and forget_user while an apply holds the user's lease: they wait for it, then erase, so what
the apply wrote (even the very message being forgotten) is gone afterwards and the index agrees with the
graph; a caller who cannot wait gets ``UserBusyError`` and, once the apply is done, can forget.

The apply runs in this process with the real stage function (``run_apply``) on a store whose commit is
held (``StalledGraph``): the apply is inside its ``UserWrite``, lease held, plan made, commit pending.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from engram_api import keys
from engram_api.errors import UserBusyError
from engram_api.models import MessageState
from engram_api.storage.writer.lease import Lease
from engram_workers.stages.apply import run_apply
from engram_workers.stages.extract import run_extract
from tests.support.fencing import T0, StalledGraph, deliver, graph_ids, index_ids, new_user, process
from tests.support.fencing import stack as stack  # the fixture (SQLite, then Neo4j), brought in by name
from tests.support.operator_processes import wait_until
from tests.support.stack import Stack


class Stalled:
    """An apply of one new message of ``user`` held at its commit, in a thread, lease held."""

    def __init__(self, stack: Stack, user: str, text: str, day: int) -> None:
        self.ctx = process(stack)
        self.gate = StalledGraph(self.ctx.graph)
        self.ctx.__dict__["graph"] = self.gate
        receipt = stack.client.enqueue(user, text, timestamp=T0 + timedelta(days=day))
        self.message_id = receipt.message_id
        run_extract(self.ctx, user, self.message_id)
        self.gate.close()
        # Daemons, here and in ``in_thread``: a test that fails while they wait (a gate, a 600 s lease wait)
        # must not hold the session's exit.
        self.thread = threading.Thread(target=run_apply, args=(self.ctx, user, self.message_id), daemon=True)
        self.thread.start()
        assert self.gate.waiting.wait(timeout=120), "the apply never reached its commit"

    def finish(self) -> None:
        self.gate.open()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()


@pytest.fixture
def lease_waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Names of the threads that asked for a user's lease (the real ``Lease.acquire``, recorded first);
    and a caller's wait for it made long, so only the test decides when the apply lets go."""
    asked: set[str] = set()
    acquire = Lease.acquire

    def recorded(self: Lease) -> Lease:
        asked.add(threading.current_thread().name)
        return acquire(self)

    monkeypatch.setattr(Lease, "acquire", recorded)
    monkeypatch.setattr("engram_api.reader.reader._WRITE_WAIT_S", 600.0)
    yield asked


def in_thread(name: str, call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), name=name, daemon=True)
    thread.start()
    return thread, out


def test_forget_of_the_message_being_applied_waits_for_the_apply_then_erases_it(
    stack: Stack, lease_waits: set[str]
) -> None:
    user = new_user()
    deliver(process(stack), stack, user, "I have a dog named Rex.", 0)
    apply = Stalled(stack, user, "I live in Paris.", 1)
    forget, _ = in_thread("forget", lambda: stack.client.forget(user, apply.message_id))
    wait_until(lambda: "forget" in lease_waits, timeout=120, what="forget to ask for the lease")
    # Forget tombstoned the message first, and waits for the apply, which holds the lease mid-write.
    assert stack.client.redis.exists(keys.forgotten(user, apply.message_id))
    assert forget.is_alive() and not stack.client.graph.is_applied(user, apply.message_id)
    apply.finish()
    forget.join(timeout=120)
    assert not forget.is_alive()

    graph = stack.client.graph
    assert not graph.is_applied(user, apply.message_id)
    assert [f.object_name for f in graph.history(user, "user", "LIVES_IN")] == []
    assert [f.object_name for f in graph.history(user, "user", "HAS_PET")] == ["Rex"]
    assert stack.client.redis.hget(keys.status(user, apply.message_id), "state") != MessageState.APPLIED
    assert index_ids(stack, user) == graph_ids(stack, user)


def test_forget_user_during_an_apply_waits_for_it_then_leaves_nothing(stack: Stack, lease_waits: set[str]) -> None:
    user = new_user()
    deliver(process(stack), stack, user, "I have a dog named Rex.", 0)
    apply = Stalled(stack, user, "I live in Paris.", 1)
    forget_user, out = in_thread("forget_user", lambda: stack.client.forget_user(user))
    wait_until(lambda: "forget_user" in lease_waits, timeout=120, what="forget_user to ask for the lease")
    assert forget_user.is_alive() and stack.client.graph.stats(user).facts > 0
    apply.finish()
    forget_user.join(timeout=120)
    assert not forget_user.is_alive() and out and out[0].facts > 0

    assert stack.client.graph.stats(user).facts == 0 and stack.client.graph.episodes(user) == []
    assert not stack.client.reader.keeper.vectors.path_for(user).exists()
    left = [k for p in keys.user_keys_pattern(user) for k in stack.client.redis.scan_iter(match=p)]
    assert not [k for k in left if not k.startswith(keys.forgotten(user, ""))], left


def test_a_forget_that_cannot_wait_is_refused_busy_and_succeeds_after_the_apply(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = new_user()
    first = deliver(process(stack), stack, user, "I have a dog named Rex.", 0)
    apply = Stalled(stack, user, "I live in Paris.", 1)
    monkeypatch.setattr("engram_api.reader.reader._WRITE_WAIT_S", 0.0)
    with pytest.raises(UserBusyError) as busy:
        stack.client.forget(user, first)
    assert busy.value.user_id == user
    assert stack.client.graph.is_applied(user, first)  # the graph was not touched
    apply.finish()
    stack.client.forget(user, first)
    assert not stack.client.graph.is_applied(user, first)
    assert [f.object_name for f in stack.client.graph.history(user, "user", "LIVES_IN")] == ["Paris"]
    assert index_ids(stack, user) == graph_ids(stack, user)
