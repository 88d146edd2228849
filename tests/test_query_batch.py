"""The extract threads' query vectors are encoded together when they coincide (``QueryBatcher``), each
thread still getting exactly its own vector, and an encode error reaching only the threads it concerns.

The real MiniLM encodes; the only addition is a gate that holds the first encode until the other
threads are queued behind it, so the batch the test checks does not depend on thread timing.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from engram_api.storage.embedding.embedder import Embedder
from engram_workers.extraction.query_batch import QueryBatcher

_TEXTS = [
    "I moved to Lisbon last spring.",
    "My sister Maya is a nurse in Porto.",
    "We adopted a cat called Rex.",
    "I moved to Lisbon last spring.",  # the same text twice: encoded once, both threads get it
    "I started a new job at a robotics startup.",
]


class GatedEmbedder:
    """The real embedder; its first encode waits for ``release`` (and says when it started waiting)."""

    def __init__(self, embedder: Embedder, *, fail_on: str | None = None) -> None:
        self.embedder = embedder
        self.fail_on = fail_on
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(60)
        if self.fail_on in texts:
            raise RuntimeError("encoder broke on this batch")
        return self.embedder.encode(texts)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(model="all-MiniLM-L6-v2", backend="onnx", query_cache_size=0)


def _queue_behind_first(batcher: QueryBatcher, gated: GatedEmbedder, first: str, rest: list[str]) -> list[Any]:
    """``first`` encodes alone and is held; ``rest`` queue behind it; then the gate opens. Each thread's
    vector or exception, in order."""

    def one(text: str) -> Any:
        try:
            return batcher.encode_one(text)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(rest) + 1) as pool:
        head = pool.submit(one, first)
        assert gated.entered.wait(60)
        tail = [pool.submit(one, t) for t in rest]
        deadline = time.monotonic() + 60
        while batcher.waiting() < len(rest):  # every thread queued: a state, not a timing guess
            assert time.monotonic() < deadline, "threads never queued"
            time.sleep(0.005)
        gated.release.set()
        return [head.result(60), *(f.result(60) for f in tail)]


def test_threads_arriving_during_an_encode_are_encoded_together_each_with_its_own_vector(embedder):
    gated = GatedEmbedder(embedder)
    batcher = QueryBatcher(gated)  # type: ignore[arg-type]
    vectors = _queue_behind_first(batcher, gated, "Where do I live?", _TEXTS)

    # One encode for the first text alone, one for all that queued behind it (the duplicate once).
    assert gated.calls == [["Where do I live?"], list(dict.fromkeys(_TEXTS))]
    assert (batcher.batches, batcher.texts) == (2, 6)
    for text, vector in zip(["Where do I live?", *_TEXTS], vectors, strict=True):
        assert np.allclose(vector, embedder.encode([text])[0], atol=1e-5)
        assert not vector.flags.writeable
    assert batcher.waiting() == 0


def test_a_batch_is_capped_and_the_next_thread_in_line_encodes_the_rest(embedder):
    gated = GatedEmbedder(embedder)
    batcher = QueryBatcher(gated, max_batch=2)  # type: ignore[arg-type]
    texts = [f"{t} ({i})" for i, t in enumerate(_TEXTS)]
    vectors = _queue_behind_first(batcher, gated, "Where do I live?", texts)

    assert gated.calls == [["Where do I live?"], texts[0:2], texts[2:4], texts[4:5]]
    for text, vector in zip(["Where do I live?", *texts], vectors, strict=True):
        assert np.allclose(vector, embedder.encode([text])[0], atol=1e-5)


def test_an_encode_error_reaches_the_threads_of_that_batch_only(embedder):
    gated = GatedEmbedder(embedder, fail_on=_TEXTS[2])
    batcher = QueryBatcher(gated, max_batch=2)  # type: ignore[arg-type]
    texts = [_TEXTS[0], _TEXTS[2], _TEXTS[4]]
    first, *rest = _queue_behind_first(batcher, gated, "Where do I live?", texts)

    assert isinstance(rest[0], RuntimeError) and isinstance(rest[1], RuntimeError)  # the batch that broke
    assert np.allclose(rest[2], embedder.encode([_TEXTS[4]])[0], atol=1e-5)  # the next batch still ran
    assert np.allclose(first, embedder.encode(["Where do I live?"])[0], atol=1e-5)
    # Alone again: a thread finding nothing running encodes at once.
    assert np.allclose(batcher.encode_one("hello"), embedder.encode(["hello"])[0], atol=1e-5)
    assert gated.calls[-1] == ["hello"]
