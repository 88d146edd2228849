"""After a forget, no cache of the reader holds the forgotten text: not its records, not the terms recall
stemmed from it to score the keyword hits (``engram_api.reader.terms``), not any memo of the process.
On both backends with a real Redis (a forget reaches Redis, and refuses without it).

The check walks what the reader holds (its caches, its snapshots, its threads' state) and every memo a module
of ``engram_api`` keeps at module level, and looks for the forgotten text in every string it reaches. Not
walked: the stores' clients (the graph store, Redis) and the encoder, whose query cache holds queries, not
memory texts (``Embedder``; in this test the writer shares it and caches the message's text there, as an apply
worker does: said in docs/operations.md, "Erasure").
"""

# ruff: noqa: F811 - ``memory`` (and ``embedder``, which it takes) are the suites' fixtures, imported below

from __future__ import annotations

import gc
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_api.reader import recall as recall_module
from engram_api.reader.reader import Reader
from engram_api.reader.signals import StampSignals
from tests.support.extractions import fact
from tests.support.factories import at, new_user

from .test_hybrid_recall import Memory, embedder  # noqa: F401 - ``embedder``: the fixture
from .test_reader_signals import _chatter, _host, _until, _warm, memory  # noqa: F401 - ``memory``

SECRET = "User keeps the spare key under the zebrawood planter"
SAID = "I keep the spare key under the zebrawood planter."
QUERY = "where is the spare key? zebrawood"
WORD = "planter"  # the secret's, not the query's: held as a word only by the texts and their terms


def _module_memos() -> Iterator[Any]:
    """What Engram's modules keep at module level that could memo texts: containers, ``lru_cache`` wrappers,
    thread-locals (functions, classes and modules are code, not memos)."""
    for name, module in list(sys.modules.items()):
        if name.startswith(("engram_api", "engram_workers")) and module is not None:
            for key, value in list(vars(module).items()):
                kind = type(value)  # never ``isinstance``: a Celery task's proxy asked its ``__class__`` evaluates
                memo = issubclass(kind, dict | list | set | threading.local) or hasattr(kind, "cache_info")
                if memo and not key.startswith("__"):
                    yield value


def _strings(roots: Iterable[Any], skip: Iterable[Any], skip_types: tuple[type, ...] = ()) -> Iterator[str]:
    """Every string reachable from ``roots`` (through ``gc.get_referents``), not walking into ``skip``, objects
    of ``skip_types``, modules, classes or functions' globals."""
    seen = {id(s) for s in skip}
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)  # as in ``_module_memos``: a proxy's ``__class__`` would evaluate it
        if issubclass(kind, str):
            yield obj
            continue
        if issubclass(kind, (types.ModuleType, type, types.FunctionType, types.CodeType, *skip_types)):
            continue
        todo.extend(gc.get_referents(obj))


def _holding(reader: Reader, text: str, skip_types: tuple[type, ...] = ()) -> list[str]:
    """The strings holding ``text`` that the reader or a module-level memo keeps (``_strings``)."""
    skip = [reader.graph, reader.redis, reader.embedder]
    return [s for s in _strings([reader, *_module_memos()], skip, skip_types) if text in s]


def _keyed(memory: Memory, user: str, reader: Reader) -> None:
    """The user's chatter and the secret message with its fact, held whole by ``reader``, which then recalls
    the secret through the keyword channel (so the terms of its texts are stemmed, and kept)."""
    _chatter(memory, user)
    memory.say(user, "key", SAID, at(20), {"facts": [fact("user", "KEEPS_KEY", None, SECRET)]})
    _warm(reader, user)
    (item,) = [i for i in reader.recall(user, QUERY, k=10).items if i.statement == SECRET]
    assert "keyword" in item.channels


def test_after_a_forget_no_cache_of_the_reader_holds_the_forgotten_text(memory: Memory, tmp_path: Path) -> None:
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _keyed(memory, user, reader)
    assert _holding(reader, WORD)  # the walk reaches the reader's caches
    reader.forget(user, "key")  # the message: its chunks and the fact only it stated
    reader.flush()
    assert _holding(reader, WORD) == []
    got = reader.recall(user, QUERY, k=10).items  # and answers without it, read again from the store
    assert SECRET not in {i.statement for i in got} and _holding(reader, WORD) == []


def test_after_another_hosts_forget_the_readers_caches_hold_nothing_of_it(memory: Memory, tmp_path: Path) -> None:
    """A forget on another host reaches this reader by the writer's stamp signal: the results and records it
    kept at older stamps go (``RecallReader.signalled_stamp``), and its catch-up takes the message's chunks and
    fact out of the held snapshot, whose terms memo begins anew (``removal.without``), then folds it on a
    reader thread (``fold_soon``: the hidden rows go)."""
    reader = _host(memory, tmp_path / "reader")
    signals = StampSignals(memory.redis, reader.signalled_stamp).start()  # as ``MemoryClient.reader`` does
    try:
        _until(signals.subscribed.is_set, "subscribed")
        user = new_user()
        _keyed(memory, user, reader)
        memory.reader.forget(user, "key")  # the other host (its own reader, its own caches): the message
        stamp = memory.graph.user_stamp(user)
        _until(lambda: (s := reader.snapshots.peek(user)) is not None and s.stamp == stamp, "caught up")
        reader.flush()
        assert _holding(reader, WORD) == []  # the catch-up's fold ran (``fold_soon``)
    finally:
        signals.stop()


def test_after_another_hosts_forget_the_readers_caches_hold_nothing_of_it_from_its_next_recall(
    memory: Memory, tmp_path: Path
) -> None:
    """No signal: the reader learns of the forget's stamp at its next recall of the user (another question),
    which drops the results and records kept at older stamps and catches its snapshot up, then folds it on a
    reader thread (``fold_soon``), which ``flush`` waits for."""
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _keyed(memory, user, reader)
    memory.reader.forget(user, "key")
    reader.recall(user, "what did I say about the fjord?", k=10)
    reader.flush()
    assert _holding(reader, WORD) == []


def test_a_readers_held_state_of_an_erased_user_goes_at_its_next_recall(memory: Memory, tmp_path: Path) -> None:
    """``forget_user`` on another host: this reader's results, records, snapshot and terms memo of the user's
    lifetime go at its next recall of the user, which finds the user absent."""
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _keyed(memory, user, reader)
    memory.reader.forget_user(user)
    assert reader.recall(user, QUERY, k=10).items == []
    reader.flush()
    assert reader.snapshots.peek(user) is None and _holding(reader, WORD) == []


def test_a_recall_running_across_another_hosts_forget_keeps_nothing_of_it(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's signal arrives while a recall at the older stamp runs (here: once it has ranked, before it
    keeps its result and records): what that recall keeps at the older stamp goes when it ends
    (``Reader``'s ``_Crossings``), not at the user's next recall."""
    reader = _host(memory, tmp_path / "reader")
    user = new_user()
    _keyed(memory, user, reader)
    real = recall_module.recall_items

    def ranked_then_forgotten(**kwargs: Any) -> Any:
        items = real(**kwargs)
        memory.reader.forget(user, "key")  # the other host's forget, committed and signalled now
        reader.signalled_stamp(user, memory.graph.user_stamp(user))  # what ``StampSignals`` hands on
        return items

    monkeypatch.setattr(recall_module, "recall_items", ranked_then_forgotten)
    crossed = reader.recall(user, QUERY, k=9)  # another key than ``_keyed``'s recall: not a cache hit
    monkeypatch.undo()
    assert SECRET in {i.statement for i in crossed.items}  # it ranked at the older stamp
    reader.flush()
    assert _holding(reader, WORD) == []
