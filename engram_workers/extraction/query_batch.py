"""Query vectors for the extract threads of one process, encoded together instead of one by one.

The slim context (``stages.extract.read_prompt_inputs``) needs one vector per message. Under a burst, dozens of
extract threads want one at the same moment, and MiniLM encodes a batch of 16 short texts for about half
the CPU per text of 16 single encodes (``ops/bench/run.py --only llm``).

Invariants:
- No thread ever waits for a timer or a fuller batch: a thread that finds no encode running encodes at
  once (alone, that is a plain one-text encode); threads arriving while an encode runs queue up, and when
  it ends the first of them encodes everything queued (up to ``max_batch``) in one call.
- Each thread encodes at most one batch (the one holding its own text), then hands the turn to the
  first thread still waiting: no thread is kept serving the others.
- Every text gets exactly its own vector (the same as ``Embedder.encode([text])``), read-only; an encode
  error reaches every thread whose text was in that batch, and the next batch still runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from engram_api.storage.embedding.embedder import Embedder

__all__ = ["QueryBatcher"]


@dataclass(eq=False)
class _Slot:
    text: str
    woken: threading.Event = field(default_factory=threading.Event)
    vector: np.ndarray | None = None
    error: Exception | None = None
    turn: bool = False  # woken to encode the next batch, not with a result


class QueryBatcher:
    def __init__(self, embedder: Embedder, *, max_batch: int = 32) -> None:
        self.embedder = embedder
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queued: list[_Slot] = []
        self._busy = False  # a batch is being encoded, or the turn was handed to a queued thread
        self.batches = 0  # encode calls so far (texts / batches is the batching achieved)
        self.texts = 0

    def waiting(self) -> int:
        """Threads queued behind the running encode."""
        with self._lock:
            return len(self._queued)

    def encode_one(self, text: str) -> np.ndarray:
        slot = _Slot(text)
        with self._lock:
            self._queued.append(slot)
            if not self._busy:  # nothing runs and nothing is queued: this slot is first, it encodes at once
                self._busy = True
                slot.turn = True
        if not slot.turn:
            slot.woken.wait()
        if slot.turn:
            self._encode_batch()
        if slot.error is not None:
            raise slot.error
        assert slot.vector is not None
        return slot.vector

    def _encode_batch(self) -> None:
        with self._lock:
            batch = self._queued[: self.max_batch]
            del self._queued[: self.max_batch]
        texts = list(dict.fromkeys(s.text for s in batch))  # the same text twice is encoded once
        try:
            vectors = self.embedder.encode(texts)
        except Exception as exc:
            for s in batch:
                s.error = exc
        else:
            vectors.setflags(write=False)
            row = {t: vectors[i] for i, t in enumerate(texts)}
            for s in batch:
                s.vector = row[s.text]
        with self._lock:
            self.batches += 1
            self.texts += len(batch)
            following = self._queued[0] if self._queued else None
            if following is None:
                self._busy = False
            else:
                following.turn = True
        for s in batch:
            s.woken.set()
        if following is not None:
            following.woken.set()
