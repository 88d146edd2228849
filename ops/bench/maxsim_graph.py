"""Late interaction's query side and step, priced: the query's token states from the floor's ONNX pass, and the
MaxSim product over 40 candidates by the form their states are stored in.

``python ops/bench/maxsim_graph.py [--queries 200] [--datasets /work/shared/datasets]``

The shipped graph (``storage.embedding.bert_graph``) had one output, ``embedding``; the last hidden state is
its final ``LayerNormalization``'s output, before the pooling. ``two_outputs`` added that tensor as a second
output of the exported model, as format 2 of the export now ships it (``token_states``); it checks on the dev questions
(conv-26, conv-41) that the vector is unchanged and that the states are ``transformers``' ``last_hidden_state``
(if it is installed). It then times one query's encoding, vector only (as the floor runs it) against vector and
states with the ``words`` mask from the tokenizer's word ids and offsets, each normalized (``time.process_time``,
alternated, one thread, medians). ``step`` times the MaxSim of 12 float32 query tokens against 40 synthetic
candidates of the measured sizes stored as float32, int8 with a scale per token, or 1-bit signs. No store,
no LLM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engram_api.storage.embedding.embedder import Embedder, _resolve
from engram_api.storage.embedding.encoders import _feed
from engram_api.storage.embedding.onnx_export import artifacts_for

MODEL = "all-MiniLM-L6-v2"


def two_outputs(embedder: Embedder) -> tuple[Any, Any, Any]:
    """The exported graph run for its vector only (output 0, as the floor runs it), the same graph run for
    both outputs (the vector and the token states), and the runtime's tokenizer (truncation as the
    encoder's, no padding)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    embedder.encode(["warm"])  # exports the graph if the cache has none
    artifacts = artifacts_for(embedder.cache_dir, embedder.model_name, _resolve(embedder.model_name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(artifacts.model), options, providers=["CPUExecutionProvider"])
    shipped, both = _Only(session, ["embedding"]), _Only(session, None)
    tokenizer = Tokenizer.from_file(str(artifacts.tokenizer))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=int(artifacts.read_meta()["max_seq_length"]))
    return shipped, both, tokenizer


class _Only:
    """An ONNX Runtime session whose ``run`` fetches only ``names`` (every output if None)."""

    def __init__(self, session: Any, names: list[str] | None) -> None:
        self.session, self.names = session, names

    def run(self, _: None, feed: dict[str, Any]) -> Any:
        return self.session.run(self.names, feed)


def query_states(both: Any, tokenizer: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
    """One query's vector and its ``words`` tokens' states (no special tokens, no punctuation), normalized."""
    enc = tokenizer.encode(text)
    vec, states = both.run(None, _feed([enc]))
    words = [
        w is not None and any(c.isalnum() for c in text[s:e])
        for w, (s, e) in zip(enc.word_ids, enc.offsets, strict=True)
    ]
    kept = states[0][np.array(words)]
    return vec[0], kept / np.linalg.norm(kept, axis=1, keepdims=True)


def checked(shipped: Any, both: Any, tokenizer: Any, texts: list[str]) -> str:
    """The second output's agreement: the vector against the shipped graph's, the states against transformers'."""
    vec = min(
        float(query_states(both, tokenizer, t)[0] @ shipped.run(None, _feed([tokenizer.encode(t)]))[0][0])
        for t in texts
    )
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        return f"vector min cosine {vec:.6f} (no transformers: states not compared)"
    torch.set_num_threads(1)
    path = _resolve(MODEL)
    hf_tokenizer, hf = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    worst = 1.0
    for t in texts:
        _, states = both.run(None, _feed([tokenizer.encode(t)]))
        with torch.no_grad():
            ref = hf(**hf_tokenizer([t], return_tensors="pt")).last_hidden_state[0].numpy()
        a, b = (s / np.linalg.norm(s, axis=1, keepdims=True) for s in (states[0], ref))
        worst = min(worst, float((a * b).sum(axis=1).min()))
    return f"vector min cosine {vec:.6f}, token states against transformers' min cosine {worst:.6f}"


def alternated(calls: dict[str, Callable[[Any], object]], inputs: list[Any]) -> dict[str, float]:
    """Each call's median process CPU in ms over ``inputs`` (each input given to every call, their order
    flipped every input)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r, given in enumerate(inputs):
        for name in list(calls)[:: 1 if r % 2 else -1]:
            t = time.process_time()
            calls[name](given)
            times[name].append((time.process_time() - t) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def step(tokens: int, rounds: int = 300) -> dict[str, float]:
    """MaxSim of 12 query tokens against 40 random candidates of ``tokens`` on average, by stored form."""
    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:
        v = rng.normal(size=(n, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    q = unit(12)
    docs = [unit(int(n)) for n in rng.integers(max(4, tokens // 2), tokens * 3 // 2, size=40)]
    scales = [np.abs(d).max(axis=1, keepdims=True) / 127 for d in docs]
    int8 = [(np.round(d / s).astype(np.int8), s.T.astype(np.float16)) for d, s in zip(docs, scales, strict=True)]
    signs = [np.packbits(d >= 0, axis=1) for d in docs]
    return alternated(
        {
            "float32": lambda _: [float((q @ d.T).max(1).mean()) for d in docs],
            "int8": lambda _: [float(((q @ d.T.astype(np.float32)) * s).max(1).mean()) for d, s in int8],
            "sign": lambda _: [
                float((q @ (np.unpackbits(b, axis=1).astype(np.float32) * 2 - 1).T).max(1).mean()) for b in signs
            ],
        },
        [None] * rounds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200, help="dev questions timed (each encoded 3 times each way)")
    parser.add_argument("--datasets", type=Path, default=Path("/work/shared/datasets"))
    args = parser.parse_args()
    data = json.loads((args.datasets / "locomo" / "locomo_dev5.json").read_text())
    texts = [str(qa["question"]) for c in data if c["sample_id"] in ("conv-26", "conv-41") for qa in c["qa"]]
    texts = texts[: args.queries]
    shipped, both, tokenizer = two_outputs(Embedder(model=MODEL, backend="onnx", threads=1))
    print(f"second output: {checked(shipped, both, tokenizer, texts[:50])}")
    calls = {
        "vector only": lambda t: shipped.run(None, _feed([tokenizer.encode(t)])),
        "vector + token states": lambda t: query_states(both, tokenizer, t),
    }
    alternated(calls, texts[:20])  # warm both sessions
    timed = alternated(calls, texts * 3)
    one, two = timed["vector only"], timed["vector + token states"]
    print(
        f"a query's encoding, {len(texts)} dev questions x 3, alternated, process CPU medians, load "
        f"{os.getloadavg()[0]:.1f}: vector only {one:.3f} ms, with token states {two:.3f} ms "
        f"(+{two - one:.3f} ms, {two / one:.3f}x)"
    )
    for label, tokens in (("own", 27), ("words", 57)):
        forms = step(tokens)
        print(
            f"MaxSim over 40 candidates of ~{tokens} tokens ({label}), median of 300, load "
            f"{os.getloadavg()[0]:.1f}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in forms.items())
        )


if __name__ == "__main__":
    main()
