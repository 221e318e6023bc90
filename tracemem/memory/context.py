"""Conversation context: a record's score is lifted by the records remembered just before and after it.

Why: memories are remembered as a conversation goes, one turn (or the facts of
one turn) after another, and a turn is often only understood next to its
neighbours: "5 years already!" answers "how long have you been married?" asked
just before it. A search that matches the question turn should also bring up
the answer. So each candidate's fused score gets `weight` times the better of
its two neighbours' scores (the live records written just before and after it
for the same subject; a negative neighbour lifts nothing).

What it never does: make a record match. Only candidates (records sharing a
query term, or close enough by vector) are re-ordered; the counts and the
honest-recall filters are untouched, and a neighbour that is flagged or out of
its window may lift a candidate but is never returned itself. The weight was
chosen on LoCoMo conversations 0-4 and checked on 5-9 (bench/memory.py); a
memory whose records are unrelated one to the next sets it to 0
(`Memory(..., context_weight=0)`). A subject of INT8_MIN_ROWS (250,000) records
or more is ranked without it, whichever scan runs: such a subject is ranked
through bounds (pruned.py), which return exactly what a float32 scan without
context returns.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CONTEXT_WEIGHT", "neighbour_lift"]

CONTEXT_WEIGHT = 0.5


def neighbour_lift(score_all: np.ndarray, alive: np.ndarray, rows: np.ndarray, weight: float) -> np.ndarray:
    """`weight` times the better score of each row's nearest live neighbours before and after it, floored at 0.

    `score_all` holds the fused score of every row of the shard (0 where a row matches nothing),
    `alive` which rows are live; `rows` (live, ascending or not) are the candidates to lift. Rows
    follow the order of writes (a changed record moves to the end, as a rebuilt index orders them).
    """
    n = len(score_all)
    live = np.flatnonzero(alive[:n])
    if weight <= 0 or not len(rows) or len(live) < 2:
        return np.zeros(len(rows))
    at = np.searchsorted(live, rows)  # each candidate's place among the live rows
    ext = np.concatenate([[0.0], score_all[live], [0.0]])  # live scores, padded at both ends
    best = np.maximum(ext[at], ext[at + 2])  # ext[at + 1] is the row itself
    return weight * np.maximum(best, 0.0)
