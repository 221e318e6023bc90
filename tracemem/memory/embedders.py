"""The embedder protocol and the built-in hashing embedder.

An embedder turns texts into L2-normalized float32 rows. Its `embedder_id`
names the vector space: vectors from two ids (or two dimensions) are not
comparable, so the store refuses to mix them. `caveat` is a human sentence
reported with every semantic search that ran on this embedder (None for real
models).
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from .errors import EmbedderMismatchError, MemoryInputError
from .text import terms

__all__ = ["Embedder", "HashingEmbedder", "HASHING_CAVEAT", "check_vectors"]

HASHING_CAVEAT = (
    "semantic search ran on the built-in hashing embedder: it matches shared words "
    "and word pieces, not meaning; configure a real embedder (e.g. MiniLMEmbedder, "
    "`make minilm`) for paraphrase-level recall"
)


@runtime_checkable
class Embedder(Protocol):
    """What the memory needs from an embedding model."""

    embedder_id: str
    dim: int
    # Optional attributes read with getattr(): caveat (str | None), lexical_weight
    # (share of BM25 in the fused score, default 0.5), min_similarity (cosine below
    # which a record sharing no query word is not a match, default 0.0).

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return float32 (len(texts), dim); rows should be L2-normalized."""
        ...


class HashingEmbedder:
    """Deterministic, offline, numpy-only embedder: signed feature hashing.

    Features are content words (stopwords dropped, light stemming), optionally
    word bigrams (off by default: they cost recall on LoCoMo), and character n-grams of each word (with boundary marks, so "paint" and
    "painting" share most of their pieces). Each feature is hashed with CRC32 to
    a column and a sign; counts are damped with log1p and the row L2-normalized.
    Same text, same vector, on every machine and every run.
    """

    caveat: str | None = HASHING_CAVEAT
    # Fusion tuning (read by search): a hashing vector is itself lexical, so BM25 leads;
    # below min_similarity a record that shares no query term is not a match.
    lexical_weight: float = 0.9
    min_similarity: float = 0.1

    def __init__(self, dim: int = 384, *, char_ngrams: tuple[int, int] = (3, 5),
                 bigram_weight: float = 0.0, char_weight: float = 1.0) -> None:
        if dim < 16:
            raise MemoryInputError(f"HashingEmbedder dim must be >= 16, got {dim}")
        self.dim = int(dim)
        self._lo, self._hi = char_ngrams
        self._bigram_weight = bigram_weight
        self._char_weight = char_weight
        # Every parameter changes the vector space, so every parameter is in the id.
        self.embedder_id = f"hashing-v1:d{self.dim}:c{self._lo}-{self._hi}:cw{char_weight:g}:bw{bigram_weight:g}"

    def _features(self, text: str) -> Counter[str]:
        toks = terms(text)
        feats: Counter[str] = Counter()
        for t in toks:
            feats["w:" + t] += 1.0
            marked = f"<{t}>"
            grams = [marked[i : i + n] for n in range(self._lo, self._hi + 1)
                     for i in range(len(marked) - n + 1)]
            if grams:
                share = self._char_weight / len(grams) ** 0.5
                for g in grams:
                    feats["c:" + g] += share
        if self._bigram_weight > 0:
            for a, b in zip(toks, toks[1:]):
                feats[f"b:{a} {b}"] += self._bigram_weight
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts as L2-normalized float32 rows (n, dim): same text, same vector, always."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat, count in self._features(text).items():
                h = zlib.crc32(feat.encode("utf-8"))
                sign = 1.0 if (h >> 31) & 1 else -1.0
                out[row, h % self.dim] += sign * np.log1p(count)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


def check_vectors(vectors: np.ndarray, *, dim: int, n: int | None = None, what: str = "embedding") -> np.ndarray:
    """Validate embedder output or a caller-supplied vector: shape, finiteness; L2-normalize.

    Zero rows (a text with no features) stay zero: they match nothing, which is honest.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise EmbedderMismatchError(
            f"{what} has shape {tuple(np.shape(vectors))}, expected (…, {dim}): vectors of a "
            f"different dimension cannot share an index; use the store's embedder (dim {dim})"
        )
    if n is not None and arr.shape[0] != n:
        raise EmbedderMismatchError(f"{what}: embedder returned {arr.shape[0]} rows for {n} texts")
    if not np.isfinite(arr).all():
        raise MemoryInputError(f"{what} contains NaN or infinite values; refusing to index it")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return np.divide(arr, norms, out=np.zeros_like(arr), where=norms > 0)
