"""Pseudo-relevance feedback: the rarest terms of a query's best few matches, added to it at a low weight.

Why: evidence is often phrased with other words than the question, and the best matches
found first tend to share those words. One round of feedback adds the `PRF_TERMS` terms
of the best `PRF_DOCS` candidates that weigh most by idf, each at a weight in
(0, `PRF_WEIGHT`]. It only re-orders candidates: a record that matches neither the query
nor its vector stays no match (search.py). Both ways of ranking a shard use it: the scan
of every row (fusion.py) and the bounds of a big shard (pruned.py).
"""

from __future__ import annotations

import numpy as np

from .index import Shard

__all__ = ["feedback_terms", "PRF_DOCS", "PRF_TERMS", "PRF_WEIGHT"]

PRF_DOCS = 5
PRF_TERMS = 10
PRF_WEIGHT = 0.3


def feedback_terms(shard: Shard, top_rows: np.ndarray, query_tids: list[int]) -> dict[int, float]:
    """Idf-weighted terms of the best rows that the query lacks, by term id, weights in (0, PRF_WEIGHT].

    A row's terms come from the forward index; ties go to the term that sorts first.
    """
    seen = set(query_tids)
    counts: dict[int, float] = {}
    lex = shard.lex
    for row in top_rows:
        for t in lex.terms_of(int(row))[0].tolist():
            if t not in seen:
                counts[t] = counts.get(t, 0.0) + lex.idf(t)
    best = sorted(counts.items(), key=lambda kv: (-kv[1], lex.vocabulary.terms[kv[0]]))[:PRF_TERMS]
    if not best:
        return {}
    top = best[0][1]
    return {t: PRF_WEIGHT * c / top for t, c in best}
