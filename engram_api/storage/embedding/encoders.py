"""The two runtimes behind ``embedder.Embedder``: ONNX Runtime over the exported graph, sentence-transformers on torch.

Both encode a batch of texts to L2-normalized float32 vectors, and (``encode_states``) each text's kept tokens'
normalized states from the same forward pass (``states.kept_tokens``: its words before a given end).

Invariants:
- a text's vector does not depend on the batch it is encoded in: a call pads its texts to the longest and
  masked positions never reach the pooling (nor a kept token's state);
- ``encode_states``' vectors equal ``encode``'s (ONNX: the graph's output 0 either way; its output 1 is only
  fetched when states are asked for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engram_api.storage.embedding.states import kept_tokens, normalized

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from engram_api.storage.embedding.onnx_export import OnnxArtifacts

__all__ = ["Encoded", "Encoder", "OnnxEncoder", "TorchEncoder"]

_BATCH = 64
# A model call pads its texts to the longest one, and the encoder's work grows with the padded tokens:
# one call for an apply batch's names (3-6 tokens), statements and chunks (20+) spent most of its time on
# padding. Texts sorted by length are cut into calls whose longest is at most this factor (+2) of the
# shortest. Measured on 30 apply batches of 8 bench messages (46 texts, 3-19 tokens): 183 -> 90 ms of CPU
# per batch on one thread, identical vectors (masked positions never reach the pooling).
_WIDTH_GROWTH = 1.5


Encoded = tuple[np.ndarray, list[np.ndarray]]  # vectors [texts, dim], each text's kept tokens' states


class Encoder(Protocol):
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...

    def encode_states(self, texts: list[str], ends: list[int]) -> Encoded:
        """``encode(texts)`` and, from the same pass, each text's states kept by ``states.kept_tokens``
        (its words before ``ends[i]``), normalized."""
        ...

    def prepare(self, text: str, states: bool) -> Callable[[], Encoded]:
        """``encode_states([text], [len(text)])`` (states empty unless ``states``) in two steps: what holds
        the GIL now, the model call returned."""
        ...


class TorchEncoder:
    def __init__(self, model: SentenceTransformer) -> None:
        self.model = model
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(getter() or 0)

    def encode(self, texts: list[str]) -> np.ndarray:
        vecs = self.model.encode(
            texts, batch_size=_BATCH, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vecs, dtype=np.float32)

    def encode_states(self, texts: list[str], ends: list[int]) -> Encoded:
        # One pass gives every output: sentence-transformers' token embeddings are what its pooling reads.
        outs: list[dict[str, Any]] = self.model.encode(  # type: ignore[assignment]
            texts, batch_size=_BATCH, output_value=None, show_progress_bar=False
        )
        tokens = self.model.tokenizer(
            texts, truncation=True, max_length=self.model.max_seq_length, return_offsets_mapping=True
        )
        vectors = normalized(np.stack([o["sentence_embedding"].float().numpy() for o in outs]))
        kept = []
        for i, (text, end, out) in enumerate(zip(texts, ends, outs, strict=True)):
            rows = out["token_embeddings"][out["attention_mask"].bool()].float().numpy()
            kept.append(normalized(rows[kept_tokens(text, tokens.word_ids(i), tokens["offset_mapping"][i], end)]))
        return vectors, kept

    def prepare(self, text: str, states: bool) -> Callable[[], Encoded]:
        if states:  # torch tokenizes inside its call
            return partial(self.encode_states, [text], [len(text)])
        return lambda: (self.encode([text]), [])


class OnnxEncoder:
    """Tokenize with ``tokenizers``, run the exported graph (pooling + normalisation inside it)."""

    def __init__(self, artifacts: OnnxArtifacts, *, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        meta = artifacts.read_meta()
        self.dim = int(meta["dim"])
        self.tokenizer = Tokenizer.from_file(str(artifacts.tokenizer))
        self.tokenizer.no_padding()  # we pad per batch below, to the batch's longest text
        self.tokenizer.enable_truncation(max_length=int(meta["max_seq_length"]))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(artifacts.model), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for chunk in _similar_lengths(order, [len(encodings[i].ids) for i in order]):
            out[chunk] = self.session.run(_VECTOR, _feed([encodings[i] for i in chunk]))[0]
        return out

    def encode_states(self, texts: list[str], ends: list[int]) -> Encoded:
        encodings = self.tokenizer.encode_batch(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        kept: list[np.ndarray] = [np.empty(0)] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for chunk in _similar_lengths(order, [len(encodings[i].ids) for i in order]):
            out[chunk], states = self.session.run(None, _feed([encodings[i] for i in chunk]))
            for row, i in enumerate(chunk):
                kept[i] = _kept(texts[i], encodings[i], states[row], ends[i])
        return out, kept

    def prepare(self, text: str, states: bool) -> Callable[[], Encoded]:
        """The text's tokens by ``Tokenizer.encode`` (the same as ``encode_batch``'s, but it keeps the GIL) and
        its feed, here; the call returned runs the model, letting go of the GIL only inside ``session.run``."""
        encoding = self.tokenizer.encode(text)
        return partial(self._run, text, encoding, _feed([encoding]), states)

    def _run(self, text: str, encoding: Any, feed: dict[str, np.ndarray], states: bool) -> Encoded:
        if not states:
            return self.session.run(_VECTOR, feed)[0], []
        vector, hidden = self.session.run(None, feed)
        return vector, [_kept(text, encoding, hidden[0], len(text))]


_VECTOR = ["embedding"]  # the graph's output 0; its output 1 is the token states (``bert_graph``)


def _kept(text: str, encoding: Any, hidden: np.ndarray, end: int) -> np.ndarray:
    """One text's kept tokens' normalized states from its rows of the graph's output 1 (padding cut off)."""
    return normalized(hidden[: len(encoding.ids)][kept_tokens(text, encoding.word_ids, encoding.offsets, end)])


def _feed(encodings: list[Any]) -> dict[str, np.ndarray]:
    """One model call's inputs: the texts' tokens padded to the longest (the last: ``encodings`` are sorted
    by length); masked positions never reach the pooling, so a text's vector does not depend on its call."""
    width = len(encodings[-1].ids)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        mask[row, :n] = enc.attention_mask
        types[row, :n] = enc.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _similar_lengths(order: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """``order`` (sorted by ``lengths``, ascending) cut into model calls of at most ``_BATCH`` texts whose
    longest is within ``_WIDTH_GROWTH`` of their shortest."""
    start = 0
    while start < len(order):
        end, limit = start + 1, lengths[start] * _WIDTH_GROWTH + 2
        while end < len(order) and end - start < _BATCH and lengths[end] <= limit:
            end += 1
        yield order[start:end]
        start = end
