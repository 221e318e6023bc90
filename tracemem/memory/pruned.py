"""Fused search of a big shard without scanning every vector: exact ranking, estimated count.

Why: at a million records the int8 scan alone reads 384 MB per query (15 ms on
one core), and every pass over a million candidates (fusing, masks, top-k)
costs another millisecond or more. The fused score is `w * lex / max_lex +
(1 - w) * cos` and a cosine is at most 1, so once BM25 has scored every row, a
row whose BM25 part cannot reach the k-th best fused score found so far cannot
be in the top k whatever its vector; and a row that shares no query term scores
at most `1 - w`. The search below therefore computes float32 cosines only for
the rows those bounds leave open (first bounded again by their int8 codes, whose
rounding error has a closed-form bound), and it gets the same ranking as a
float32 scan of every row. When a bound does not close (few lexical matches, or
an embedder whose cosine weighs more than the best BM25 part leaves room for),
it returns None and the caller scans every vector as before.

What is not exact is the number of matches: a record matches by vector alone
when its cosine is at least `min_similarity`, and counting those needs every
cosine. Lexical matches are counted exactly; vector-only matches are counted
exactly among rows added since the shard file was loaded and estimated from a
fixed, evenly spaced sample of the file's rows (int8 codes, `SAMPLE_ROWS` of
them). The result says so (`SearchResult.count_estimated`). The recall filter
stays exact: only records that are flagged, under some confidence or bounded
in time can be excluded, those few rows get exact cosines, and every excluded
match is counted and listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .index import FLAGGED_CODE, MAX_US, MIN_US, Shard
from .bounded import QueryScores
from .vectors import PRUNED_MIN_ROWS, RERANK, int8_kernel, query_codes

__all__ = ["Pruned", "rank_pruned", "rank_literal", "SAMPLE_ROWS", "LITERAL_MIN_ROWS"]

SAMPLE_ROWS = 32_768  # base rows whose int8 codes estimate the count of vector-only matches
LITERAL_MIN_ROWS = PRUNED_MIN_ROWS  # a BM25-only search of a shard this big reads it through bounds too
_SLACK = 1e-5  # float32 rounding of cosines, added to every bound


@dataclass
class Pruned:
    """What rank_pruned found: the chosen rows best-first, their score parts, and the counts."""

    rows: np.ndarray
    score: dict[int, float]
    lexical: dict[int, float]
    similarity: dict[int, float]
    total: int
    total_lexical: int
    sample: int
    exclusions: list[tuple[int, str]] = field(default_factory=list)


class _Cosines:
    """Cosines of single rows with the query: int8 bounds first, float32 when a bound does not decide."""

    def __init__(self, shard: Shard, query: np.ndarray) -> None:
        assert shard.vecs is not None
        self.vecs, self.query, self.has_vec = shard.vecs, query, shard.has_vec
        self.codes = shard.vecs.codes
        self.q8, self.sq = query_codes(query)
        self.query64 = np.asarray(query, dtype=np.float64)
        dim = len(query)
        # |q.x - q^.x^| <= |q|_1 s_x / 2 + s_q / 2 * (sqrt(d) + d s_x / 2) for a unit x (see module docstring)
        self.q_l1 = float(np.abs(query).sum())
        self.sqrt_d, self.dim = float(np.sqrt(dim)), dim
        self.known_rows = np.zeros(0, dtype=np.int64)  # ascending
        self.known_sims = np.zeros(0, dtype=np.float32)

    def _lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.searchsorted(self.known_rows, rows)
        at[at == len(self.known_rows)] = 0
        have = self.known_rows[at] == rows if len(self.known_rows) else np.zeros(len(rows), dtype=bool)
        return at, have

    def exact(self, rows: np.ndarray) -> np.ndarray:
        """Float32 cosines (0 for a row without a vector), each computed once: what a float32 scan gives."""
        at, have = self._lookup(rows)
        if not have.all():
            missing = np.unique(rows[~have])
            # summed in float64 and rounded once: a row's cosine does not depend on the rows read with it
            # (a float32 product's rounding does), so identical records keep identical scores
            sims = (self.vecs.take(missing).astype(np.float64) @ self.query64).astype(np.float32)
            sims[~self.has_vec[missing]] = 0.0
            merged = np.concatenate([self.known_rows, missing])
            order = np.argsort(merged, kind="stable")
            self.known_rows, self.known_sims = merged[order], np.concatenate([self.known_sims, sims])[order]
            at, have = self._lookup(rows)
        return self.known_sims[at]

    def bounds(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds of each row's cosine (int8 codes for base rows, exact for the others)."""
        lo, hi = np.empty(len(rows)), np.empty(len(rows))
        base = rows < self.vecs.n_base
        if base.any():
            kernel = int8_kernel()
            assert kernel is not None
            b = rows[base]
            scale = np.asarray(self.codes["vec_scale"][b], dtype=np.float64)
            est = kernel(np.take(self.codes["vec_i8"], b, axis=0), self.q8) * (scale * self.sq)
            err = self.q_l1 * scale / 2 + self.sq / 2 * (self.sqrt_d + self.dim * scale / 2) + _SLACK
            est = np.where(self.has_vec[b], est, 0.0)
            err = np.where(self.has_vec[b], err, 0.0)
            lo[base], hi[base] = est - err, est + err
        if not base.all():
            ex = self.exact(rows[~base])
            lo[~base], hi[~base] = ex, ex
        at, have = self._lookup(rows)
        lo[have] = hi[have] = self.known_sims[at[have]]
        return lo, hi


def _top(scores: QueryScores, best: float, k: int, cos: _Cosines, w: float,
         is_candidate: Callable[[np.ndarray], np.ndarray], excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The k best candidates by `w * score / best + (1 - w) * cos` (ties to the higher row), with their fused scores.

    A few high-scoring rows and the int8 lower bounds of their cosines give a score the
    k-th best reaches at least; the rows that can reach it are found through BM25 bounds,
    narrowed by int8 upper bounds, and float32 cosines are computed best bound first
    until the k-th best exact score beats every bound left. None when the bounds cannot
    prove the answer without every cosine.
    """
    first, values = scores.some_high(k + RERANK)
    keep = ~np.isin(first, excluded)
    first, values = first[keep], values[keep]
    keep = is_candidate(first)
    first, values = first[keep], values[keep]
    if len(first) < k:
        return None
    lo, _ = cos.bounds(first)
    low = w * (values / best) + (1.0 - w) * lo
    theta = float(np.partition(low, len(low) - k)[len(low) - k]) - _SLACK  # the k-th best scores at least this
    if theta <= (1.0 - w) + _SLACK:  # a record sharing no query term could still make the top k
        return None
    pool, values = scores.at_least((theta - (1.0 - w) - _SLACK) * best / w)
    keep = ~np.isin(pool, excluded)
    pool, values = pool[keep], values[keep]
    _, hi = cos.bounds(pool)
    upper = w * (values / best) + (1.0 - w) * hi
    keep = upper >= theta - _SLACK
    pool, values, upper = pool[keep], values[keep], upper[keep]
    keep = is_candidate(pool)
    pool, values, upper = pool[keep], values[keep], upper[keep]
    if len(pool) < k:
        return None
    by_bound = np.argsort(-upper, kind="stable")
    done = min(len(pool), k + 8)
    while True:  # exact cosines for the rows with the best bounds, until no bound left can beat the k-th
        idx = by_bound[:done]
        fused = w * (values[idx] / best) + (1.0 - w) * cos.exact(pool[idx])
        kth = float(np.partition(fused, len(fused) - k)[len(fused) - k])
        rest = by_bound[done:]
        more = int(np.count_nonzero(upper[rest] >= kth - _SLACK))
        if not more:
            break
        done += more
    rows = pool[idx]
    order = np.lexsort((-rows, -fused))[:k]
    return rows[order], fused[order]


def _specials(shard: Shard, floor: float) -> np.ndarray:
    """Rows the recall filter could exclude at some time: flagged, under the floor, or bounded in time."""
    key = ("specials", shard.version, floor, shard.n)
    memo = shard.memo
    if memo.get("specials_key") != key:
        n = shard.n
        mask = FLAGGED_CODE[shard.review[:n]] | (shard.conf[:n] < floor)
        mask |= (shard.vfrom[:n] != MIN_US) | (shard.vuntil[:n] != MAX_US)
        mask &= shard.alive[:n]
        memo["specials_key"], memo["specials"] = key, np.flatnonzero(mask)
    return memo["specials"]


def _sample(shard: Shard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evenly spaced base rows, their int8 codes (contiguous) and scales: copied once per shard."""
    vecs = shard.vecs
    assert vecs is not None
    key = ("sample", vecs.n_base)
    memo = shard.memo
    if memo.get("sample_key") != key:
        size = min(SAMPLE_ROWS, vecs.n_base)
        rows = (np.arange(size, dtype=np.int64) * vecs.n_base) // size
        memo["sample_key"] = key
        memo["sample"] = (rows, np.ascontiguousarray(np.take(vecs.codes["vec_i8"], rows, axis=0)),
                          np.asarray(vecs.codes["vec_scale"][rows], dtype=np.float32))
    return memo["sample"]


def _vector_only(shard: Shard, lexical: Callable[[np.ndarray], np.ndarray], cos: _Cosines,
                 min_similarity: float) -> tuple[float, int]:
    """Estimated count of live rows matching by vector alone (`lexical`: which rows are lexical matches), and the sample size."""
    vecs = shard.vecs
    assert vecs is not None
    rows, codes, scales = _sample(shard)
    kernel = int8_kernel()
    assert kernel is not None
    est = kernel(codes, cos.q8) * (scales * np.float32(cos.sq))
    key = ("sample_live", shard.version, shard.n)
    if shard.memo.get("sample_live_key") != key:
        shard.memo["sample_live_key"], shard.memo["sample_live"] = key, shard.alive[rows] & shard.has_vec[rows]
    hit = est >= min_similarity
    hit &= shard.memo["sample_live"]
    hit[hit] = ~lexical(rows[hit])
    count = float(np.count_nonzero(hit)) * vecs.n_base / max(len(rows), 1)
    if vecs.n_tail:  # rows added since the file was loaded: in memory, float32, counted exactly
        lo, n = vecs.n_base, shard.n
        tail = vecs.tail.dot(cos.query)
        others = ~lexical(np.arange(lo, n))
        ok = (tail >= min_similarity) & others & shard.alive[lo:n] & shard.has_vec[lo:n]
        count += float(np.count_nonzero(ok))
    return count, len(rows)


def _exclude(shard: Shard, special: np.ndarray, floor: float, now_us: int, out: Pruned) -> np.ndarray:
    """The recall filter over the matches among the special rows: lists each exclusion, returns the excluded rows."""
    flagged = FLAGGED_CODE[shard.review[special]]
    low = ~flagged & (shard.conf[special] < floor)
    window = ~flagged & ~low & ((shard.vfrom[special] > now_us) | (shard.vuntil[special] <= now_us))
    for mask, reason in ((flagged, "flagged"), (low, "below_floor"), (window, "out_of_window")):
        out.exclusions.extend((int(r), reason) for r in special[mask].tolist())
    return np.sort(special[flagged | low | window])


def rank_literal(shard: Shard, qtids: list[int], *, recall: bool, floor: float, now_us: int, limit: int,
                 prf_docs: int, feedback: Callable[[np.ndarray], dict[int, float]]) -> Pruned | None:
    """BM25-only ranking of a big shard (no vectors: every count exact), None below `LITERAL_MIN_ROWS`."""
    if shard.n < LITERAL_MIN_ROWS:
        return None
    scores = QueryScores(shard.lex, shard.n, qtids, shard.alive, shard.n_dead, shard.memo)
    if scores.matched <= prf_docs:  # whether feedback runs depends on the count of matches: score every row
        return None
    extra = feedback(scores.highest(prf_docs)[0])
    if extra:
        scores.add_feedback(extra)
    out = Pruned(rows=np.zeros(0, dtype=np.int64), score={}, lexical={}, similarity={}, total=scores.matched,
                 total_lexical=scores.matched, sample=0)
    excluded = np.zeros(0, dtype=np.int64)
    if recall:
        special = _specials(shard, floor)
        excluded = _exclude(shard, special[scores.is_lexical(special)], floor, now_us, out)
        if len(excluded) > 20_000:
            return None
    want = limit + len(excluded)
    while True:  # the best matches; a row only feedback terms reach is no match
        rows, values = scores.highest(want)
        keep = ~np.isin(rows, excluded) & scores.is_lexical(rows)
        if np.count_nonzero(keep) >= limit or len(rows) < want:
            break
        want *= 2
    rows, values = rows[keep], values[keep]
    order = np.lexsort((-rows, -values))[:limit]  # best first; ties go to the newer record, as rank_shard orders
    out.rows = rows[order]
    for r, v in zip(out.rows.tolist(), values[order].tolist()):
        out.score[r] = out.lexical[r] = v
    out.similarity = {}
    return out


def rank_pruned(shard: Shard, qtids: list[int], query: np.ndarray, *, lexical_weight: float, min_similarity: float,
                recall: bool, floor: float, now_us: int, limit: int, prf_docs: int,
                feedback: Callable[[np.ndarray], dict[int, float]]) -> Pruned | None:
    """Rank a big shard's rows exactly without every cosine (None: the bounds do not close, scan instead).

    `feedback(top_rows)` gives the pseudo-relevance feedback terms and weights, as
    rank_shard chooses them.
    """
    w = lexical_weight
    if not 0 < w < 1 or shard.vecs is None or int8_kernel() is None:
        return None
    scores = QueryScores(shard.lex, shard.n, qtids, shard.alive, shard.n_dead, shard.memo)
    if scores.matched <= prf_docs:  # whether feedback runs depends on the count of every match: scan
        return None
    lexical = scores.is_lexical
    cos = _Cosines(shard, query)
    none = np.zeros(0, dtype=np.int64)

    def lexical_only(rows: np.ndarray) -> np.ndarray:
        return np.ones(len(rows), dtype=bool)

    best = float(scores.highest(1)[1][0])
    top = _top(scores, best, prf_docs, cos, w, lexical_only, none)
    if top is None:
        return None
    extra = feedback(top[0])
    if extra:
        scores.add_feedback(extra)

    def matches(rows: np.ndarray) -> np.ndarray:
        """Lexical matches, and rows that only feedback terms reach whose cosine is high enough."""
        ok = lexical(rows)
        if not ok.all():
            other = rows[~ok]
            ok[~ok] = (cos.exact(other) >= min_similarity) & cos.has_vec[other]
        return ok

    if extra:  # the best score among matches: the best lexical match scores at least `best` now
        rows, values = scores.at_least(best)
        best = float(values[matches(rows)].max())

    out = Pruned(rows=none, score={}, lexical={}, similarity={}, total=0, total_lexical=scores.matched, sample=0)
    excluded = none
    if recall:
        special = _specials(shard, floor)
        if np.count_nonzero(~lexical(special)) > 20_000:  # too many to check one by one: scan instead
            return None
        excluded = _exclude(shard, special[matches(special)], floor, now_us, out)
    chosen = _top(scores, best, limit, cos, w, matches, excluded)
    if chosen is None:
        return None
    rows, fused = chosen
    vec_only, out.sample = _vector_only(shard, lexical, cos, min_similarity)
    out.total = scores.matched + int(round(vec_only))
    sims = cos.exact(rows)
    lexical_values = scores.exact(rows)
    out.rows = rows
    for r, f, s, lv in zip(rows.tolist(), fused.tolist(), sims.tolist(), lexical_values.tolist()):
        out.score[r], out.lexical[r], out.similarity[r] = f, lv, s
    return out
