"""Export a sentence-transformers model to ONNX once, verified against torch, for the fast encoder.

Why our own export: ONNX Runtime encodes the bundled MiniLM ~2-2.5x faster than sentence-transformers on
torch for single queries on one thread (measured: ops/bench/bench_encoder.py), with the same vectors. The
library's own route, ``sentence-transformers[onnx]``, cannot be installed beside sentence-transformers 6.x
and transformers 5 (its Optimum dependency pins transformers < 5), so we export with ``torch.onnx.export``.

Invariants:
- only models built as Transformer -> mean Pooling (-> Normalize) are exported: pooling and L2
  normalisation are inside the ONNX graph, so the runtime side needs no torch at all;
- an export is kept only when every probe sentence's ONNX vector has cosine >= ``MIN_COSINE`` with the
  torch vector; otherwise ``ExportRejected`` is raised and the caller stays on torch;
- files are written to a temporary name and renamed, so concurrent exporters (several worker processes
  starting together) never leave a half-written model; the last rename wins with identical content.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MIN_COSINE", "ExportRejected", "OnnxArtifacts", "artifacts_for", "export"]

MIN_COSINE = 0.9999
_FORMAT = "engram-onnx-1"  # bump when the exported graph's inputs/outputs change
_PROBES = [
    "I just moved from Tampa to Austin.",
    "where does the user live?",
    "My brother Alex works at Amazon as an engineer in Seattle and loves hiking in the Cascades.",
    "x",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful!",
    "Quarterly revenue grew 12% year over year, driven by the cloud segment. " * 6,
]


class ExportRejected(RuntimeError):
    """The model cannot be exported faithfully (unsupported pooling, vectors drift from torch)."""


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


def export(st_model: Any, artifacts: OnnxArtifacts) -> None:
    """Export ``st_model`` (a loaded SentenceTransformer) and verify it; raise ``ExportRejected`` if unfit."""
    import io

    import onnxruntime as ort
    import torch

    modules = list(st_model)
    names = [type(m).__name__ for m in modules]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ExportRejected(f"unsupported module stack {names}")
    if modules[1].get_config_dict().get("pooling_mode") != "mean":
        raise ExportRejected("only mean pooling is exported")
    backend = getattr(st_model.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportRejected("the model has no fast tokenizer")

    class _Encoder(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    max_len = int(st_model.max_seq_length)
    encoder = _Encoder(modules[0].auto_model).eval()
    sample = st_model.tokenizer(_PROBES[:2], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    if any(k not in sample for k in inputs):
        raise ExportRejected("the tokenizer does not produce BERT-style inputs")
    buffer = io.BytesIO()
    # The exporter warns about traced Python branches in BERT's masking code; the verification below is
    # what decides whether the graph is faithful.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            encoder,
            tuple(sample[k] for k in inputs),
            buffer,
            input_names=list(inputs),
            output_names=["embedding"],
            dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in inputs}, "embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,  # the TorchScript exporter needs no onnxscript and handles BERT's dynamic shapes
        )
    onnx_bytes = buffer.getvalue()

    # Verify before keeping: same tokenizer settings the runtime side will use.
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    enc = st_model.tokenizer(_PROBES, padding=True, truncation=True, max_length=max_len, return_tensors="np")
    got = session.run(None, {k: enc[k].astype(np.int64) for k in inputs})[0]
    want = st_model.encode(_PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    worst = float((got * want).sum(axis=1).min())
    if worst < MIN_COSINE:
        raise ExportRejected(f"ONNX vectors drift from torch (min cosine {worst:.5f} < {MIN_COSINE})")

    artifacts.model.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": _FORMAT, "dim": int(got.shape[1]), "max_seq_length": max_len, "min_cosine": worst}
    _write_atomic(artifacts.tokenizer, backend.to_str().encode())
    _write_atomic(artifacts.model, onnx_bytes)
    _write_atomic(artifacts.meta, json.dumps(meta).encode())  # written last: its presence means complete
