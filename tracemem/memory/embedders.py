"""The embedder protocol and the built-in hashing embedder.

An embedder turns texts into L2-normalized float32 rows. Its `embedder_id`
names the vector space: vectors from two ids (or two dimensions) are not
comparable, so the store refuses to mix them. `caveat` is a human sentence
reported with every semantic search that ran on this embedder (None for real
models).
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from typing import Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .errors import EmbedderMismatchError, MemoryInputError
from .text import term_tuple

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
        # caches of `embed` (per instance, bounded): term -> (feature ids, amounts); feature -> column, sign
        self._lock = threading.Lock()
        self._terms: dict[str, int] = {}  # term -> term id
        self._term_off: list[int] = []  # term id -> first entry in _feat_ids/_feat_amt
        self._term_len: list[int] = []  # term id -> number of entries
        self._feat_ids: list[int] = []
        self._feat_amt: list[float] = []
        self._fid: dict[str, int] = {}  # feature -> feature id
        self._cols: list[int] = []  # feature id -> column
        self._signs: list[float] = []  # feature id -> sign
        self._n_feat_entries = 0
        self._arrays: list[np.ndarray] = []  # the tables above as arrays, with room to grow (see _tables)
        self._used: list[int] = []  # how much of each array is filled
        self._cache_limit = 200_000

    def features(self, text: str) -> Counter[str]:
        """The weighted features of one text (the reference definition; `embed` computes the same in bulk)."""
        toks = term_tuple(text)
        feats: Counter[str] = Counter()
        for t in toks:
            for feat, amount in self._term_features(t):
                feats[feat] += amount
        if self._bigram_weight > 0:
            for a, b in zip(toks, toks[1:]):
                feats[f"b:{a} {b}"] += self._bigram_weight
        return feats

    def _term_features(self, term: str) -> list[tuple[str, float]]:
        """One occurrence of a term: its word feature, then each character n-gram with its share."""
        out = [("w:" + term, 1.0)]
        marked = f"<{term}>"
        grams = [marked[i : i + n] for n in range(self._lo, self._hi + 1) for i in range(len(marked) - n + 1)]
        if grams:
            share = self._char_weight / len(grams) ** 0.5
            out += [("c:" + g, share) for g in grams]
        return out

    def _feature_id(self, feat: str) -> int:
        fid = self._fid.get(feat)
        if fid is None:
            h = zlib.crc32(feat.encode("utf-8"))
            fid = self._fid[feat] = len(self._fid)
            self._cols.append(h % self.dim)
            self._signs.append(1.0 if (h >> 31) & 1 else -1.0)
        return fid

    def _term_id(self, term: str) -> int:
        """Register a term's features in the flat tables (feature ids and amounts, by term id)."""
        feats = self._term_features(term)
        tid = self._terms[term] = len(self._terms)
        self._term_off.append(self._n_feat_entries)
        self._n_feat_entries += len(feats)
        self._term_len.append(len(feats))
        self._feat_ids.extend(self._feature_id(f) for f, _ in feats)
        self._feat_amt.extend(a for _, a in feats)
        return tid

    def _tables(self) -> tuple[np.ndarray, ...]:
        """The flat tables as arrays: the lists hold only entries added since the last call."""
        names = ("_term_off", "_term_len", "_feat_ids", "_feat_amt", "_cols", "_signs")
        kinds = (np.int64, np.int64, np.int64, np.float64, np.int64, np.float64)
        if len(self._arrays) != len(names):  # new, or emptied by the cache bound
            self._arrays[:] = [np.zeros(1024, k) for k in kinds]
            self._used = [0] * len(names)
        for i, name in enumerate(names):
            new = getattr(self, name)
            if new:  # append in place, doubling the capacity when full (no copy of the whole table per batch)
                end = self._used[i] + len(new)
                if end > len(self._arrays[i]):
                    grown = np.zeros(max(end, 2 * len(self._arrays[i])), kinds[i])
                    grown[: self._used[i]] = self._arrays[i][: self._used[i]]
                    self._arrays[i] = grown
                self._arrays[i][self._used[i] : end] = np.asarray(new, kinds[i])
                self._used[i] = end
                new.clear()
        return tuple(a[:u] for a, u in zip(self._arrays, self._used))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts as L2-normalized float32 rows (n, dim): same text, same vector, always.

        Bulk form of `features`: each term's features are hashed once and kept in flat
        tables; a batch gathers them with numpy, sums the counts per (text, feature),
        damps them with log1p and scatters them into the rows.
        """
        self._bound_cache()
        return self._embed(texts)

    def embed_chunks(self, texts: Sequence[str], size: int) -> Iterator[np.ndarray]:
        """`embed(texts)` in consecutive blocks of `size` rows, each made when asked for: the
        same vectors as one call (rows are independent, and the caches are bounded once, up
        front, as one call does), so a caller can write one block while the next is made."""
        self._bound_cache()
        for start in range(0, len(texts), max(1, size)):
            yield self._embed(texts[start : start + size])

    def _bound_cache(self) -> None:
        with self._lock:
            if len(self._terms) > self._cache_limit:  # bound the memory of a long-lived embedder
                for table in (self._terms, self._fid, self._cols, self._signs, self._term_off, self._term_len,
                              self._feat_ids, self._feat_amt, self._arrays):
                    table.clear()
                self._n_feat_entries = 0

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        with self._lock:
            known, register = self._terms, self._term_id
            docs = [term_tuple(t) for t in texts]
            flat = [t for d in docs for t in d]
            for t in dict.fromkeys([t for t in flat if t not in known]):  # new terms, in order of first use
                register(t)
            tok = np.fromiter(map(known.__getitem__, flat), np.int64, len(flat))
            n_tok = np.fromiter(map(len, docs), np.int64, n)
            extra_rows: list[int] = []
            extra_fids: list[int] = []
            if self._bigram_weight > 0:
                for row, toks in enumerate(docs):
                    for a, b in zip(toks, toks[1:]):
                        extra_rows.append(row)
                        extra_fids.append(self._feature_id(f"b:{a} {b}"))
            off, size, feat_ids, feat_amt, cols, signs = self._tables()
        per_tok = size[tok]
        total = int(per_tok.sum())
        out = np.zeros(n * self.dim, dtype=np.float64)
        if total or extra_fids:
            first = np.repeat(off[tok] - (np.cumsum(per_tok) - per_tok), per_tok)
            gather = first + np.arange(total, dtype=np.int64)
            tok_row = np.repeat(np.arange(n, dtype=np.int64), n_tok)
            rows = np.concatenate([np.repeat(tok_row, per_tok), np.asarray(extra_rows, np.int64)])
            fid = np.concatenate([feat_ids[gather], np.asarray(extra_fids, np.int64)])
            amount = np.concatenate([feat_amt[gather], np.full(len(extra_fids), float(self._bigram_weight))])
            keys, counts = _sum_by_key(rows * len(cols) + fid, amount)  # one count per (text, feature)
            feat = keys % len(cols)
            out = np.bincount((keys // len(cols)) * self.dim + cols[feat], weights=signs[feat] * np.log1p(counts),
                              minlength=n * self.dim)
        out32 = out.reshape(n, self.dim).astype(np.float32)
        norms = np.linalg.norm(out32, axis=1, keepdims=True)
        np.divide(out32, norms, out=out32, where=norms > 0)
        return out32


def _sum_by_key(keys: np.ndarray, amounts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys, ascending, and the sum of each key's amounts, added in input order.

    What `np.unique(keys, return_inverse=True)` and `np.bincount(inverse, weights=amounts)`
    give, bit for bit, for about half the time: each key carries its position in its low
    bits, so one plain sort (no argsort) orders the keys and, within a key, the amounts
    as they came.
    """
    n = len(keys)
    shift = max(n - 1, 1).bit_length()
    if n == 0 or int(keys.max()) >= 1 << (62 - shift):  # the key and the position must share 63 bits
        uniq, inverse = np.unique(keys, return_inverse=True)
        return uniq, np.bincount(inverse, weights=amounts)
    packed = np.sort((keys << shift) | np.arange(n, dtype=np.int64))
    order = packed & ((1 << shift) - 1)
    packed >>= shift
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(packed[1:], packed[:-1], out=first[1:])
    group = np.cumsum(first) - 1
    return packed[first], np.bincount(group, weights=amounts[order])


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
