"""Where a recall's work runs, on both backends with a real Redis: the query's model call on the recall's own
thread, entered before any of the recall's own Python (the stamp, the catch-up, the keyword search, the
weights), which runs beside it on a reader thread (``RecallReader._begin``), once the model has let go of
the GIL. So the encoder's steps never wait behind that Python for the GIL (each wait up to a switch
interval): it runs inside the model call instead.

Observed by order, never by time: around the recall the interpreter's switch interval is set far above the
recall's length, so the GIL passes between threads only where one lets it go (a wait, I/O, ONNX Runtime's
``run``); what runs first is then what the code's structure runs first.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram_api.reader.reader import Reader
from engram_api.storage.embedding.embedder import Embedder
from tests.support.factories import at, new_user

from .test_hybrid_recall import Memory, embedder  # noqa: F401 - ``embedder``: the fixture
from .test_reader_signals import READER_THREADS, _chatter, _host, _warm, memory  # noqa: F401 - ``memory``: ditto


class Steps:
    """The steps of a recall as they begin: (step, thread name), in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def wrap(self, step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def begun(*args: Any, **kwargs: Any) -> Any:
            self.seen.append((step, threading.current_thread().name))  # under the GIL: one at a time
            return fn(*args, **kwargs)

        return begun


class _Session:
    """ONNX Runtime's session, its ``run`` (the model call) a step."""

    def __init__(self, session: Any, steps: Steps) -> None:
        self._session = session
        self.run = steps.wrap("model", session.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@pytest.fixture
def steps(embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> Steps:  # noqa: F811
    import engram_api.reader.recall as recall_module

    seen = Steps()
    encoder = embedder._load()
    monkeypatch.setattr(encoder, "session", _Session(encoder.session, seen))
    monkeypatch.setattr(recall_module, "keyword_hits", seen.wrap("keyword", recall_module.keyword_hits))
    return seen


@dataclass
class Hosts:
    memory: Memory  # the writer's host (the apply stage's write path)
    reader: Reader  # a reader host of its own, not listening: its recalls catch its copies up themselves


@pytest.fixture
def hosts(memory: Memory, tmp_path: Path) -> Iterator[Hosts]:  # noqa: F811
    reader = _host(memory, tmp_path / "reader")
    yield Hosts(memory, reader)
    reader.close()


def _traced(reader: Reader, steps: Steps, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_version", steps.wrap("stamp", reader._version))
    monkeypatch.setattr(reader, "weights_for", steps.wrap("weights", reader.weights_for))
    monkeypatch.setattr(reader.catchups, "_catch_up", steps.wrap("catch-up", reader.catchups._catch_up))


@pytest.fixture
def long_switches() -> Iterator[Callable[[], Any]]:
    """Call the returned context to run a block with a switch interval no recall comes near (60 s)."""
    saved = sys.getswitchinterval()

    class Switches:
        def __enter__(self) -> None:
            sys.setswitchinterval(60.0)

        def __exit__(self, *exc: object) -> None:
            sys.setswitchinterval(saved)

    yield Switches
    sys.setswitchinterval(saved)


def _recall(reader: Reader, user: str, question: str, steps: Steps, long_switches: Callable[[], Any]) -> None:
    steps.seen.clear()
    with long_switches():
        result = reader.recall(user, f"{question} ({user})")  # a new text: the encoder's cache never holds it
        reader.flush()
    assert not result.cached and result.items


def _model_first(steps: Steps, expected: set[str]) -> None:
    """The model call, on the recall's thread, before every other step; those on reader threads."""
    me = threading.current_thread().name
    assert steps.seen[0] == ("model", me), steps.seen
    assert {step for step, _ in steps.seen[1:]} == expected, steps.seen
    assert all(thread.startswith(READER_THREADS) for _, thread in steps.seen[1:]), steps.seen


def test_the_model_is_entered_before_the_recalls_python_with_a_held_snapshot(
    hosts: Hosts, steps: Steps, monkeypatch: pytest.MonkeyPatch, long_switches: Any
) -> None:
    user = new_user()
    _chatter(hosts.memory, user)
    _warm(hosts.reader, user)  # the snapshot held at the stamp: its keyword search is Python, beside the model
    _traced(hosts.reader, steps, monkeypatch)
    _recall(hosts.reader, user, "what did my sister say this morning?", steps, long_switches)
    _model_first(steps, {"stamp", "keyword", "weights"})


def test_the_model_is_entered_before_the_recalls_python_right_after_another_hosts_write(
    hosts: Hosts, steps: Steps, monkeypatch: pytest.MonkeyPatch, long_switches: Any
) -> None:
    user, writer, reader = new_user(), hosts.memory, hosts.reader
    _chatter(writer, user)
    _warm(reader, user)
    writer.say(user, "aurora", "We finally saw the northern lights dancing over the fjord last night!", at(20))
    _traced(reader, steps, monkeypatch)
    _recall(reader, user, "the northern lights trip", steps, long_switches)
    _model_first(steps, {"stamp", "catch-up", "keyword", "weights"})
    order = [step for step, _ in steps.seen]
    assert order.index("stamp") < order.index("catch-up") < order.index("keyword")  # it searches the caught-up copy
    held = reader.snapshots.peek(user)
    assert held is not None and held.stamp == writer.graph.user_stamp(user)


def test_the_model_is_entered_before_the_recalls_python_asking_the_store(
    hosts: Hosts, steps: Steps, monkeypatch: pytest.MonkeyPatch, long_switches: Any
) -> None:
    user = new_user()
    _chatter(hosts.memory, user)  # the reader holds nothing of the user: the store's keyword search
    _traced(hosts.reader, steps, monkeypatch)
    _recall(hosts.reader, user, "running shoes to buy", steps, long_switches)
    _model_first(steps, {"stamp", "keyword", "weights"})
