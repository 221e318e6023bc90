"""BM25 of a few rows without scoring every row: exact values, and bounds for the rest (MaxScore).

Why: a query word held by most records (in a million of them, half a million
postings) costs milliseconds to add into a score array of every row, and only
the few rows that can reach the top need its exact contribution. So a query's
rare terms are summed over the rows that hold them (`rows`, `partial`: a
sparse, sorted partial score), and each common term (at least `COMMON_DF`
postings) is only *bounded*: it adds at most `w` times the saturation of its
largest count in the shortest record to any row (`LexicalIndex.saturation_bound`;
summed over the common terms: `slack`). A row whose partial score is below `x -
slack` cannot score `x`; the rows left are few, and `exact` computes their
scores term by term in the order `LexicalIndex.score` adds them, so each value
is the same float64 a full score array would hold. Which rows hold any query
term at all (the lexical matches, counted exactly) is the union of those rows
and one cached bitmap per common term.

`bounded.QueryScores` uses these pieces to answer "which rows score at least x".
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .lexical import LexicalIndex

__all__ = ["TermScores", "sparse_sum", "best_first", "term_bits", "COMMON_DF", "bits_of", "has_bit"]

COMMON_DF = 32_768  # a term with this many postings (and an eighth of the rows) is bounded, not summed row by row
_BITMAPS = 256  # common terms whose bitmaps stay cached (each n / 8 bytes)


def bits_of(rows: np.ndarray, n: int) -> np.ndarray:
    """A packed bitmap (big-endian bits, as np.packbits) of the given rows among n."""
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return np.packbits(mask)


def has_bit(bits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Whether each row's bit is set in a packed bitmap."""
    return ((bits[rows >> 3] >> (7 - (rows & 7))) & 1).astype(bool)


class TermScores:
    """Weighted terms of a query: the rare ones' rows and partial sums, the common ones bounded."""

    def __init__(self, lex: LexicalIndex, n: int, tids: Sequence[int], weights: Mapping[int, float] | None) -> None:
        self.n, self.lex = n, lex
        # in the order score() adds them: (rows, saturations or None, counts, weight); a common term's
        # saturations are computed only at the rows asked for (its full array would cost more than the search)
        self.terms: list[tuple[np.ndarray, np.ndarray | None, np.ndarray, float]] = []
        self.common: list[tuple[int, np.ndarray]] = []  # (term id, rows) of the bounded terms
        self.slack = 0.0
        rare_rows, rare_values = [], []
        for tid in dict.fromkeys(tids):
            got = lex.postings(tid, n)
            if got is None:
                continue
            rows, tf = got
            weight = weights.get(tid, 1.0) if weights else 1.0
            if len(rows) >= max(COMMON_DF, n // 8):
                w = lex.idf(tid) * weight
                self.terms.append((rows, None, tf, w))
                self.common.append((tid, rows))
                self.slack += w * lex.saturation_bound(tid, n)
            elif len(rows):
                rows, sat, w = lex.weighted_postings(tid, n, weight)  # type: ignore[misc]
                self.terms.append((rows, sat, tf, w))
                rare_rows.append(rows)
                rare_values.append(w * sat)
        self.rare = (rare_rows, rare_values)

    def exact(self, rows: np.ndarray) -> np.ndarray:
        """The scores of the given rows (ascending), each the float64 `LexicalIndex.score` gives it."""
        out = np.zeros(len(rows), dtype=np.float64)
        for trows, sat, tf, w in self.terms:
            at = np.searchsorted(trows, rows)
            at[at == len(trows)] = 0
            hit = trows[at] == rows
            if hit.any():
                at = at[hit]
                out[hit] += w * (sat[at] if sat is not None else self.lex.saturation(trows[at], tf[at]))
        return out


def sparse_sum(parts: Sequence[tuple[list[np.ndarray], list[np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of some postings (ascending) and the sum of their values per row."""
    rows = [r for p in parts for r in p[0]]
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    flat = np.concatenate(rows)
    values = np.concatenate([v for p in parts for v in p[1]])
    order = np.argsort(flat, kind="stable")
    flat, values = flat[order], values[order]
    first = np.ones(len(flat), dtype=bool)
    first[1:] = flat[1:] != flat[:-1]
    return flat[first].astype(np.int64), np.bincount(np.cumsum(first) - 1, weights=values, minlength=int(first.sum()))


def term_bits(memo: dict[str, Any], tid: int, rows: np.ndarray, n: int) -> np.ndarray:
    """The packed bitmap of a term's rows, cached in `memo` while its postings and n hold."""
    cache: dict[int, tuple[int, int, np.ndarray]] = memo.setdefault("term_bits", {})
    hit = cache.get(tid)
    if hit is None or hit[0] != len(rows) or hit[1] != n:
        if len(cache) >= _BITMAPS:
            cache.clear()
        hit = cache[tid] = (len(rows), n, bits_of(rows, n))
    return hit[2]


def best_first(rows: np.ndarray, values: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `count` rows with the highest values, best first; ties go to the higher row (as rank_shard orders)."""
    if len(rows) > count:
        kth = values[np.argpartition(-values, count - 1)[count - 1]]
        near = np.flatnonzero(values >= kth)
        rows, values = rows[near], values[near]
    order = np.lexsort((-rows, -values))[:count]
    return rows[order], values[order]
