"""A BERT sentence encoder (mean pooling, L2 norm) run by ONNX Runtime, built from its weights in memory.

Why: the numpy forward pass in minilm.py spends a query's time in numpy's BLAS,
whose thread pool is process-wide: on a shared 2-core machine its threads fight
every other process, and a library may not change its size for the host.
ONNX Runtime takes its thread count per session (`intra_op_num_threads`), so
one embedder can run on one thread without touching process settings, and its
kernels are faster for the short inputs a query is (measured in bench/memory.py).

No model file is shipped or downloaded: the graph (about 100 kB: the nodes of
the encoder, mean pooling and normalization) is written here with the `onnx`
package, and the weights already in memory are handed to the session as
external initializers, so nothing is copied into a protobuf. The graph mirrors
minilm.py's `_forward` op for op; tests check that both give the same vectors.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["BertSession", "runtime_available"]

_OPSET = 18  # LayerNormalization (17) and ReduceL2 with axes as an input (18)
_INLINE_MAX = 1024  # constants up to this many values live in the graph; larger ones are external initializers


def runtime_available() -> bool:
    """Whether `onnxruntime` and `onnx` can be imported (the `minilm` extra brings both)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


class _Graph:
    """Collects the nodes and constants of one graph; names are unique by construction."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.external: dict[str, np.ndarray] = {}
        self._names: set[str] = set()
        self._count = 0

    def const(self, name: str, value: Any) -> str:
        if name in self._names:
            return name
        self._names.add(name)
        arr = np.ascontiguousarray(value)
        if arr.size <= _INLINE_MAX:
            self.inits.append(self.numpy_helper.from_array(arr, name))
            return name
        from onnx import TensorProto

        tensor = TensorProto(name=name, data_type=self.helper.np_dtype_to_tensor_dtype(arr.dtype),
                             dims=list(arr.shape), data_location=TensorProto.EXTERNAL)
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "in-memory"  # never read: the session gets the array itself
        self.inits.append(tensor)
        self.external[name] = arr
        return name

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append(self.helper.make_node(kind, inputs, [out], **attrs))
        return out


def _encoder(g: _Graph, w: Mapping[str, np.ndarray], layers: int, heads: int, dim: int, eps: float) -> str:
    """Embeddings, then `layers` encoder blocks (what minilm.py's `_forward` computes); returns the hidden states."""
    f32 = np.float32
    x = g.op("Gather", [g.const("word_emb", w["embeddings.word_embeddings.weight"]), "input_ids"], axis=0)
    length = g.op("Shape", ["input_ids"], start=1, end=2)  # (t,), one value
    positions = g.op("Slice", [g.const("pos_emb", w["embeddings.position_embeddings.weight"]),
                               g.const("zero", np.array([0], np.int64)), length, g.const("axis0", np.array([0], np.int64))])
    x = g.op("Add", [x, positions])
    x = g.op("Add", [x, g.const("type_emb", w["embeddings.token_type_embeddings.weight"][0])])

    def norm(v: str, p: str) -> str:
        return g.op("LayerNormalization", [v, g.const(p + ".w", w[p + ".weight"]), g.const(p + ".b", w[p + ".bias"])],
                    axis=-1, epsilon=eps)

    x = norm(x, "embeddings.LayerNorm")
    mask = g.op("Cast", ["attention_mask"], to=1)  # float
    bias = g.op("Mul", [g.op("Sub", [g.const("one", np.array(1.0, f32)), mask]), g.const("big", np.array(-1e9, f32))])
    bias = g.op("Unsqueeze", [bias, g.const("ax12", np.array([1, 2], np.int64))])  # (n, 1, 1, t)
    d = dim // heads
    split = g.const("split", np.array([0, 0, heads, d], np.int64))
    merge = g.const("merge", np.array([0, 0, dim], np.int64))
    scale = g.const("scale", np.array(1.0 / np.sqrt(d), f32))
    for i in range(layers):
        p = f"encoder.layer.{i}."

        def lin(v: str, name: str) -> str:
            weight = g.const(p + name + ".wT", np.ascontiguousarray(w[p + name + ".weight"].T))
            return g.op("Add", [g.op("MatMul", [v, weight]), g.const(p + name + ".b", w[p + name + ".bias"])])

        def by_head(v: str, perm: list[int]) -> str:
            return g.op("Transpose", [g.op("Reshape", [v, split])], perm=perm)

        q = by_head(lin(x, "attention.self.query"), [0, 2, 1, 3])
        k = by_head(lin(x, "attention.self.key"), [0, 2, 3, 1])
        v = by_head(lin(x, "attention.self.value"), [0, 2, 1, 3])
        att = g.op("Softmax", [g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])], axis=-1)
        ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [att, v])], perm=[0, 2, 1, 3]), merge])
        x = norm(g.op("Add", [x, lin(ctx, "attention.output.dense")]), p + "attention.output.LayerNorm")
        h = lin(x, "intermediate.dense")  # GELU with erf, as BERT defines it
        erf = g.op("Erf", [g.op("Mul", [h, g.const("rsqrt2", np.array(0.7071067811865476, f32))])])
        h = g.op("Mul", [g.op("Mul", [h, g.const("half", np.array(0.5, f32))]), g.op("Add", [erf, "one"])])
        x = norm(g.op("Add", [x, lin(h, "output.dense")]), p + "output.LayerNorm")
    return x


def _pooled(g: _Graph, x: str) -> str:
    """Mean over the unmasked tokens, then L2 normalization."""
    mask = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=1), g.const("ax2", np.array([2], np.int64))])
    ax1 = g.const("ax1", np.array([1], np.int64))
    total = g.op("ReduceSum", [g.op("Mul", [x, mask]), ax1], keepdims=0)
    count = g.op("ReduceSum", [mask, ax1], keepdims=0)
    mean = g.op("Div", [total, g.op("Max", [count, g.const("eps9", np.array(1e-9, np.float32))])])
    length = g.op("ReduceL2", [mean, g.const("axlast", np.array([-1], np.int64))], keepdims=1)
    return g.op("Div", [mean, g.op("Max", [length, g.const("eps12", np.array(1e-12, np.float32))])])


class BertSession:
    """One ONNX Runtime session of a BERT encoder; `run(ids, mask)` gives L2-normalized (n, dim) float32 rows.

    `threads` is the session's own intra-op thread count (1 by default: a library shares its host's cores);
    the process's settings are left alone. A session may be used from several threads at once.
    """

    def __init__(self, weights: Mapping[str, np.ndarray], *, layers: int, heads: int, dim: int,
                 threads: int = 1, eps: float = 1e-12) -> None:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        g = _Graph()
        out = _pooled(g, _encoder(g, weights, layers, heads, dim, eps))
        g.nodes.append(helper.make_node("Identity", [out], ["embedding"]))
        graph = helper.make_graph(
            g.nodes, "sentence_encoder",
            [helper.make_tensor_value_info(name, TensorProto.INT64, ["n", "t"]) for name in ("input_ids", "attention_mask")],
            [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["n", dim])], g.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
        model.ir_version = 8  # what every onnxruntime >= 1.14 reads
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: warnings would go to the host's stderr
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in g.external.values()]  # the session reads these
        options.add_external_initializers(list(g.external), self._values)
        self._session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = self._session.run(["embedding"], {"input_ids": ids.astype(np.int64, copy=False),
                                                "attention_mask": mask.astype(np.int64, copy=False)})[0]
        return np.asarray(out, dtype=np.float32)
