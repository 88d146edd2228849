"""Token states for late interaction: which tokens a text keeps, how they are stored, and MaxSim over them.

Late interaction (ColBERT's MaxSim) scores a candidate by how well each of the query's tokens finds its best
match among the candidate's tokens: the mean over the query's tokens of the greatest cosine with any of the
candidate's. The states are MiniLM's last hidden states (the ONNX graph's second output, ``bert_graph``;
sentence-transformers' token embeddings on torch) from the same forward pass as the text's vector, each
normalized to unit length. Measured offline on the dev conversations (docs/benchmarks/history.md, "Late
interaction from the packaged MiniLM, measured offline" and "Late interaction's stored token states"):
- the kept tokens are a text's words (``kept_tokens``): no special token ([CLS], [SEP]), no punctuation,
  and for a candidate read with the turn it answers (``embedded_texts``' "other_turn") only its own words,
  read in that context (``end``: where the answered turn begins);
- a candidate's states are stored as 1-bit signs (``pack``: 48 bytes a MiniLM token, ~1.3 KB a turn, dev
  -0.010 R@10 / -0.004 MRR against float32), the query's stay float32.

Invariants:
- ``pack`` writes a format byte first (``SIGNS``, 1); ``unpack`` reads every format it knows and raises
  ``ValueError`` on any other, so a later form (int8 with a scale per token) can follow without misreading;
- ``unpack(pack(s))`` has the shape of ``s``: each row the signs of ``s``'s row scaled to unit length
  (``±1/sqrt(dim)``), so MaxSim against it is a cosine-like score in [-1, 1];
- ``maxsim`` of an empty side is 0.0; ``maxsims`` equals ``maxsim`` for each candidate (to float rounding),
  in products small enough for one BLAS thread.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

__all__ = ["SIGNS", "kept_tokens", "maxsim", "maxsims", "normalized", "pack", "unpack"]

SIGNS = 1
_HEADER = struct.Struct("<BHH")  # format, tokens, dim
_ONE_THREAD = 2**18  # multiply-adds in one product of ``maxsims``: what OpenBLAS gives one thread (``_products``)


def kept_tokens(text: str, word_ids: Sequence[int | None], offsets: Sequence[tuple[int, int]], end: int) -> np.ndarray:
    """Which tokens of ``text``'s encoding are kept: those of a word (``word_ids`` not None, so no special
    token) with a letter or digit in their span (no punctuation) that starts before ``end``."""
    return np.fromiter(
        (
            w is not None and s < end and any(c.isalnum() for c in text[s:e])
            for w, (s, e) in zip(word_ids, offsets, strict=True)
        ),
        dtype=bool,
        count=len(word_ids),
    )


def normalized(states: np.ndarray) -> np.ndarray:
    """``states``' rows at unit length (float32; a zero row stays zero)."""
    norms = np.linalg.norm(states, axis=1, keepdims=True)
    return np.ascontiguousarray(states / np.maximum(norms, 1e-12), dtype=np.float32)


def pack(states: np.ndarray) -> bytes:
    """A text's kept token states ([tokens, dim]) as stored: the format byte, then each token's signs."""
    tokens, dim = states.shape
    return _HEADER.pack(SIGNS, tokens, dim) + np.packbits(states >= 0, axis=1).tobytes()


def _read(blob: bytes) -> tuple[int, int]:
    """The tokens and dim of a stored blob, its header and length checked."""
    if len(blob) < _HEADER.size:
        raise ValueError("token states: truncated header")
    form, tokens, dim = _HEADER.unpack_from(blob)
    if form != SIGNS:
        raise ValueError(f"token states: unknown format {form}")
    if len(blob) - _HEADER.size != tokens * ((dim + 7) // 8):
        raise ValueError("token states: length does not match the header")
    return tokens, dim


def unpack(blob: bytes) -> np.ndarray:
    """The stored states as float32 rows of unit length ([tokens, dim])."""
    tokens, dim = _read(blob)
    bits = np.frombuffer(blob, dtype=np.uint8, offset=_HEADER.size).reshape(tokens, (dim + 7) // 8)
    signs = np.unpackbits(bits, axis=1, count=dim).astype(np.float32)
    return (signs * 2 - 1) / np.float32(np.sqrt(dim))


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """The mean over ``query``'s rows of each one's greatest inner product with ``doc``'s rows."""
    if not len(query) or not len(doc):
        return 0.0
    return float((query @ doc.T).max(axis=1).mean())


def maxsims(query: np.ndarray, blobs: Sequence[bytes]) -> list[float]:
    """``maxsim(query, unpack(b))`` for each stored ``b`` (to float rounding), each candidate's tokens as the
    bits of its signs times the query as 0/1 (a sign is ``2 bit - 1``, so a token's best
    ``q . s = (2 max(q . bits) - sum q) / sqrt(dim)``): every candidate's tokens in a few products of at
    most ``_ONE_THREAD`` multiply-adds each (``_products``), then each candidate's best row per query token
    in one ``maximum.reduceat``. Measured on 40 candidates of 6-50 tokens and 5-20 query tokens (process
    CPU medians, alternated, load 3.2-3.5; docs/benchmarks/history.md, "Late interaction as the recall's
    default"): 0.37-0.38 ms against 0.71-0.74 ms for one product a candidate, 0.44-0.57 ms for products of
    2^16-2^17 or 2^19 multiply-adds, and 0.50-0.53 ms for one product over every candidate with OpenBLAS
    pinned to one thread (threadpoolctl). In recall (conv-30's second looks: 40 candidates, ~820 tokens, 9
    query tokens) 0.38 ms of thread CPU against 0.71-0.74 ms."""
    sizes = np.array([_read(b)[0] for b in blobs], dtype=np.intp)
    if not len(query) or not sizes.any():
        return [0.0] * len(blobs)
    best = _products(query, b"".join(b[_HEADER.size :] for b in blobs))
    held = sizes > 0
    starts = np.cumsum(sizes) - sizes
    # Between two held candidates' starts lie only the first one's rows (an empty candidate has none).
    tops = np.maximum.reduceat(best, starts[held], axis=0)
    out = np.zeros(len(blobs))
    out[held] = (tops - query.sum(axis=1)).mean(axis=1) / np.sqrt(query.shape[1])
    return out.tolist()


def _products(query: np.ndarray, raw: bytes) -> np.ndarray:
    """``2 bits @ query.T`` ([tokens, query tokens], float32) for the packed signs ``raw`` (tokens after
    tokens, no headers), in slices of rows unpacked and multiplied one at a time, each of at most
    ``_ONE_THREAD`` multiply-adds. Why slices: numpy's OpenBLAS (0.3.31) gives a product one thread per
    2^18 multiply-adds (its SMP_THRESHOLD_MIN x GEMM_MULTITHREAD_THRESHOLD), and on a busy machine its other
    threads wait for cores: 113 rows x 12 query tokens x 384 took 27 us of CPU, 114 rows 306 us; one
    product over 40 candidates' ~1,200 tokens 2.0 ms against 0.19 ms in slices (load 3.7), and 6-16 ms of
    wall clock. Slices of 2^18 were the fastest of 2^16-2^19."""
    dim = query.shape[1]
    packed = np.frombuffer(raw, dtype=np.uint8).reshape(-1, (dim + 7) // 8)
    twice = 2 * query.T
    out = np.empty((len(packed), len(query)), dtype=np.float32)
    step = max(1, _ONE_THREAD // (dim * len(query)))
    for at in range(0, len(packed), step):
        bits = np.unpackbits(packed[at : at + step], axis=1, count=dim)
        np.matmul(bits.astype(np.float32), twice, out=out[at : at + step])
    return out
