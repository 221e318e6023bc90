"""BM25's statistics of one shard (document frequencies, record lengths, live rows) and the weights they give.

Why apart from the postings: these numbers change with every record added or removed,
and what is derived from them (a term's idf, the saturation of its counts, the bound of
that saturation) is cached only while they hold. Keeping them in one object keeps each
cache beside the numbers its key is made of: the average length, and the count of a
term's postings.

A row's score from a term is `idf * saturation`, the saturation being BM25's
`tf (k1 + 1) / (tf + k1 (1 - b + b len / avg))` (lexical.py says why k1 and b are what
they are).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["Bm25Statistics"]

_SATURATION_CACHE = 4_000_000  # saturations kept per shard (~32 MB): a cache, not a second index


def _grown(arr: np.ndarray, need: int) -> np.ndarray:
    if need <= len(arr):
        return arr
    new = np.zeros(max(need, 2 * len(arr), 64), dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


class Bm25Statistics:
    """Document frequencies, record lengths and the live count of one shard, and BM25's weights from them."""

    def __init__(self, k1: float, b: float, df: np.ndarray, lengths: np.ndarray, n_rows: int) -> None:
        self.k1, self.b = k1, b
        self.df = df  # live rows holding each term (every base row is alive when loaded)
        self.lengths = lengths  # each row's length in counted terms (a removed row keeps its own)
        self.n_alive = n_rows
        self.total_length = float(self.lengths[:n_rows].sum())  # of the live rows
        self._sat: dict[int, tuple[float, np.ndarray]] = {}
        self._sat_size = 0
        self._sat_bound: dict[int, tuple[float, int, float]] = {}
        self._shortest = (-1, 0.0)  # (rows counted, shortest non-empty length among them)

    # -- changes ----------------------------------------------------------------------
    def grow_terms(self, n_terms: int) -> None:
        """Room for the document frequencies of `n_terms` terms (new ones start at 0)."""
        self.df = _grown(self.df, n_terms)

    def add_rows(self, start: int, lengths: np.ndarray, tids: np.ndarray) -> None:
        """Count rows start, start+1, ... of the given lengths; `tids`: each term once per row holding it."""
        self.lengths = _grown(self.lengths, start + len(lengths))
        self.lengths[start : start + len(lengths)] = lengths
        self.n_alive += len(lengths)
        self.total_length += float(lengths.sum())
        np.add.at(self.df, tids, 1)

    def remove_row(self, row: int, tids: np.ndarray) -> None:
        """Stop counting a row (`tids`: the terms it holds)."""
        self.n_alive -= 1
        self.total_length -= self.lengths[row]
        self.df[tids] -= 1

    # -- weights ------------------------------------------------------------------------
    def idf(self, tid: int) -> float:
        """BM25+ style idf (never negative, so a common word cannot push a record down)."""
        df = int(self.df[tid])
        return math.log(1.0 + (self.n_alive - df + 0.5) / (df + 0.5))

    def average_length(self) -> float:
        return max(self.total_length / self.n_alive, 1e-9) if self.n_alive > 0 else 1e-9

    def saturation(self, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The saturations of some postings (rows and counts) at today's average length (not cached)."""
        return self._formula(counts, self.lengths[rows], self.average_length())

    def term_saturation(self, tid: int, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The saturations of a term's postings, cached while the average length and the postings hold."""
        avg = self.average_length()
        hit = self._sat.get(tid)
        if hit is not None and hit[0] == avg and len(hit[1]) == len(rows):
            return hit[1]
        sat = self.saturation(rows, counts)
        if self._sat_size + len(sat) > _SATURATION_CACHE:
            self._sat.clear()
            self._sat_size = 0
        self._sat[tid] = (avg, sat)
        self._sat_size += len(sat)
        return sat

    def saturation_bound(self, tid: int, counts: np.ndarray, n_rows: int) -> float:
        """At least the largest saturation of a term's postings below `n_rows` (`counts`: their counts),
        cached while it holds. Saturation grows with the count and shrinks with the length, so the
        term's largest count in the shortest record bounds it."""
        avg = self.average_length()
        hit = self._sat_bound.get(tid)
        if hit is None or hit[0] != avg or hit[1] != len(counts):
            if self._shortest[0] != n_rows:  # lengths are set once per row: the key is the row count
                lens = self.lengths[:n_rows]
                self._shortest = (n_rows, float(lens[lens > 0].min()) if (lens > 0).any() else 0.0)
            shortest = self._shortest[1]
            top = float(counts.max()) if len(counts) else 0.0
            bound = self._formula(top, shortest, avg) if top > 0 else 0.0
            hit = self._sat_bound[tid] = (avg, len(counts), bound * (1.0 + 1e-12))
        return hit[2]

    def _formula(self, tf: Any, length: Any, avg: float) -> Any:
        """BM25's tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)), for arrays or single values."""
        k1, b = self.k1, self.b
        return tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * length / avg))
