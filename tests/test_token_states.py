"""Token states for late interaction: the encoder's second output and the stored codec (``embedding.states``).

The vector must not move (it is output 0 of the same graph, checked against the committed reference probe);
the states are the words' last hidden states, normalized, from the same pass, equal to sentence-transformers'
token embeddings where torch is installed; the codec keeps each token's signs behind a format byte.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from engram_api.storage.embedding.embedder import Embedder
from engram_api.storage.embedding.onnx_export import PROBES, export
from engram_api.storage.embedding.states import SIGNS, kept_tokens, maxsim, maxsims, pack, unpack

_REPLY = "I went to Austin last week.\n(replying to Melanie: Where did you go, Caroline?)"


@pytest.fixture(scope="module")
def onnx(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    return Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=tmp_path_factory.mktemp("models"))


def test_the_vector_is_unchanged_and_the_states_are_the_words_from_the_same_pass(onnx: Embedder) -> None:
    """Output 0 still gives the reference probe's vectors; ``encode_states``' vectors are ``encode``'s to the
    bit; the states keep the words (no [CLS]/[SEP], no punctuation), one unit row each."""
    reference = json.loads(Path(export.__code__.co_filename).with_name("minilm_reference.json").read_text())
    vectors, states = onnx.encode_states(PROBES)
    assert float((vectors * np.asarray(reference["vectors"])).sum(axis=1).min()) >= 0.9999
    assert vectors.tobytes() == onnx.encode(PROBES).tobytes()
    for kept in states:
        assert kept.dtype == np.float32 and kept.shape[1] == 384
        np.testing.assert_allclose(np.linalg.norm(kept, axis=1), 1.0, atol=1e-5)
    # "I just moved from Tampa to Austin." is 10 tokens: its 7 words kept, the "." and [CLS]/[SEP] out.
    encoding = onnx._load().tokenizer.encode(PROBES[0])  # type: ignore[attr-defined]
    assert len(encoding.ids) == 10 and len(states[0]) == 7


def test_own_words_stop_where_the_answered_turn_begins(onnx: Embedder) -> None:
    """A candidate read with the turn it answers keeps its own words' states, read in that context: the
    same rows as the whole text's first ones, not the turn alone's."""
    end = _REPLY.index("\n(replying to ")
    _, (own,) = onnx.encode_states([_REPLY], [end])
    _, (whole,) = onnx.encode_states([_REPLY])
    _, (alone,) = onnx.encode_states([_REPLY[:end]])
    assert len(own) == len(alone) == 6 and len(whole) > len(own)
    np.testing.assert_array_equal(own, whole[: len(own)])
    assert not np.allclose(own, alone, atol=1e-3)


def test_kept_tokens_drops_specials_punctuation_and_what_follows_the_end() -> None:
    text = "Hi, Bob!"
    words = [None, 0, 1, 2, 3, None]
    offsets = [(0, 0), (0, 2), (2, 3), (4, 7), (7, 8), (0, 0)]
    assert kept_tokens(text, words, offsets, len(text)).tolist() == [False, True, False, True, False, False]
    assert kept_tokens(text, words, offsets, 3).tolist() == [False, True, False, False, False, False]


def test_a_querys_states_are_cached_with_its_vector_and_forgotten_with_it(onnx: Embedder) -> None:
    """The recall's path: a prepared query with states gives them beside ``encode``'s vector; prepared again it
    is served from the cache with the same arrays; a cached vector without states does not serve an ask for
    them; ``forget`` drops both."""
    query = "where did Caroline go last week?"
    first = onnx.prepare_one(query, user_id="u1", states=True)
    vector, states = first.vector(), first.states()
    assert states is not None and not states.flags.writeable
    assert vector.tobytes() == onnx.encode([query])[0].tobytes()
    np.testing.assert_array_equal(states, onnx.encode_states([query])[1][0])
    again = onnx.prepare_one(query, user_id="u1", states=True)
    assert again.ready and again.vector() is vector and again.states() is states
    plain = "a query cached without its states"
    onnx.encode_one(plain, user_id="u1")
    assert onnx.prepare_one(plain, states=False).ready and not onnx.prepare_one(plain, states=True).ready
    assert onnx.forget("u1") == 2 and not onnx.prepare_one(query, states=True).ready
    assert onnx._states == {}


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs engram[torch]")
def test_the_states_equal_sentence_transformers_token_embeddings(onnx: Embedder) -> None:
    torch = Embedder(model="all-MiniLM-L6-v2", backend="torch")
    texts = [*PROBES, _REPLY]
    ends = [len(t) for t in PROBES] + [_REPLY.index("\n(replying to ")]
    a_vec, a_states = onnx.encode_states(texts, ends)
    b_vec, b_states = torch.encode_states(texts, ends)
    assert float((a_vec * b_vec).sum(axis=1).min()) >= 0.9999
    for a, b in zip(a_states, b_states, strict=True):
        assert a.shape == b.shape and float((a * b).sum(axis=1).min()) >= 0.9999
    assert torch.prepare_one(_REPLY, states=True).states() is not None


def test_signs_round_trip_behind_a_format_byte_and_maxsim_reads_them() -> None:
    rng = np.random.default_rng(7)
    states = rng.normal(size=(5, 384)).astype(np.float32)
    blob = pack(states)
    assert blob[0] == SIGNS and len(blob) == 5 + 5 * 48
    back = unpack(blob)
    assert back.shape == (5, 384) and back.dtype == np.float32
    np.testing.assert_array_equal(back > 0, states >= 0)
    np.testing.assert_allclose(np.linalg.norm(back, axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="unknown format"):
        unpack(bytes([2]) + blob[1:])
    with pytest.raises(ValueError, match="length"):
        unpack(blob[:-1])
    assert unpack(pack(np.zeros((0, 384), np.float32))).shape == (0, 384)


def test_maxsim_is_each_query_tokens_best_match_averaged_and_maxsims_agrees() -> None:
    query = np.eye(3, 4, dtype=np.float32)  # three query tokens along axes 0, 1, 2
    doc = np.array([[1, 0, 0, 0], [0, 0.6, 0.8, 0]], np.float32)
    assert maxsim(query, doc) == pytest.approx((1 + 0.6 + 0.8) / 3)
    assert maxsim(query, doc[:0]) == 0.0 and maxsim(query[:0], doc) == 0.0
    rng = np.random.default_rng(3)
    q = rng.normal(size=(6, 384)).astype(np.float32)
    blobs = [pack(rng.normal(size=(n, 384)).astype(np.float32)) for n in (4, 0, 9, 1)]
    got = maxsims(q, blobs)
    assert got[1] == 0.0
    assert got == pytest.approx([maxsim(q, unpack(b)) for b in blobs], abs=1e-6)
    # A long query makes the products' slices (``_ONE_THREAD``) 17 rows: candidates span slices, empty
    # ones at either end and between.
    long = rng.normal(size=(40, 384)).astype(np.float32)
    blobs = [pack(rng.normal(size=(n, 384)).astype(np.float32)) for n in (0, 30, 5, 0, 16, 2, 41, 0)]
    got = maxsims(long, blobs)
    assert got == pytest.approx([maxsim(long, unpack(b)) for b in blobs], abs=1e-6)
    assert got[0] == got[3] == got[-1] == 0.0
