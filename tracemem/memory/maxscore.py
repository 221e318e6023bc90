"""BM25 of a few rows without scoring every row: exact values, and bounds for the rest (MaxScore).

Why: a query word held by most records (in a million of them, half a million
postings) costs milliseconds to add into a score array of every row, and only
the few rows that can reach the top need its exact contribution. So a query's
rare terms are summed over the rows that hold them (`rows`, `partial`: a
sparse, sorted partial score), and each common term (at least `COMMON_DF`
postings) is only *bounded*: it adds at most `w * max(sat)` to any row (summed
over the common terms: `slack`). A row whose partial score is below `x -
slack` cannot score `x`; the rows left are few, and `exact` computes their
scores term by term in the order `LexicalIndex.score` adds them, so each value
is the same float64 a full score array would hold. Which rows hold any query
term at all (the lexical matches, counted exactly) is the union of those rows
and one cached bitmap per common term.

When the bounds leave too many rows (a query made only of common words), the
scores turn dense: every term is added into an array of every row, as
`LexicalIndex.score` does.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .lexical import LexicalIndex

__all__ = ["TermScores", "QueryScores", "COMMON_DF", "bits_of", "has_bit"]

COMMON_DF = 32_768  # a term with this many postings is bounded, not summed row by row
DENSE_ROWS = 20_000  # more rows than this left by the bounds: score every row instead
_BITMAPS = 256  # common terms whose bitmaps stay cached (each n / 8 bytes)
_NONE = np.zeros(0, dtype=np.int64)


def bits_of(rows: np.ndarray, n: int) -> np.ndarray:
    """A packed bitmap (big-endian bits, as np.packbits) of the given rows among n."""
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return np.packbits(mask)


def has_bit(bits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Whether each row's bit is set in a packed bitmap."""
    return ((bits[rows >> 3] >> (7 - (rows & 7))) & 1).astype(bool)


def _tol(x: float) -> float:
    return 1e-9 * (1.0 + abs(x))


class TermScores:
    """Weighted terms of a query: the rare ones' rows and partial sums, the common ones bounded."""

    def __init__(self, lex: LexicalIndex, n: int, tids: Sequence[int], weights: Mapping[int, float] | None,
                 common_df: int = COMMON_DF) -> None:
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
            if len(rows) >= common_df:
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


def _sparse_sum(parts: Sequence[tuple[list[np.ndarray], list[np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of some postings (ascending) and the sum of their values per row."""
    rows = [r for p in parts for r in p[0]]
    if not rows:
        return _NONE, np.zeros(0)
    flat = np.concatenate(rows)
    values = np.concatenate([v for p in parts for v in p[1]])
    order = np.argsort(flat, kind="stable")
    flat, values = flat[order], values[order]
    first = np.ones(len(flat), dtype=bool)
    first[1:] = flat[1:] != flat[:-1]
    return flat[first].astype(np.int64), np.bincount(np.cumsum(first) - 1, weights=values, minlength=int(first.sum()))


class QueryScores:
    """BM25 of a query (and, once added, its feedback terms) over a shard's live rows, read a few rows at a time."""

    def __init__(self, lex: LexicalIndex, n: int, qtids: Sequence[int], alive: np.ndarray, n_dead: int,
                 memo: dict[str, Any]) -> None:
        self.lex, self.n, self.qtids, self.memo = lex, n, list(qtids), memo
        self.alive = alive[:n] if n_dead else None
        self.query = TermScores(lex, n, qtids, None)
        self.extra: TermScores | None = None
        self.feedback: dict[int, float] = {}
        self.dense: tuple[np.ndarray, np.ndarray | None] | None = None  # (query, feedback) scores of every row
        self.common_bits: np.ndarray | None = None
        for tid, rows in self.query.common:
            bits = self._term_bits(tid, rows)
            self.common_bits = bits.copy() if self.common_bits is None else self.common_bits | bits
        if self.common_bits is not None and self.alive is not None:
            self.common_bits &= np.packbits(self.alive)
        self._set(*self._live(*_sparse_sum([self.query.rare])))
        self.rare_rows = self.rows  # live rows holding a rare query term
        in_common = 0 if self.common_bits is None else int(np.bitwise_count(self.common_bits).sum())
        outside = len(self.rows) if self.common_bits is None else int(np.count_nonzero(~has_bit(self.common_bits, self.rows)))
        self.matched = in_common + outside  # live rows holding a query term: the lexical matches

    def _set(self, rows: np.ndarray, partial: np.ndarray) -> None:
        """The candidate rows (ascending), their partial scores, and room for their exact scores."""
        self.rows, self.partial = rows, partial
        self._known = np.full(len(rows), np.nan)

    def _exact_at(self, idx: np.ndarray) -> np.ndarray:
        """Exact scores of the candidates at positions `idx` of `rows`, each computed once."""
        if self.dense is not None:
            return self.partial[idx]  # q + e of every row: what exact() gives
        known = self._known[idx]
        missing = np.isnan(known)
        if missing.any():
            known[missing] = self._known[idx[missing]] = self.exact(self.rows[idx[missing]])
        return known

    def _live(self, rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.alive is None or not len(rows):
            return rows, values
        keep = self.alive[rows]
        return rows[keep], values[keep]

    def _term_bits(self, tid: int, rows: np.ndarray) -> np.ndarray:
        cache: dict[int, tuple[int, int, np.ndarray]] = self.memo.setdefault("term_bits", {})
        hit = cache.get(tid)
        if hit is None or hit[0] != len(rows) or hit[1] != self.n:
            if len(cache) >= _BITMAPS:
                cache.clear()
            hit = cache[tid] = (len(rows), self.n, bits_of(rows, self.n))
        return hit[2]

    def is_lexical(self, rows: np.ndarray) -> np.ndarray:
        """Whether each (live) row holds a query term."""
        got = np.zeros(len(rows), dtype=bool) if self.common_bits is None else has_bit(self.common_bits, rows)
        if len(self.rare_rows):
            at = np.searchsorted(self.rare_rows, rows)
            at[at == len(self.rare_rows)] = 0
            got |= self.rare_rows[at] == rows
        return got

    def add_feedback(self, weights: dict[int, float]) -> None:
        """From now on a row's score is its query score plus its feedback terms' (as rank_shard adds them)."""
        self.feedback = weights
        if self.dense is not None:
            self.dense = (self.dense[0], self._dense_of(list(weights), weights))
            self._set(*self._dense_rows(0.0))
            return
        self.extra = TermScores(self.lex, self.n, list(weights), weights)
        self._set(*self._live(*_sparse_sum([self.query.rare, self.extra.rare])))

    def _dense_of(self, tids: list[int], weights: dict[int, float] | None) -> np.ndarray:
        out = self.lex.score(tids, self.n, weights)
        if self.alive is not None:
            out[~self.alive] = 0.0
        return out

    def _dense_rows(self, low: float) -> tuple[np.ndarray, np.ndarray]:
        assert self.dense is not None
        q, e = self.dense
        total = q if e is None else q + e
        rows = np.flatnonzero(total > low)
        return rows, total[rows]

    def _go_dense(self, low: float) -> None:
        """Score every row (every term, as LexicalIndex.score); keep the rows above `low` as the candidates."""
        q = self._dense_of(self.qtids, None)
        self.dense = (q, self._dense_of(list(self.feedback), self.feedback) if self.feedback else None)
        self._set(*self._dense_rows(low))

    def slack(self) -> float:
        return 0.0 if self.dense is not None else self.query.slack + (self.extra.slack if self.extra else 0.0)

    def exact(self, rows: np.ndarray) -> np.ndarray:
        """The score of each row (ascending), the same float64 rank_shard's score arrays hold."""
        if self.dense is not None:
            q, e = self.dense
            return q[rows] if e is None else q[rows] + e[rows]
        if self.extra is None and not self.query.common and len(self.rows):
            # every term is summed per row, in score()'s order (a stable sort keeps it): the same float64
            at = np.searchsorted(self.rows, rows)
            at[at == len(self.rows)] = 0
            return np.where(self.rows[at] == rows, self.partial[at], 0.0)
        got = self.query.exact(rows)
        return got if self.extra is None else got + self.extra.exact(rows)

    def at_least(self, x: float) -> tuple[np.ndarray, np.ndarray]:
        """Every live row scoring at least `x` (> 0), ascending, with its score."""
        if self.dense is None and x - self.slack() <= _tol(x):
            self._go_dense(0.0)
        idx = np.flatnonzero(self.partial >= x - self.slack() - _tol(x))
        if self.dense is None and len(idx) > DENSE_ROWS:
            self._go_dense(0.0)
            idx = np.flatnonzero(self.partial >= x - _tol(x))
        values = self._exact_at(idx)
        keep = values >= x
        return self.rows[idx[keep]], values[keep]

    def highest(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The `count` live rows with the highest scores (fewer if fewer score), best first by score."""
        if self.dense is None:
            got = self._highest_bounded(count)
            if got is not None:
                return got
            self._go_dense(0.0)
        if not len(self.rows):
            return _NONE, np.zeros(0)
        at = max(len(self.partial) - count, 0)
        kth = float(np.partition(self.partial, at)[at])
        idx = np.flatnonzero(self.partial >= kth - _tol(kth))
        return _best_first(self.rows[idx], self._exact_at(idx), count)

    def _highest_bounded(self, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """highest() among the rows of the rare terms; None when a row without one could be among them."""
        if len(self.rows) < count:
            return None
        kth = float(self.partial.max() if count == 1 else np.partition(self.partial, len(self.partial) - count)[len(self.partial) - count])
        slack = self.slack()
        idx = np.flatnonzero(self.partial >= kth - slack - _tol(kth))
        if len(idx) > DENSE_ROWS:
            return None
        rows, values = _best_first(self.rows[idx], self._exact_at(idx), count)
        if float(values[-1]) <= slack + _tol(slack):  # a row holding only common terms might beat it
            return None
        return rows, values


def _best_first(rows: np.ndarray, values: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    if len(rows) > count:
        part = np.argpartition(-values, count - 1)[:count]
        rows, values = rows[part], values[part]
    order = np.argsort(-values, kind="stable")
    return rows[order], values[order]
