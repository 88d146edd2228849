"""A BERT sentence encoder's ONNX graph, built from its safetensors weights with the ``onnx`` helper API.

Measured reason for a hand-built graph: ``torch.onnx.export`` was the only other route, and torch from
PyPI pulls its CUDA libraries: README command 1 took 11 min 15 s on a fresh machine and put ~5 GB on disk
(torch 1.2 GB, nvidia libraries 3.0 GB, triton 1.0 GB) for a model that runs on ONNX Runtime. This module
needs only numpy, safetensors and onnx, so the default install carries no torch (docs/benchmarks.md,
"Install"). The graph is the textbook BERT encoder (HF ``BertModel``, absolute positions, exact GELU,
post-layer-norm) followed by sentence-transformers' mean pooling and L2 normalisation, the stack of
all-MiniLM-L6-v2; ``onnx_export`` verifies its vectors before keeping it.

Invariants:
- inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, [batch, tokens]); output 0
  ``embedding`` (float32, [batch, dim], unit length): the same contract as the old torch export, so the
  stored vectors do not change; output 1 ``token_states`` (float32, [batch, tokens, dim]): the final
  LayerNorm's output, the last hidden state the pooling reads (the same tensor, so a text's token states
  come from its vector's own pass; late interaction, ``embedding.states``), a padded position's row
  meaningless;
- a padded position (mask 0) never reaches a real token's vector: it is masked out of attention with the
  most negative float32 (as HF BERT does) and out of the pooling, so padding a batch changes no vector;
- anything that is not that architecture raises ``UnsupportedModel`` before a graph is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BertConfig", "UnsupportedModel", "build_graph"]

_OPSET = 17  # LayerNormalization is an operator from 17 on; ONNX Runtime >= 1.14 runs it fused


class UnsupportedModel(ValueError):
    """The model directory is not a BERT encoder with mean pooling that this builder reproduces."""


class BertConfig:
    """The few fields of a model directory's ``config.json`` and sentence-transformers files the graph needs."""

    def __init__(self, model_dir: Path) -> None:
        try:
            config = json.loads((model_dir / "config.json").read_text())
            modules = json.loads((model_dir / "modules.json").read_text())
            kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
            pooling = json.loads((model_dir / modules[1]["path"] / "config.json").read_text())
            st_config = json.loads((model_dir / "sentence_bert_config.json").read_text())
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise UnsupportedModel(f"{model_dir} is not a local sentence-transformers model: {exc}") from exc
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            raise UnsupportedModel(f"unsupported module stack {kinds}")
        modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True)
        if modes != ["pooling_mode_mean_tokens"]:
            raise UnsupportedModel(f"only mean pooling is built, not {modes}")
        checks = {
            "model_type": (config.get("model_type"), "bert"),
            "hidden_act": (config.get("hidden_act"), "gelu"),
            "position_embedding_type": (config.get("position_embedding_type", "absolute"), "absolute"),
        }
        for field, (got, want) in checks.items():
            if got != want:
                raise UnsupportedModel(f"config.json {field} is {got!r}, the builder reproduces {want!r} only")
        if not (model_dir / "tokenizer.json").is_file():
            raise UnsupportedModel("the model has no tokenizer.json (a fast tokenizer)")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.max_seq_length = min(int(st_config["max_seq_length"]), int(config["max_position_embeddings"]))
        if self.hidden % self.heads:
            raise UnsupportedModel(f"hidden size {self.hidden} is not a multiple of {self.heads} heads")


def _weights(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    path = model_dir / "model.safetensors"
    if not path.is_file():
        raise UnsupportedModel(f"{model_dir} has no model.safetensors")
    # Some checkpoints keep BertModel's weights under "bert." (a BertFor... head saved whole).
    return {k.removeprefix("bert."): v for k, v in load_file(str(path)).items()}


class _Builder:
    """Accumulates nodes and initializers; every helper returns its output's name."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._n = 0

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        from onnx import helper

        self._n += 1
        out = f"{kind.lower()}_{self._n}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, key: str, *, transpose: bool = False) -> str:
        try:
            value = self.weights[key].astype(np.float32)
        except KeyError:
            raise UnsupportedModel(f"model.safetensors lacks {key}") from None
        return self.const(key, value.T if transpose else value)

    def dense(self, x: str, prefix: str) -> str:
        """x @ W^T + b, as torch's Linear: safetensors keeps W as [out, in]."""
        product = self.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True))
        return self.op("Add", product, self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        scale, bias = self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)


def build_graph(model_dir: Path) -> tuple[bytes, BertConfig]:
    """The serialized ONNX model of ``model_dir``'s encoder with pooling and normalisation, and its config."""
    import onnx
    from onnx import TensorProto, helper

    config = BertConfig(model_dir)
    b = _Builder(_weights(model_dir))
    head = config.hidden // config.heads

    # Embeddings: word + absolute position (0..tokens-1) + token type, then LayerNorm.
    tokens = b.op("Shape", "input_ids", start=1, end=2)  # [tokens], 1-D as Slice wants it
    zero = b.const("zero_i", np.array([0], np.int64))
    words = b.op("Gather", b.weight("embeddings.word_embeddings.weight"), "input_ids")
    where = b.op("Slice", b.weight("embeddings.position_embeddings.weight"), zero, tokens, zero)  # rows 0..tokens-1
    types = b.op("Gather", b.weight("embeddings.token_type_embeddings.weight"), "token_type_ids")
    x = b.layer_norm(b.op("Add", b.op("Add", words, where), types), "embeddings.LayerNorm", config.eps)

    # Attention bias [batch, 1, 1, tokens]: 0 for a token, the most negative float32 for padding.
    mask = b.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    hidden_mask = b.op("Sub", b.const("one_f", np.array(1.0, np.float32)), mask)
    lowest = b.const("lowest_f", np.array(np.finfo(np.float32).min, np.float32))
    bias = b.op("Unsqueeze", b.op("Mul", hidden_mask, lowest), b.const("axes_1_2", np.array([1, 2], np.int64)))
    split_heads = b.const("split_heads", np.array([0, 0, config.heads, head], np.int64))
    join_heads = b.const("join_heads", np.array([0, 0, config.hidden], np.int64))
    scale = b.const("scale_f", np.array(1.0 / np.sqrt(head), np.float32))
    half = b.const("half_f", np.array(0.5, np.float32))
    root2 = b.const("sqrt2_f", np.array(np.sqrt(2.0), np.float32))

    for i in range(config.layers):
        p = f"encoder.layer.{i}"

        def heads(name: str, perm: list[int], x: str = x, p: str = p) -> str:
            projected = b.dense(x, f"{p}.attention.self.{name}")
            return b.op("Transpose", b.op("Reshape", projected, split_heads), perm=perm)

        q, k, v = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
        scores = b.op("Add", b.op("Mul", b.op("MatMul", q, k), scale), bias)
        context = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
        context = b.op("Reshape", b.op("Transpose", context, perm=[0, 2, 1, 3]), join_heads)
        attended = b.dense(context, f"{p}.attention.output.dense")
        x = b.layer_norm(b.op("Add", attended, x), f"{p}.attention.output.LayerNorm", config.eps)
        inner = b.dense(x, f"{p}.intermediate.dense")
        # Exact GELU, as HF's "gelu": 0.5 * x * (1 + erf(x / sqrt 2)).
        erf = b.op("Add", b.op("Erf", b.op("Div", inner, root2)), "one_f")
        gelu = b.op("Mul", b.op("Mul", inner, half), erf)
        out = b.dense(gelu, f"{p}.output.dense")
        x = b.layer_norm(b.op("Add", out, x), f"{p}.output.LayerNorm", config.eps)

    # Mean over real tokens (a row of padding only would divide by 1e-9, as sentence-transformers clamps),
    # then L2 normalisation with torch's eps.
    token_mask = b.op("Unsqueeze", mask, b.const("axis_2", np.array([2], np.int64)))
    axis_1 = b.const("axis_1", np.array([1], np.int64))
    summed = b.op("ReduceSum", b.op("Mul", x, token_mask), axis_1, keepdims=0)
    counts = b.op(
        "Max", b.op("ReduceSum", token_mask, axis_1, keepdims=0), b.const("tiny_f", np.array(1e-9, np.float32))
    )
    pooled = b.op("Div", summed, counts)
    norm = b.op("ReduceL2", pooled, axes=[1], keepdims=1)  # axes an attribute until opset 18
    norm = b.op("Max", norm, b.const("eps_f", np.array(1e-12, np.float32)))
    b.nodes.append(helper.make_node("Div", [pooled, norm], ["embedding"]))
    b.nodes.append(helper.make_node("Identity", [x], ["token_states"]))

    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in _INPUTS]
    outputs = [
        helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", config.hidden]),
        helper.make_tensor_value_info("token_states", TensorProto.FLOAT, ["batch", "tokens", config.hidden]),
    ]
    graph = helper.make_graph(b.nodes, "engram_bert_mean_pooling", ints, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="engram")
    model.ir_version = 8  # readable by every ONNX Runtime the project allows (>= 1.18)
    onnx.checker.check_model(model)
    return model.SerializeToString(), config


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
