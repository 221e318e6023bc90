"""A query's candidates when every row of a shard is scanned, and their fused score: BM25 with the cosine.

The fused score of a candidate is `w * lexical / best + (1 - w) * cosine`: its BM25
score divided by the best among the candidates (so it lies in [0, 1]), weighed against
its cosine similarity, w being the embedder's `lexical_weight` (search.py says why
scores are fused, not ranks). The parts change while one search runs: feedback terms
add to the BM25 part (feedback.py), and float32 values replace the int8 estimates of
the cosine for the candidates that can reach the top. `Candidates` holds the parts and
fuses them the one way every reader needs: the feedback round, the re-scoring, the
ranking, and the lift a candidate gives its neighbours (context.py).
"""

from __future__ import annotations

import numpy as np

from .feedback import PRF_DOCS, feedback_terms
from .index import Shard
from .vectors import RERANK

__all__ = ["Candidates", "Cosines", "best_of"]


class Cosines:
    """Candidate similarities; int8 estimates are replaced by float32 values for the best candidates."""

    def __init__(self, shard: Shard, query: np.ndarray, rows: np.ndarray, sim: np.ndarray, approximate: bool) -> None:
        self.shard, self.query, self.rows = shard, query, rows
        self.sim = sim[rows]
        self.estimated = np.full(len(rows), approximate)

    def rerank(self, score: np.ndarray, eligible: np.ndarray, k: int | None) -> None:
        """Re-score in float32 the best `k + RERANK` eligible candidates by `score` (all when k is None)."""
        el = np.flatnonzero(eligible & self.estimated)
        if not len(el):
            return
        pool = k + RERANK if k is not None else len(el)
        if len(el) > pool:
            el = el[np.argpartition(-score[el], pool - 1)[:pool]]
        assert self.shard.vecs is not None
        self.sim[el] = self.shard.vecs.exact(self.rows[el], self.query)
        self.estimated[el] = False


class Candidates:
    """The live rows that match a query (share a query term, or are at least `min_similarity` close) and
    their score parts: BM25 (`lexical`, feedback terms included once added) and the cosine."""

    def __init__(self, shard: Shard, qtids: list[int], query_vec: np.ndarray | None, lexical_weight: float,
                 min_similarity: float) -> None:
        n = shard.n
        alive = shard.alive[:n]
        lex = shard.lex.score(qtids, n)
        if shard.n_dead:
            lex[~alive] = 0.0
        self.shard, self.qtids, self.lexical_weight = shard, qtids, lexical_weight
        self.every_lexical = lex  # every row's BM25 of the query alone
        self.similarity: np.ndarray | None = None  # every row's cosine (None: a literal search)
        self.cosines: Cosines | None = None  # the candidates' cosines
        if query_vec is None:
            self.rows = np.flatnonzero(lex > 0)  # dead rows scored 0 above
        else:
            self.similarity, approximate = _similarities(shard, query_vec)
            cand = (lex > 0) | (self.similarity >= min_similarity)  # a row without a vector has sim 0: no match by it
            if min_similarity <= 0:
                cand &= shard.has_vec[:n] | (lex > 0)
            if shard.n_dead:
                cand &= alive
            self.rows = np.flatnonzero(cand)
            self.cosines = Cosines(shard, query_vec, self.rows, self.similarity, approximate)
        self.lexical = lex[self.rows]

    def fused(self) -> np.ndarray:
        """The candidates' fused scores (their BM25 alone in a literal search)."""
        if self.cosines is None:
            return self.lexical
        best = self.lexical.max() if len(self.lexical) else 0.0
        norm = self.lexical / best if best > 0 else self.lexical
        return self.lexical_weight * norm + (1.0 - self.lexical_weight) * self.cosines.sim

    def add_feedback(self) -> None:
        """One round of pseudo-relevance feedback (feedback.py) when there are more than PRF_DOCS candidates:
        the best of them, by float32 scores, lend their terms to every candidate's BM25 part."""
        if len(self.rows) <= PRF_DOCS:
            return
        if self.cosines is not None:
            self.cosines.rerank(self.fused(), np.ones(len(self.rows), dtype=bool), PRF_DOCS)
        top = self.rows[best_of(self.rows, self.fused(), PRF_DOCS)]
        extra = feedback_terms(self.shard, top, self.qtids)
        if extra:
            self.lexical = self.lexical + self.shard.lex.score(extra.keys(), self.shard.n, extra)[self.rows]

    def rescore(self, eligible: np.ndarray, limit: int | None) -> None:
        """Float32 cosines for the eligible candidates that can reach the top `limit`, written back to
        `similarity` (a float32 scan has them all already)."""
        if self.cosines is None:
            return
        self.cosines.rerank(self.fused(), eligible, limit)
        assert self.similarity is not None
        self.similarity[self.rows] = self.cosines.sim

    def every_fused(self) -> np.ndarray:
        """Every row's own fused score (the candidates' with their feedback terms): what lifts a neighbour."""
        score_all = self.every_lexical.astype(np.float64)
        score_all[self.rows] = self.lexical
        if self.similarity is None:
            return score_all
        best = self.lexical.max()
        w = self.lexical_weight
        return w * (score_all / best if best > 0 else score_all) + (1.0 - w) * self.similarity


def _similarities(shard: Shard, query_vec: np.ndarray) -> tuple[np.ndarray, bool]:
    """Cosine of every row (0 without a vector), and whether the values are int8 estimates."""
    assert shard.vecs is not None
    sim, approximate = shard.vecs.scan(query_vec)
    if shard.indexed_count() < shard.n:  # rows stored without a vector (or dead ones): cosine 0
        sim = np.where(shard.has_vec[: shard.n], sim, np.float32(0.0))
    return sim, approximate


def best_of(rows: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k best rows by score, ties to the newer record (higher row): the same k every time."""
    if len(rows) <= k:
        return np.arange(len(rows))
    kth = score[np.argpartition(-score, k - 1)[k - 1]]
    near = np.flatnonzero(score >= kth)
    return near[np.lexsort((-rows[near], -score[near]))[:k]] if len(near) > k else near
