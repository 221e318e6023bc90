"""BM25 ranking over one subject's memories: the literal path, and half of the fused one.

Why BM25 and not a substring filter: a query is a question ("when did she
paint a sunrise?"), not a phrase that occurs verbatim. BM25 scores every record
by the rare words it shares with the query. Parameters are tuned for short
memories (one fact or one conversation turn): mild length normalization
(b=0.3), standard saturation (k1=1.2). Measured on LoCoMo: stopwords plus light
stemming lift evidence recall@10 from 0.57 to 0.61 over plain-token BM25.

`LexicalIndex` is the one object a shard holds: it adds and removes rows, scores a
query, and turns itself back into one CSR block (`arrays(keep)`: saving,
compacting). What it is made of lives apart: how terms and postings are stored
(postings.py, arrays: the statistics of a million records load without
re-tokenizing a single text), and BM25's statistics with the weights and caches
they give (bm25.py).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from .bm25 import Bm25Statistics
from .postings import CsrBlock, ForwardLists, InvertedLists, Vocabulary, csr

__all__ = ["LexicalIndex", "K1", "B"]

K1 = 1.2
B = 0.3
_EMPTY_F = np.zeros(0, dtype=np.float32)


class LexicalIndex:
    """Inverted index with BM25 scoring over rows 0..n-1 of one shard."""

    def __init__(self, k1: float = K1, b: float = B, arrays: Mapping[str, np.ndarray] | None = None,
                 vocab: list[str] | None = None) -> None:
        a = arrays or {}
        self.vocabulary = Vocabulary(vocab if vocab is not None else [])
        self.inverted = InvertedLists(CsrBlock.load(a, "post_off", "post_row", "post_tf"))
        self.forward = ForwardLists(CsrBlock.load(a, "fwd_off", "fwd_term", "fwd_tf"))
        self._n_rows = self.forward.n_base_rows
        df = np.diff(self.inverted.base.off).astype(np.int64)  # every base row is alive when loaded
        self.stats = Bm25Statistics(k1, b, df, np.array(a.get("doclen", _EMPTY_F), dtype=np.float64), self._n_rows)

    @property
    def n_alive(self) -> int:
        return self.stats.n_alive

    def lookup(self, terms: Iterable[str]) -> list[int]:
        """Ids of the distinct known terms, in query order (unknown terms match nothing)."""
        return self.vocabulary.lookup(terms)

    # -- changes ----------------------------------------------------------------------
    def add_many(self, start: int, docs: Sequence[Sequence[str]]) -> None:
        """Index each document's content terms as rows start, start+1, ... (rows are appended in order)."""
        assert start == self._n_rows, f"rows are appended in order: expected {self._n_rows}, got {start}"
        terms = [t for d in docs for t in d]
        ids = self.vocabulary.add(terms)  # new terms get ids in order of first use
        n_terms = max(len(self.vocabulary.terms), 1)
        self.stats.grow_terms(len(self.vocabulary.terms))
        lens = np.fromiter(map(len, docs), np.int64, len(docs))
        flat = np.fromiter(map(ids.__getitem__, terms), np.int64, len(terms))
        local = np.repeat(np.arange(len(docs), dtype=np.int64), lens)
        keys, tf = np.unique(local * n_terms + flat, return_counts=True)  # sorted by row, then term
        rows, tids = keys // n_terms, (keys % n_terms).astype(np.int32)
        tf = tf.astype(np.float32)
        self.forward.append(rows, tids, tf, len(docs))
        self.stats.add_rows(start, np.bincount(rows, weights=tf, minlength=len(docs)), tids)
        self.inverted.append(rows + start, tids, tf)
        self._n_rows += len(docs)

    def terms_of(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """A row's term ids and their counts (from the forward lists, never from the text)."""
        return self.forward.of(row)

    def remove(self, row: int) -> None:
        """Stop counting row `row` in the statistics; the caller masks it out of results."""
        self.stats.remove_row(row, self.forward.of(row)[0])

    # -- scoring ------------------------------------------------------------------------
    def idf(self, tid: int) -> float:
        """BM25+ style idf (never negative, so a common word cannot push a record down)."""
        return self.stats.idf(tid)

    def score(self, tids: Iterable[int], n_rows: int, weights: Mapping[int, float] | None = None) -> np.ndarray:
        """BM25 score of every row for the term ids (each distinct term counted once)."""
        out = np.zeros(n_rows, dtype=np.float64)
        for tid in dict.fromkeys(tids):
            got = self.weighted_postings(tid, n_rows, weights.get(tid, 1.0) if weights else 1.0)
            if got is not None:
                rows, sat, w = got
                out[rows] += w * sat
        return out

    def weighted_postings(self, tid: int, n_rows: int, weight: float = 1.0) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The rows below `n_rows` holding a term, their saturations and the term's weight (idf * `weight`).

        A row's score from the term is `w * sat` exactly as `score` adds it; None when
        no live row holds the term.
        """
        got = self.postings(tid, n_rows)
        if got is None:
            return None
        rows, tf = got
        return rows, self.stats.term_saturation(tid, rows, tf), self.stats.idf(tid) * weight

    def postings(self, tid: int, n_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows below `n_rows` holding a term (ascending) and its counts in them; None when no live row does."""
        if self.stats.n_alive <= 0 or self.stats.df[tid] <= 0:
            return None
        rows, tf = self.inverted.of(tid)
        if len(rows) and rows[-1] >= n_rows:
            keep = rows < n_rows
            rows, tf = rows[keep], tf[keep]
        return rows, tf

    def saturation(self, rows: np.ndarray, tf: np.ndarray) -> np.ndarray:
        """The saturations of some postings (rows and counts), each the float `score` weighs a row by (not cached)."""
        return self.stats.saturation(rows, tf)

    def saturation_bound(self, tid: int, n_rows: int) -> float:
        """At least the largest saturation among a term's postings below `n_rows` (cheap; cached while it holds)."""
        got = self.postings(tid, n_rows)
        if got is None:
            return 0.0
        return self.stats.saturation_bound(tid, got[1], n_rows)

    # -- as arrays ------------------------------------------------------------------------
    def arrays(self, keep: np.ndarray) -> tuple[dict[str, np.ndarray], list[str]]:
        """The rows `keep` (in order) as one fresh CSR block, with a vocabulary of their terms only."""
        lens, old_t, tf = self.forward.gather(keep)
        used, new_t = np.unique(old_t, return_inverse=True)
        new_t = new_t.astype(np.int32)
        vocab = [self.vocabulary.terms[i] for i in used.tolist()]
        rows = np.repeat(np.arange(len(keep), dtype=np.int32), lens)
        fwd_off = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(lens, out=fwd_off[1:])
        post_off, post_row, post_tf = csr(new_t, [rows, tf.astype(np.float32)], len(vocab))
        doclen = np.bincount(rows, weights=tf, minlength=len(keep)).astype(np.float32)
        return {"post_off": post_off, "post_row": post_row, "post_tf": post_tf, "fwd_off": fwd_off,
                "fwd_term": new_t, "fwd_tf": tf.astype(np.float32), "doclen": doclen}, vocab
