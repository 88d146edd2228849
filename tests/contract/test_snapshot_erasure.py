"""After another host's forget, a reader's held snapshot keeps nothing of the forgotten records once the fold
its catch-up scheduled has run (``SnapshotCache.fold_soon``): no row (not even one hidden by the overlay), no
keyword document (not even a hole) and no posting of their words. On both backends with a real Redis.

The catch-up here is the recall's own (no stamp signal is subscribed); ``test_reader_terms`` takes the
signal's path. ``Reader.flush`` is the documented wait for a reader's background work, the fold included.
"""

# ruff: noqa: F811 - ``memory`` (and ``embedder``, which it takes) are the suites' fixtures, imported below

from __future__ import annotations

from pathlib import Path

import pytest

from engram_api.reader import background
from engram_api.storage.snapshot.graph import UserSnapshot
from engram_api.storage.snapshot.keywords import stems
from engram_api.storage.snapshot.rows import STATEMENT
from tests.support.factories import new_user

from .test_hybrid_recall import Memory, embedder  # noqa: F401 - ``embedder``: the fixture
from .test_reader_signals import _host, memory  # noqa: F401 - ``memory``
from .test_reader_terms import QUERY, SECRET, WORD, _holding, _keyed, _strings


def _tables(snapshot: UserSnapshot) -> list:
    index = snapshot.keywords
    return [index.chunks, index.facts, *(() if index.recent is None else (index.recent.chunks, index.recent.facts))]


def _kept(snapshot: UserSnapshot, ids: set[str]) -> list[str]:
    """What ``snapshot`` still holds of the records ``ids`` or of ``WORD``: rows (the base's too, hidden or
    not), keyword documents (holes too), postings of its stem, and any string holding it."""
    word = stems(WORD)[0]
    rows = [i for rows in (snapshot.facts, snapshot.chunks) for i in (*rows.base, *rows.recent) if i in ids]
    documents = [i for t in _tables(snapshot) for i in t.ids if i in ids]
    postings = [word for t in _tables(snapshot) if word in t.postings]
    holes = [str(h) for t in _tables(snapshot) for h in t.holes]
    return rows + documents + postings + holes + [s for s in _strings([snapshot], []) if WORD in s]


def test_after_another_hosts_forget_the_snapshot_holds_no_row_document_or_posting_of_it(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold starts once the recall that caught the forget up has returned (``ReaderThreads.when_idle``:
    no recall of the process in flight; its deadline out of reach here), and ``flush`` waits for it."""
    reader = _host(memory, tmp_path / "reader")
    reader._threads.deadline_s = 3600.0
    user = new_user()
    _keyed(memory, user, reader)
    held = reader.snapshots.peek(user)
    assert held is not None
    gone = {i for i, row in held.facts.rows().items() if WORD in row[STATEMENT]}
    gone |= {i for i in held.chunks if WORD in held.chunks[i].indexed_text}
    assert gone and _kept(held, gone)  # the fact and the message's chunk: what the check looks for is there
    beside: list[int] = []  # the recalls in flight in the process as each fold began
    merged = UserSnapshot.merged

    def recorded(snapshot: UserSnapshot) -> UserSnapshot:
        beside.append(background._RECALLS._running)
        return merged(snapshot)

    monkeypatch.setattr(UserSnapshot, "merged", recorded)
    memory.reader.forget(user, "key")  # the other host: the message, its chunk and the fact only it stated
    got = reader.recall(user, QUERY, k=10).items  # catches the held snapshot up: the removal, in its overlay
    assert SECRET not in {i.statement for i in got}
    reader.flush()
    assert beside and not any(beside)  # folded, and never beside a recall
    folded = reader.snapshots.peek(user)
    assert folded is not None and folded.stamp == memory.graph.user_stamp(user)
    assert _kept(folded, gone) == []
    assert _holding(reader, WORD) == []  # nor any other cache of the reader (its results and records too)
