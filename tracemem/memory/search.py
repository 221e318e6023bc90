"""Ranking within a shard, and the honest-recall envelope a search returns.

Ranking. The literal path is BM25. The semantic path fuses BM25 (divided by its
best score among the candidates, so it lies in [0, 1]) with the cosine
similarity: `w * lexical + (1 - w) * cosine`, w being the embedder's
`lexical_weight`. Score fusion keeps the *margin* information that rank fusion
(RRF) throws away; on LoCoMo it is what lets BM25 + MiniLM reach 0.66 recall@10
where RRF of the two stays at 0.53 (the candidates and their fused score:
fusion.py). Both paths then run one round of pseudo-relevance feedback
(feedback.py): the rarest terms of the best few candidates are added to the
query at a low weight, which recovers evidence phrased with other words.
Feedback only re-orders candidates; it never makes a non-matching record match.

Honesty. A candidate is a live record of the subject that matches the query
(shares a query term, or is at least `min_similarity` close). With
`recall=True` every candidate that is flagged, under the floor or outside its
validity window is excluded *before* the top-k cut and counted, so that, when
the limit cuts nothing, `len(records) + excluded == total_before_filter`.
A shard of `PRUNED_MIN_ROWS` records or more, scanned through int8 codes, is
ranked through bounds instead (pruned.py): the same records and filters as a
float32 scan, but the count of records matching by vector alone is estimated
from a sample, and the result says so (`count_estimated`): there the equation
holds only approximately.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from .context import neighbour_lift, window_lift
from .feedback import PRF_DOCS, feedback_terms
from .fusion import Candidates, best_of
from .index import FLAGGED_CODE, MAX_US, MIN_US, REVIEW_CODE, Shard, from_micros, to_micros
from .pruned import rank_literal, rank_pruned
from .records import REVIEW_STATES, MemoryRecord
from .tables import MEMORY_COLUMNS
from .text import terms
from .vectors import PRUNED_MIN_ROWS

__all__ = ["ScoredRecord", "Exclusion", "SearchResult", "Ranking", "rank_shard", "agrees", "scored_records"]


class ScoredRecord(MemoryRecord):
    """A record as returned by search: its fused `score` and the two parts of it."""

    score: float
    lexical_score: float = 0.0
    similarity: float | None = None


class Exclusion(BaseModel):
    """A candidate that honest recall kept out, and why (for memory_uses rows)."""

    model_config = ConfigDict(frozen=True)

    memory_id: str
    reason: Literal["flagged", "below_floor", "out_of_window"]
    detail: str


class SearchResult(BaseModel):
    """The envelope: what was found, which path ran, and what was left out and why."""

    subject: str
    query: str
    records: list[ScoredRecord]
    mode: Literal["semantic", "literal"]
    requested_semantic: bool
    index_unavailable_reason: str | None = None
    caveat: str | None = None
    embedder_id: str | None = None
    recall_filtered: bool = False
    recall_floor: float | None = None
    now: datetime
    excluded_flagged: int = 0
    excluded_below_floor: int = 0
    excluded_out_of_window: int = 0
    total_before_filter: int = 0
    cut_by_limit: int = 0
    excluded: list[Exclusion] = []
    scan: Literal["float32", "int8", "pruned"] | None = None  # how vectors were scanned (None: no vector search ran)
    scan_recall: float | None = None  # int8 only: top-10 recall vs float32, measured when the index was saved
    count_estimated: bool = False  # pruned: vector-only matches estimated from a sample (see memory/pruned.py)
    total_lexical: int | None = None  # pruned: the matches that share a query term (counted exactly)
    count_sample: int | None = None  # pruned: how many of the shard file's rows the estimate sampled

    @property
    def excluded_total(self) -> int:
        """Records recall kept out: flagged + below the floor + out of their window."""
        return self.excluded_flagged + self.excluded_below_floor + self.excluded_out_of_window

    @property
    def no_match(self) -> bool:
        """True when nothing of the subject matched the query (as opposed to all being filtered out)."""
        return self.total_before_filter == 0

    @property
    def degraded(self) -> bool:
        """Semantic search was asked for but a literal scan ran instead."""
        return self.requested_semantic and self.mode == "literal"

    def to_dict(self) -> dict[str, Any]:
        """The envelope as JSON-able data (what the recall stage writes as its receipt)."""
        return self.model_dump(mode="json")

    def receipt(self) -> str:
        """A few human lines: the path that ran, why, and every count."""
        lines: list[str] = []
        if self.mode == "semantic":
            lines.append(f"semantic search ({self.embedder_id}) for subject {self.subject!r}")
        elif self.requested_semantic:
            lines.append(f"literal scan for subject {self.subject!r} — semantic search unavailable: "
                         f"{self.index_unavailable_reason}")
        else:
            lines.append(f"literal search (BM25) for subject {self.subject!r}")
        if self.no_match:
            lines.append("no match: no record of this subject matches the query")
        elif self.count_estimated:
            lines.append(f"{len(self.records)} returned of about {self.total_before_filter} matching: "
                         f"{self.total_lexical} share a query term (counted exactly), about "
                         f"{self.total_before_filter - (self.total_lexical or 0)} more by vector similarity alone "
                         f"(estimated from {self.count_sample} sampled records)")
        else:
            lines.append(f"{len(self.records)} returned of {self.total_before_filter} matching"
                         + (f" ({self.cut_by_limit} beyond the limit)" if self.cut_by_limit else ""))
        if self.recall_filtered:
            lines.append(f"recall filter (floor {self.recall_floor:g}): excluded {self.excluded_flagged} flagged, "
                         f"{self.excluded_below_floor} below floor, {self.excluded_out_of_window} out of window")
        if self.scan == "int8":
            measured = (f"top-10 recall {self.scan_recall:.3f} against a float32 scan, measured when the index "
                        f"was saved" if self.scan_recall is not None else "recall against float32 not measured yet")
            lines.append(f"approximate vector scan (int8, best candidates re-scored in float32): {measured}")
        if self.scan == "pruned":
            lines.append("float32 similarities only for the records whose BM25 part or int8 bound lets them reach "
                         "the top: the same ranking and filters as a float32 scan of every record")
        if self.caveat:
            lines.append(f"caveat: {self.caveat}")
        return "\n".join(lines)


@dataclass
class Ranking:
    """Output of rank_shard: chosen rows best-first with their score parts, and the counts."""

    rows: np.ndarray
    score: np.ndarray | dict[int, float]  # by row (a dict: only the chosen rows)
    lexical: np.ndarray | dict[int, float]
    similarity: np.ndarray | dict[int, float] | None
    total: int = 0
    cut: int = 0
    exclusions: list[tuple[int, str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"flagged": 0, "below_floor": 0, "out_of_window": 0})
    scan: str | None = None  # "pruned" when rank_pruned ranked (else the vectors' scan mode applies)
    total_lexical: int | None = None
    sample: int | None = None

    def count_fields(self) -> dict[str, Any]:
        """The SearchResult fields that say whether `total` is counted or estimated."""
        return {"count_estimated": bool(self.sample), "total_lexical": self.total_lexical, "count_sample": self.sample}


def rank_shard(shard: Shard, query: str, *, query_vec: np.ndarray | None, lexical_weight: float,
               min_similarity: float, recall: bool, floor: float, now: datetime, limit: int | None,
               context_weight: float = 0.0, context_window: int = 0) -> Ranking:
    """Score the shard's live rows (with their neighbours' and their stretch of the conversation's, context.py),
    filter candidates, cut to `limit`."""
    n = shard.n
    qtids = shard.lex.lookup(terms(query))
    vecs = shard.vecs
    bounded = n >= (vecs.pruned_min_rows if vecs is not None else PRUNED_MIN_ROWS)  # ranked through bounds, no context
    if limit is not None and (query_vec is None or (vecs is not None and vecs.mode() == "int8" and bounded)):
        pruned = _pruned(shard, qtids, query_vec, lexical_weight, min_similarity, recall, floor, now, limit)
        if pruned is not None:
            return pruned
    found = Candidates(shard, qtids, query_vec, lexical_weight, min_similarity)
    found.add_feedback()
    rows = found.rows
    out = Ranking(rows=rows, score=np.zeros(n), lexical=np.zeros(n), similarity=found.similarity, total=len(rows))
    eligible = _recall_filter(shard, rows, out, floor, now) if recall and len(rows) else np.ones(len(rows), dtype=bool)
    found.rescore(eligible, limit)
    score_c = found.fused()
    if context_weight > 0 and len(rows) and not bounded:
        score_c = score_c + neighbour_lift(found.every_fused(), shard.alive[:n], rows, context_weight)
        score_c = score_c + window_lift(rows, np.where(eligible, score_c, -np.inf), shard.alive[:n], context_window)
    out.score[rows] = score_c
    out.lexical[rows] = found.lexical
    keep = rows[eligible]
    score = out.score
    if limit is not None and len(keep) > limit:
        out.cut = len(keep) - limit
        keep = keep[best_of(keep, score[keep], limit)]
    # best first; ties go to the newer record (higher row)
    order = np.lexsort((-keep, -score[keep]))
    out.rows = keep[order]
    return out


def _recall_filter(shard: Shard, cand_rows: np.ndarray, out: Ranking, floor: float, now: datetime) -> np.ndarray:
    """Which candidates honest recall keeps; each one it keeps out is counted and noted in `out`."""
    now_us = to_micros(now, 0)
    flagged = FLAGGED_CODE[shard.review[cand_rows]]
    low = ~flagged & (shard.conf[cand_rows] < floor)
    window = ~flagged & ~low & ((shard.vfrom[cand_rows] > now_us) | (shard.vuntil[cand_rows] <= now_us))
    for mask, reason in ((flagged, "flagged"), (low, "below_floor"), (window, "out_of_window")):
        out.counts[reason] = int(mask.sum())
        for row in cand_rows[mask]:
            out.exclusions.append((int(row), reason, _detail(shard, int(row), reason, floor)))
    return ~(flagged | low | window)


def _pruned(shard: Shard, qtids: list[int], query_vec: np.ndarray | None, lexical_weight: float,
            min_similarity: float, recall: bool, floor: float, now: datetime, limit: int) -> Ranking | None:
    """rank_pruned's (rank_literal's without a query vector) answer as a Ranking; None: score every row instead."""
    args = dict(recall=recall, floor=floor, now_us=to_micros(now, 0), limit=limit, prf_docs=PRF_DOCS,
                feedback=lambda top: feedback_terms(shard, top, qtids))
    if query_vec is None:
        got = rank_literal(shard, qtids, **args)  # type: ignore[arg-type]
    else:
        got = rank_pruned(shard, qtids, query_vec, lexical_weight=lexical_weight, min_similarity=min_similarity,
                          **args)  # type: ignore[arg-type]
    if got is None:
        return None
    out = Ranking(rows=got.rows, score=got.score, lexical=got.lexical, similarity=got.similarity if query_vec is not None
                  else None, total=got.total, scan="pruned" if query_vec is not None else None,
                  total_lexical=got.total_lexical if query_vec is not None else None, sample=got.sample or None)
    for row, reason in got.exclusions:
        out.counts[reason] += 1
        out.exclusions.append((row, reason, _detail(shard, row, reason, floor)))
    out.cut = max(0, got.total - len(got.exclusions) - len(got.rows))
    return out


def _detail(shard: Shard, row: int, reason: str, floor: float) -> str:
    if reason == "flagged":
        return f"review_state={REVIEW_STATES[int(shard.review[row])]}"
    if reason == "below_floor":
        return f"confidence {float(shard.conf[row]):g} < floor {floor:g}"
    lo, hi = from_micros(int(shard.vfrom[row])), from_micros(int(shard.vuntil[row]))
    return f"outside validity window [{lo.isoformat() if lo else '-inf'}, {hi.isoformat() if hi else '+inf'})"


def agrees(shard: Shard, row: int, rec: Sequence[Any], subject: str) -> bool:
    """Whether a record read from DuckDB is what the index ranked and filtered (subject, liveness, filters)."""
    data = dict(zip(MEMORY_COLUMNS, rec))
    return (data["subject"] == subject and data["deleted_at"] is None and bool(shard.alive[row])
            and REVIEW_CODE[data["review_state"]] == int(shard.review[row])
            and float(data["confidence"]) == float(shard.conf[row])
            and to_micros(data["valid_from"], MIN_US) == int(shard.vfrom[row])
            and to_micros(data["valid_until"], MAX_US) == int(shard.vuntil[row]))


def scored_records(shard: Shard, ranking: Ranking, subject: str,
                   fetch: Callable[[Sequence[str]], list[tuple[Any, ...]]]) -> list[ScoredRecord] | None:
    """The ranked rows as records read from DuckDB (`fetch` by ids); None if the table contradicts the index."""
    ids = [shard.id_at(int(r)) for r in ranking.rows]
    by_id = {r[0]: r for r in fetch(ids)}  # type: ignore[arg-type]
    records = []
    for row, mid in zip(ranking.rows.tolist(), ids):
        rec = by_id.get(mid)
        if rec is None or not agrees(shard, row, rec, subject):
            return None
        sim = None if ranking.similarity is None else float(ranking.similarity[row])
        records.append(ScoredRecord(**dict(zip(MEMORY_COLUMNS, rec)), score=float(ranking.score[row]),
                                    lexical_score=float(ranking.lexical[row]), similarity=sim))
    return records
