"""The terms of the texts a recall scores by the query's words (``scoring.word_share``), kept per user and
dropped with the user's held state: a forgotten text's terms (and the text itself, their key) never outlive
the reader's copies of the user's records.

Where a recall's memo comes from (``SnapshotCache.terms``):
- a user whose snapshot the recall reads: the snapshot's own (``UserSnapshot.terms``), carried by a refresh
  that only added records, begun anew by one that removed any (``removal.without``) or by a whole load, and
  gone when the snapshot is (dropped by a write of this reader, evicted by the budget, replaced by another
  lifetime's);
- any other user: this module's ``TermCache``, one memo per user at the stamp it was begun at, as the
  reader's record caches (``reader.facts``) are: a recall at a newer stamp begins a new one, so after any
  host's forget the memo of the texts read before it goes at the user's next recall, and at once after
  this reader's own write (``drop_user``, with every cache of the user).

Invariants: a memo answers ``frozenset(stems(text))`` for every text, whoever kept it (a memo only saves
time); bounded: at most ``users`` users (least recently used dropped first), ``per_user`` texts each; a
recall at an older stamp than the held memo's (a slow reader) gets a memo of its own, never rolling the
held one back. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from engram_api.storage.snapshot.keywords import TextTerms
from engram_api.versions import Stamp

__all__ = ["TermCache"]


class TermCache:
    """The terms memo of each user a recall read without a snapshot, at the stamp it was begun at."""

    def __init__(self, users: int = 16, per_user: int = 1024) -> None:  # 16,384 texts, as the process's memo
        self.users = users
        self.per_user = per_user
        self._held: OrderedDict[str, tuple[Stamp, TextTerms]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, user_id: str, stamp: Stamp) -> TextTerms:
        """The user's memo at ``stamp``: the one held when begun at ``stamp``, else a new one, held unless an
        older stamp's (a newer one is held) asks."""
        with self._lock:
            held = self._held.get(user_id)
            if held is not None and held[0] == stamp:
                self._held.move_to_end(user_id)
                return held[1]
            terms = TextTerms(self.per_user)
            if held is not None and held[0].epoch == stamp.epoch and held[0] > stamp:
                return terms  # a slow reader's: the newer stamp's memo stays
            self._held[user_id] = (stamp, terms)
            self._held.move_to_end(user_id)
            while len(self._held) > self.users:
                self._held.popitem(last=False)
            return terms

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            self._held.pop(user_id, None)

    def held(self, user_id: str) -> TextTerms | None:
        """The user's memo, at whatever stamp (tests read it)."""
        with self._lock:
            entry = self._held.get(user_id)
            return None if entry is None else entry[1]
