"""Conversation context: a record's score is lifted by the records remembered just before and after it.

Why: memories are remembered as a conversation goes, one turn (or the facts of
one turn) after another, and a turn is often only understood next to its
neighbours: "5 years already!" answers "how long have you been married?" asked
just before it. A search that matches the question turn should also bring up
the answer. So each candidate's fused score gets `weight` times the better of
its two neighbours' scores (the live records written just before and after it
for the same subject; a negative neighbour lifts nothing).

A conversation also dwells on a topic for a while: the turns around a strong match are
more likely to matter than turns far from any. So, with the neighbours' lift added, each of
the `POOL` best candidates gets `CONTEXT_WINDOW_WEIGHT` times the best score among those
`POOL` written within `window` records of it (its own included): a candidate in a stretch
of the conversation that matches well rises above an equal one alone.

What it never does: make a record match. Only candidates (records sharing a
query term, or close enough by vector) are re-ordered; the counts and the
honest-recall filters are untouched, and a neighbour that is flagged or out of
its window may lift a candidate but is never returned itself. The weight was
chosen on LoCoMo conversations 0-4 and checked on 5-9 (bench/memory.py); a
memory whose records are unrelated one to the next sets it to 0
(`Memory(..., context_weight=0)`). A subject of PRUNED_MIN_ROWS (250,000) records
or more is ranked without it, whichever scan runs: such a subject is ranked
through bounds (pruned.py), which return exactly what a float32 scan without
context returns.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CONTEXT_WEIGHT", "CONTEXT_WINDOW", "neighbour_lift", "window_lift"]

CONTEXT_WEIGHT = 0.5
CONTEXT_WINDOW, CONTEXT_WINDOW_WEIGHT, POOL = 5, 0.5, 50  # (chosen on LoCoMo conversations 0-4, as the weight)


def live_positions(rows: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Each row's place among the live rows (the rows themselves when no record was deleted, the common case)."""
    return rows if alive.all() else np.searchsorted(np.flatnonzero(alive), rows)


def neighbour_lift(score_all: np.ndarray, alive: np.ndarray, rows: np.ndarray, weight: float) -> np.ndarray:
    """`weight` times the better score of each row's nearest live neighbours before and after it, floored at 0.

    `score_all` holds the fused score of every row of the shard (0 where a row matches nothing),
    `alive` which rows are live; `rows` (live, ascending or not) are the candidates to lift. Rows
    follow the order of writes (a changed record moves to the end, as a rebuilt index orders them).
    """
    alive = alive[:len(score_all)]
    if weight <= 0 or not len(rows) or np.count_nonzero(alive) < 2:
        return np.zeros(len(rows))
    at = live_positions(rows, alive)
    live_scores = score_all if alive.all() else score_all[alive]
    ext = np.concatenate([[0.0], live_scores, [0.0]])  # live scores, padded at both ends
    best = np.maximum(ext[at], ext[at + 2])  # ext[at + 1] is the row itself
    return weight * np.maximum(best, 0.0)


def window_lift(rows: np.ndarray, score: np.ndarray, alive: np.ndarray, window: int,
                weight: float = CONTEXT_WINDOW_WEIGHT) -> np.ndarray:
    """`weight` times the best score among the `POOL` best candidates written within `window` live records of
    each of them (itself included); 0 for the other candidates. `score` holds each candidate's score, -inf for
    one that honest recall keeps out (it lifts nothing and is never lifted); `alive` which rows are live (a
    deleted record leaves no gap: a rebuilt index ranks alike). Rows follow the order of writes."""
    lift = np.zeros(len(rows))
    if window <= 0 or not len(rows):
        return lift
    best = np.argpartition(-score, POOL - 1)[:POOL] if len(score) > POOL else np.arange(len(score))  # (any order)
    best = best[np.isfinite(score[best])]
    if not len(best):
        return lift
    at, scores = live_positions(rows[best], alive), score[best]
    near = np.abs(at[:, None] - at[None, :]) <= window
    lift[best] = weight * np.maximum(np.where(near, scores[None, :], -np.inf).max(axis=1), 0.0)
    return lift
