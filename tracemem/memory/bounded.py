"""One query's BM25 over a big shard, read a few rows at a time: which rows score at least x, and how much.

A row's score is its query terms' BM25 plus, once feedback terms are added, theirs
(as rank_shard adds them). Rows are found through upper bounds (see maxscore.py):

- bounded: the query's rare terms are summed over their rows (sparse), its common
  terms only bounded; rows scoring at least x are among those whose partial sum
  is at least x minus the bound.
- dense: when that leaves too many rows (a query made only of common words), the
  query's terms are scored for every row, as `LexicalIndex.score` does, and rows
  are selected from that array.

Each mode keeps its own state (`PartialSums`, `DenseScores`); `QueryScores` starts
bounded, goes dense for good when the bounds stop paying, and answers the same
questions either way.

Feedback terms follow the same mode. Every score returned is computed term by
term in `LexicalIndex.score`'s order: the same float64 rank_shard's arrays hold.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .lexical import LexicalIndex
from .maxscore import TermScores, best_first, has_bit, sparse_sum, term_bits

__all__ = ["QueryScores", "PartialSums", "DenseScores", "DENSE_ROWS"]

DENSE_ROWS = 20_000  # more rows than this left by the bounds: score every row instead
_NONE = np.zeros(0, dtype=np.int64)


def _tol(x: float) -> float:
    return 1e-9 * (1.0 + abs(x))


class PartialSums:
    """Bounded mode: the rows a rare term reaches (ascending before feedback), their partial sums (rare terms
    summed, common ones only bounded), and each row's exact score once it is computed."""

    def __init__(self, rows: np.ndarray, partial: np.ndarray) -> None:
        self.rows, self.partial = rows, partial
        self._known = np.full(len(rows), np.nan)

    def with_feedback(self, rows: np.ndarray, values: np.ndarray) -> "PartialSums":
        """These sums with the feedback terms' sums added (only bounds: any order); rows only feedback terms
        reach go after the others, so `rows` is no longer ascending from here on."""
        at = np.searchsorted(self.rows, rows)
        found = np.zeros(len(rows), dtype=bool)
        if len(self.rows):
            found = self.rows[np.minimum(at, len(self.rows) - 1)] == rows
        partial = self.partial.copy()
        partial[at[found]] += values[found]
        return PartialSums(np.concatenate([self.rows, rows[~found]]), np.concatenate([partial, values[~found]]))

    def exact_at(self, idx: np.ndarray, exact: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Exact scores of the rows at positions `idx` of `rows`, each computed once (by `exact`)."""
        known = self._known[idx]
        missing = np.isnan(known)
        if missing.any():
            known[missing] = self._known[idx[missing]] = exact(self.rows[idx[missing]])
        return known


class DenseScores:
    """Dense mode: the query's score of every row, and its feedback terms' once added, as LexicalIndex.score
    gives them (dead rows score 0)."""

    def __init__(self, lex: LexicalIndex, n: int, alive: np.ndarray | None, qtids: list[int],
                 feedback: dict[int, float] | None) -> None:
        self.lex, self.n, self.alive = lex, n, alive
        self.query = self._score(qtids, None)
        self.extra = None if feedback is None else self._score(list(feedback), feedback)
        self._total: np.ndarray | None = None

    def _score(self, tids: list[int], weights: dict[int, float] | None) -> np.ndarray:
        out = self.lex.score(tids, self.n, weights)
        if self.alive is not None:
            out[~self.alive] = 0.0
        return out

    def add_feedback(self, weights: dict[int, float]) -> None:
        self.extra, self._total = self._score(list(weights), weights), None

    def total(self) -> np.ndarray:
        """Every row's score, feedback terms included."""
        if self._total is None:
            self._total = self.query if self.extra is None else self.query + self.extra
        return self._total

    def exact(self, rows: np.ndarray) -> np.ndarray:
        return self.query[rows] if self.extra is None else self.query[rows] + self.extra[rows]

    def at_least(self, low: float) -> np.ndarray:
        """Rows scoring at least `low` > 0, ascending."""
        return np.flatnonzero(self.total() >= low)


class QueryScores:
    """BM25 of a query (and, once added, its feedback terms) over a shard's live rows."""

    def __init__(self, lex: LexicalIndex, n: int, qtids: Sequence[int], alive: np.ndarray, n_dead: int,
                 memo: dict[str, Any]) -> None:
        self.lex, self.n, self.qtids, self.memo = lex, n, list(qtids), memo
        self.alive = alive[:n] if n_dead else None
        self.query = TermScores(lex, n, qtids, None)
        self.extra: TermScores | None = None
        self.feedback: dict[int, float] = {}
        self.dense: DenseScores | None = None  # set when the bounds stop paying: dense for good
        self.common_bits: np.ndarray | None = None
        for tid, rows in self.query.common:
            bits = term_bits(memo, tid, rows, n)
            self.common_bits = bits.copy() if self.common_bits is None else self.common_bits | bits
        if self.common_bits is not None and self.alive is not None:
            self.common_bits &= np.packbits(self.alive)
        self.sums = PartialSums(*self._live(*sparse_sum([self.query.rare])))
        self.rare_rows = self.sums.rows  # live rows holding a rare query term
        rows = self.rare_rows
        in_common = 0 if self.common_bits is None else int(np.bitwise_count(self.common_bits).sum())
        outside = len(rows) if self.common_bits is None else int(np.count_nonzero(~has_bit(self.common_bits, rows)))
        self.matched = in_common + outside  # live rows holding a query term: the lexical matches

    def _live(self, rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.alive is None or not len(rows):
            return rows, values
        keep = self.alive[rows]
        return rows[keep], values[keep]

    def add_feedback(self, weights: dict[int, float]) -> None:
        """From now on a row's score is its query score plus its feedback terms' (as rank_shard adds them)."""
        self.extra = TermScores(self.lex, self.n, list(weights), weights)
        self.feedback = weights
        if self.dense is None:
            self.sums = self.sums.with_feedback(*self._live(*sparse_sum([self.extra.rare])))
        else:
            self.dense.add_feedback(weights)

    def _go_dense(self) -> None:
        """Score every term for every row (as LexicalIndex.score does) and select rows from those arrays."""
        self.dense = DenseScores(self.lex, self.n, self.alive, self.qtids,
                                 self.feedback if self.extra is not None else None)

    def is_lexical(self, rows: np.ndarray) -> np.ndarray:
        """Whether each (live) row holds a query term."""
        got = np.zeros(len(rows), dtype=bool) if self.common_bits is None else has_bit(self.common_bits, rows)
        if len(self.rare_rows):
            at = np.searchsorted(self.rare_rows, rows)
            at[at == len(self.rare_rows)] = 0
            got |= self.rare_rows[at] == rows
        return got

    def _slack(self) -> float:
        """How much more than its bound-selected part a row can score (common terms, bounded)."""
        if self.dense is not None:
            return 0.0
        return self.query.slack + (self.extra.slack if self.extra is not None else 0.0)

    # -- exact scores ---------------------------------------------------------------------
    def exact(self, rows: np.ndarray) -> np.ndarray:
        """The score of each row (ascending), the same float64 rank_shard's score arrays hold."""
        sums = self.sums
        if self.dense is None and self.extra is None and not self.query.common and len(sums.rows):
            # every term is summed per row in score()'s order (a stable sort keeps it): the same float64
            at = np.searchsorted(sums.rows, rows)
            at[at == len(sums.rows)] = 0
            return np.where(sums.rows[at] == rows, sums.partial[at], 0.0)
        if self.dense is not None:
            return self.dense.exact(rows)
        got = self.query.exact(rows)
        return got if self.extra is None else got + self.extra.exact(rows)

    # -- selection --------------------------------------------------------------------------
    def at_least(self, x: float) -> tuple[np.ndarray, np.ndarray]:
        """Every live row scoring at least `x` (> 0), ascending, with its score."""
        if self.dense is None and x - self._slack() <= _tol(x):
            self._go_dense()
        if self.dense is None:
            sums = self.sums
            idx = np.flatnonzero(sums.partial >= x - self._slack() - _tol(x))
            if len(idx) <= DENSE_ROWS:
                values = sums.exact_at(idx, self.exact)
                keep = idx[values >= x]
                order = np.argsort(sums.rows[keep])
                return sums.rows[keep][order], values[values >= x][order]
            self._go_dense()
        assert self.dense is not None
        rows = self.dense.at_least(x - self._slack() - _tol(x))
        values = self.exact(rows)
        keep = values >= x
        return rows[keep], values[keep]

    def highest(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The `count` live rows with the highest scores (fewer if fewer score), best first by score."""
        return self._high(count, strict=True)

    def some_high(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to `count` live rows with high scores, best first: real rows (so their k-th score bounds the k-th
        best from below), not necessarily the best ones; cheaper than highest()."""
        return self._high(count, strict=False)

    def _high(self, count: int, strict: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.dense is None:
            got = self._highest_bounded(count, strict=strict)
            if got is not None:
                return got
            self._go_dense()
        return self._highest_dense(count)

    def _highest_bounded(self, count: int, strict: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """The best rows among those a rare term reaches; None when they are too many to score, or (strict)
        when a row without a rare term could be among the best."""
        sums = self.sums
        if not len(sums.rows) or (strict and len(sums.rows) < count):
            return None
        count = min(count, len(sums.rows))
        at = len(sums.partial) - count
        kth = float(sums.partial.max() if count == 1 else np.partition(sums.partial, at)[at])
        slack = self._slack() if strict else 0.0
        idx = np.flatnonzero(sums.partial >= kth - slack - _tol(kth))
        if len(idx) > DENSE_ROWS:
            return None
        rows, values = best_first(sums.rows[idx], sums.exact_at(idx, self.exact), count)
        if strict and float(values[-1]) <= slack + _tol(slack):  # a row holding only common terms might beat it
            return None
        return rows, values

    def _highest_dense(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.dense is not None
        top = float(self.dense.total().max())
        rows, values = _NONE, np.zeros(0)
        if top <= 0:
            return rows, values
        for frac in (0.9, 0.6, 0.3, 1e-9):
            rows, values = self.at_least(frac * top)
            if len(rows) >= count:
                break
        return best_first(rows, values, count)
