"""Feedback: people's judgements on recorded values, kept beside the runs they judge.

`store.feedback(run_id, "wrong")` says an answer was wrong; `"right"` that it was
right; `"score"` with `score=0.0–1.0` grades it. Several judgements per run are
kept (never overwritten), so disagreement stays visible. Blame, suspect runs and
the viewer read this table; nothing copies a verdict anywhere else.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Optional, get_args

from ...dbmeta import first_row
from ...errors import UsageError
from ...ids import new_id
from ...scope.paths import parse_path
from ...times import utc_now

Verdict = Literal["wrong", "right", "score"]
VERDICTS: tuple[str, ...] = get_args(Verdict)

FEEDBACK_DDL = """CREATE TABLE feedback (
    feedback_id VARCHAR, run_id VARCHAR, path VARCHAR, verdict VARCHAR, score DOUBLE, note VARCHAR,
    "by" VARCHAR, "at" TIMESTAMP)"""


@dataclass(frozen=True)
class Feedback:
    """One judgement of one value of one run."""

    feedback_id: str
    run_id: str
    path: str
    verdict: str
    score: Optional[float]
    note: Optional[str]
    by: Optional[str]
    at: datetime


def check(verdict: str, score: Optional[float]) -> Optional[float]:
    """The score to record for `verdict` (wrong = 0, right = 1), or a UsageError saying what is wrong."""
    if verdict not in VERDICTS:
        raise UsageError(f"feedback verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    if verdict == "score":
        if score is None or isinstance(score, bool) or not isinstance(score, (int, float)) \
                or not math.isfinite(score) or not 0 <= score <= 1:
            raise UsageError(f"feedback 'score' needs score=<a number from 0 to 1>, got {score!r}")
        return float(score)
    if score is not None:
        raise UsageError(f"feedback '{verdict}' takes no score (use verdict='score' to grade)")
    return 0.0 if verdict == "wrong" else 1.0


def record(con: Any, run_id: str, verdict: str, *, path: str, score: Optional[float], note: Optional[str],
           by: Optional[str]) -> Feedback:
    """Insert one judgement of `run_id`'s value at `path`; the run must exist."""
    value = check(verdict, score)
    head = first_row(con.execute("SELECT input FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise UsageError(f"no run '{run_id}' to give feedback on; list runs with `tracemem runs`")
    check_path(con, run_id, path, head[0])
    item = Feedback(new_id(), run_id, path, verdict, value, note, by, utc_now())
    con.execute("INSERT INTO feedback VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [item.feedback_id, run_id, path, verdict, value, note, by, item.at])
    return item


def check_path(con: Any, run_id: str, path: str, input_json: Optional[str]) -> None:
    """Refuse feedback on a value the run never had: `path` must be written by the run (or hold, or sit
    inside, a value it wrote) or be a field of its input; the error lists the paths it wrote."""
    field = str(parse_path(path)[0])  # a malformed path is a PathError naming it
    near = ("SELECT 1 FROM writes WHERE run_id = ? AND (path = ? OR starts_with(path, ? || '.') OR "
            "starts_with(path, ? || '[') OR starts_with(?, path || '.') OR starts_with(?, path || '[')) LIMIT 1")
    if first_row(con.execute(near, [run_id, path, path, path, path, path])) is not None:
        return
    given = json.loads(input_json) if input_json else {}
    if isinstance(given, dict) and field in given:
        return
    wrote = [r[0] for r in con.execute("SELECT DISTINCT path FROM writes WHERE run_id = ? ORDER BY path LIMIT 12",
                                       [run_id]).fetchall()]
    raise UsageError(f"run {run_id} has no value at '{path}' (never written, not in its input); judge one of the "
                     f"paths it wrote: {', '.join(wrote) or '(none)'}")


def judgements(con: Any, run_id: str) -> list[Feedback]:
    """Every judgement of a run, oldest first."""
    rows = con.execute('SELECT feedback_id, run_id, path, verdict, score, note, "by", "at" FROM feedback '
                       'WHERE run_id = ? ORDER BY "at"', [run_id]).fetchall()
    return [Feedback(*row) for row in rows]
