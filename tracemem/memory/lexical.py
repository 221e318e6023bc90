"""BM25 ranking over one subject's memories: the literal path, and half of the fused one.

Why BM25 and not a substring filter: a query is a question ("when did she
paint a sunrise?"), not a phrase that occurs verbatim. BM25 scores every record
by the rare words it shares with the query. Parameters are tuned for short
memories (one fact or one conversation turn): mild length normalization
(b=0.3), standard saturation (k1=1.2). Measured on LoCoMo: stopwords plus light
stemming lift evidence recall@10 from 0.57 to 0.61 over plain-token BM25.

The index is incremental: appending a record touches only its terms; a
removed row keeps its postings but is masked out and no longer counts in the
document frequencies.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Mapping

import numpy as np

from .text import terms

__all__ = ["LexicalIndex", "K1", "B"]

K1 = 1.2
B = 0.3


class LexicalIndex:
    """Inverted index with BM25 scoring over rows 0..n-1 of one shard."""

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1, self.b = k1, b
        self._rows: dict[str, list[int]] = {}
        self._tfs: dict[str, list[int]] = {}
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._df: Counter[str] = Counter()
        self._len = np.zeros(64, dtype=np.float64)
        self._n_rows = 0
        self._n_alive = 0
        self._total_len = 0.0

    @property
    def n_alive(self) -> int:
        return self._n_alive

    def add(self, row: int, text: str) -> None:
        """Index `text` as row `row` (rows are appended in order)."""
        counts = Counter(terms(text))
        if row >= len(self._len):
            self._len = np.resize(self._len, max(row + 1, 2 * len(self._len)))
        doc_len = float(sum(counts.values()))
        self._len[row] = doc_len
        self._n_rows = max(self._n_rows, row + 1)
        self._n_alive += 1
        self._total_len += doc_len
        for term, tf in counts.items():
            self._rows.setdefault(term, []).append(row)
            self._tfs.setdefault(term, []).append(tf)
            self._cache.pop(term, None)
            self._df[term] += 1

    def remove(self, row: int, text: str) -> None:
        """Stop counting row `row` in the statistics; the caller masks it out of results."""
        counts = Counter(terms(text))
        self._n_alive -= 1
        self._total_len -= self._len[row]
        for term in counts:
            self._df[term] -= 1
            if self._df[term] <= 0:
                del self._df[term]

    def idf(self, term: str) -> float:
        """BM25+ style idf (never negative, so a common word cannot push a record down)."""
        df = self._df.get(term, 0)
        return math.log(1.0 + (self._n_alive - df + 0.5) / (df + 0.5))

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        hit = self._cache.get(term)
        if hit is None:
            rows = self._rows.get(term)
            if not rows:
                return None
            hit = (np.asarray(rows, dtype=np.int64), np.asarray(self._tfs[term], dtype=np.float64))
            self._cache[term] = hit
        return hit

    def score(self, query_terms: Iterable[str], n_rows: int, weights: Mapping[str, float] | None = None) -> np.ndarray:
        """BM25 score of every row for `query_terms` (each distinct term counted once)."""
        out = np.zeros(n_rows, dtype=np.float64)
        if self._n_alive <= 0:
            return out
        avg = max(self._total_len / self._n_alive, 1e-9)
        k1, b = self.k1, self.b
        for term in dict.fromkeys(query_terms):
            if term not in self._df:
                continue
            post = self._postings(term)
            if post is None:
                continue
            rows, tf = post
            keep = rows < n_rows
            rows, tf = rows[keep], tf[keep]
            w = self.idf(term) * (weights.get(term, 1.0) if weights else 1.0)
            norm = tf + k1 * (1.0 - b + b * self._len[rows] / avg)
            out[rows] += w * tf * (k1 + 1.0) / norm
        return out
