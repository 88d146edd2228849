"""Export a sentence encoder to ONNX once, verified before it is kept, for the runtime encoder.

The graph is built from the model's safetensors weights by ``bert_graph`` (no torch: why, measured, is in
that module's docstring). Before the export is kept its vectors are compared with a reference:
- the committed reference vectors of the bundled MiniLM (``minilm_reference.json``, made by
  sentence-transformers on torch; ``tests/test_embedder.py`` holds them equal to torch's where torch is
  installed), when the weights' sha256 is theirs: exporting the bundled model never imports torch;
- otherwise sentence-transformers on torch, when ``engram[torch]`` is installed;
- otherwise nothing can vouch for the graph, and the export is rejected.

Invariants:
- only BERT encoders with mean pooling (-> Normalize) are exported: pooling and L2 normalisation are inside
  the ONNX graph, so the runtime side needs no torch at all;
- an export is kept only when every probe sentence's ONNX vector has cosine >= ``MIN_COSINE`` with the
  reference vector; otherwise ``ExportRejected`` is raised and the caller stays on torch (or fails);
- files are written to a temporary name and renamed, so concurrent exporters (several worker processes
  starting together) never leave a half-written model; the last rename wins with identical content;
- the graph's inputs and its output 0 are those of the torch export it replaced, so stored vectors need no
  reindex; ``_FORMAT`` 2 added output 1, the token states (``bert_graph``), so an export of format 1 (one
  output) is not read: the runtime exports again, once per machine, under a new name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MIN_COSINE", "PROBES", "ExportRejected", "OnnxArtifacts", "artifacts_for", "export", "weights_sha256"]

MIN_COSINE = 0.9999
_FORMAT = "engram-onnx-2"  # bump when the exported graph's inputs/outputs change
_REFERENCE = Path(__file__).with_name("minilm_reference.json")
PROBES = [
    "I just moved from Tampa to Austin.",
    "where does the user live?",
    "My brother Alex works at Amazon as an engineer in Seattle and loves hiking in the Cascades.",
    "x",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful!",
    "Quarterly revenue grew 12% year over year, driven by the cloud segment. " * 6,
]


class ExportRejected(RuntimeError):
    """The model cannot be exported faithfully (unsupported architecture, vectors drift, no reference)."""


class OnnxArtifacts:
    """Where one model's exported files live: ``<key>.onnx``, ``<key>.tokenizer.json``, ``<key>.json``."""

    def __init__(self, cache_dir: Path, key: str) -> None:
        self.model = cache_dir / f"{key}.onnx"
        self.tokenizer = cache_dir / f"{key}.tokenizer.json"
        self.meta = cache_dir / f"{key}.json"

    def complete(self) -> bool:
        return self.model.is_file() and self.tokenizer.is_file() and self.meta.is_file()

    def read_meta(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.meta.read_text())
        return data


def artifacts_for(cache_dir: Path, model_name: str, resolved: str) -> OnnxArtifacts:
    """Files keyed by the model, its weights on disk (size + mtime, cheap) and the export format."""
    ident = [_FORMAT, model_name, resolved]
    local = Path(resolved)
    if local.is_dir():
        for weights in sorted(local.glob("*.safetensors")) + sorted(local.glob("*.bin")):
            st = weights.stat()
            ident.append(f"{weights.name}:{st.st_size}:{st.st_mtime_ns}")
    key = hashlib.sha256("\n".join(ident).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in model_name)[-48:]
    return OnnxArtifacts(cache_dir, f"{slug}-{key}")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def weights_sha256(model_dir: Path) -> str:
    digest = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _reference_vectors(model_dir: Path) -> tuple[np.ndarray, str]:
    """The probes' vectors the graph must reproduce, and what made them ("reference" or "torch")."""
    committed = json.loads(_REFERENCE.read_text())
    if committed["texts"] == PROBES and committed["weights_sha256"] == weights_sha256(model_dir):
        return np.asarray(committed["vectors"], dtype=np.float32), "reference"
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ExportRejected(
            "no reference vectors for these weights: install engram[torch] to verify the export against torch"
        ) from None
    model = SentenceTransformer(str(model_dir), device="cpu")
    want = model.encode(PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(want, dtype=np.float32), "torch"


def _encode(onnx_bytes: bytes, tokenizer_json: str, max_len: int, texts: list[str]) -> np.ndarray:
    """The graph's vectors, tokenized as the runtime encoder tokenizes (truncated to ``max_len``)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(texts)
    feed: dict[str, Any] = {
        name: np.array([getattr(e, field) for e in encodings], dtype=np.int64)
        for name, field in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids"))
    }
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(None, feed)[0]
    return out


def export(model_dir: Path, artifacts: OnnxArtifacts) -> None:
    """Build ``model_dir``'s graph, verify it and keep it; raise ``ExportRejected`` if unfit."""
    from engram_api.storage.embedding.bert_graph import UnsupportedModel, build_graph

    try:
        onnx_bytes, config = build_graph(model_dir)
    except UnsupportedModel as exc:
        raise ExportRejected(str(exc)) from exc
    tokenizer_json = (model_dir / "tokenizer.json").read_text()
    want, source = _reference_vectors(model_dir)
    got = _encode(onnx_bytes, tokenizer_json, config.max_seq_length, PROBES)
    worst = float((got * want).sum(axis=1).min())
    if worst < MIN_COSINE:
        raise ExportRejected(f"ONNX vectors drift from the {source} (min cosine {worst:.5f} < {MIN_COSINE})")

    artifacts.model.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": _FORMAT,
        "dim": int(got.shape[1]),
        "max_seq_length": config.max_seq_length,
        "min_cosine": worst,
        "verified_against": source,
    }
    _write_atomic(artifacts.tokenizer, tokenizer_json.encode())
    _write_atomic(artifacts.model, onnx_bytes)
    _write_atomic(artifacts.meta, json.dumps(meta).encode())  # written last: its presence means complete
