"""Blame across many answers: which sources go with the answers people marked wrong.

This is spectrum-based fault localisation, as used to find faulty lines from
failing and passing tests: each run judged wrong is a failing test, each run
judged right a passing one, and each source it used (memories injected, prompt
sections by their source, stages of a pipeline version, models, tools, past runs
loaded as snapshots) a line it covered. A source is scored with Ochiai,

    ochiai = ef / sqrt((ef + nf) * (ef + ep))

where ef / ep are the wrong / right runs that used it and nf the wrong runs that did
not. The counts are reported beside the score. It is statistical: a source that
always rides along with a faulty one scores as high; `trace.counterfactual` tests
one source causally.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from ..errors import UsageError
from ..times import utc_naive

BASIS = ("statistical: Ochiai spectrum-based fault localisation over runs judged wrong vs right; "
         "co-occurrence, not cause — test a source with trace.counterfactual")
FILTERS = ("pipeline", "pipeline_hash", "subject")

# Each source a run (or one of its child runs: `family`) used: (run, kind, id).
SOURCES_SQL = """
    SELECT run_id, 'memory' AS kind, memory_id AS id FROM memory_uses
        WHERE outcome = 'injected' AND run_id IN (SELECT run_id FROM family)
    UNION SELECT run_id, 'section', source_kind || ':' || source_id FROM prompt_sections
        WHERE source_kind IS NOT NULL AND source_id IS NOT NULL AND source_kind <> 'memory'
        AND run_id IN (SELECT run_id FROM family)
    UNION SELECT s.run_id, 'stage', s.stage || '@' || r.pipeline_hash FROM steps s JOIN runs r USING (run_id)
        WHERE s.status = 'ok' AND s.run_id IN (SELECT run_id FROM family)
    UNION SELECT run_id, 'model', model FROM model_calls
        WHERE model IS NOT NULL AND run_id IN (SELECT run_id FROM family)
    UNION SELECT run_id, 'snapshot', source_run_id FROM snapshot_uses WHERE run_id IN (SELECT run_id FROM family)"""


@dataclass(frozen=True)
class Blamed:
    """One source's score and the counts behind it."""

    kind: str
    id: str
    score: float  # Ochiai, 0..1
    wrong_with: int  # ef: runs judged wrong that used it
    right_with: int  # ep: runs judged right that used it
    wrong_without: int  # nf: runs judged wrong that did not


@dataclass
class BlameReport:
    """Sources ranked by how strongly they go with wrong answers (most suspicious first)."""

    ranked: list[Blamed]
    wrong: int  # runs judged wrong
    right: int  # runs judged right
    basis: str = BASIS

    def __str__(self) -> str:
        lines = [f"blame over {self.wrong} wrong and {self.right} right runs ({self.basis})"]
        for b in self.ranked:
            lines.append(f"  {b.score:.3f}  {b.kind}:{b.id}  wrong with {b.wrong_with}, right with {b.right_with}, "
                         f"wrong without {b.wrong_without}")
        return "\n".join(lines)


def blame(con: Any, *, path: str = "answer", where: Optional[dict[str, Any]] = None,
          since: Optional[datetime] = None, until: Optional[datetime] = None, limit: int = 20,
          tool_sources: bool = False) -> BlameReport:
    """Rank sources by Ochiai over the runs judged on `path` (the latest judgement of each run counts),
    optionally only runs matching `where` ({"pipeline": ..., "subject": ..., "pipeline_hash": ...})."""
    clauses, params = ["f.path = ?"], [path]
    for column, value in (where or {}).items():
        if column not in FILTERS:
            raise UsageError(f"blame(where=...) filters on {', '.join(FILTERS)}, not {column!r}")
        clauses.append(f"r.{column} = ?")
        params.append(value)
    for op, when in ((">=", since), ("<", until)):
        if when is not None:
            clauses.append(f"r.started_at {op} ?")
            params.append(utc_naive(when))
    sources = SOURCES_SQL + ("\n    UNION SELECT run_id, 'tool', name FROM tool_calls "
                             "WHERE run_id IN (SELECT run_id FROM family)" if tool_sources else "")
    # each judged run's latest judgement (a window, not DuckDB's arg_max: the same SQL runs on PostgreSQL)
    latest = f"""SELECT run_id, bad FROM (
            SELECT f.run_id, (f.verdict = 'wrong' OR (f.verdict = 'score' AND f.score < 0.5)) AS bad,
                   row_number() OVER (PARTITION BY f.run_id ORDER BY f."at" DESC) AS nth
            FROM feedback f JOIN runs r USING (run_id) WHERE {' AND '.join(clauses)}) judgements WHERE nth = 1"""
    rows = con.execute(f"""
        WITH RECURSIVE judged AS ({latest}),
        family(root, run_id) AS (  -- a judged run and its subflow runs
            SELECT run_id, run_id FROM judged
            UNION ALL SELECT fa.root, r.run_id FROM runs r JOIN family fa ON r.parent_run_id = fa.run_id),
        used AS (SELECT DISTINCT fa.root AS run_id, s.kind, s.id FROM ({sources}) s JOIN family fa USING (run_id))
        SELECT u.kind, u.id, count(*) FILTER (WHERE j.bad), count(*) FILTER (WHERE NOT j.bad)
        FROM used u JOIN judged j USING (run_id) GROUP BY u.kind, u.id""", params).fetchall()
    totals = con.execute(f"SELECT count(*) FILTER (WHERE bad), count(*) FILTER (WHERE NOT bad) FROM ({latest}) j",
                         params).fetchall()[0]
    wrong, right = int(totals[0]), int(totals[1])
    ranked = []
    for kind, id_, ef, ep in rows:
        score = ef / math.sqrt(wrong * (ef + ep)) if wrong and ef else 0.0
        ranked.append(Blamed(kind, id_, round(score, 4), ef, ep, wrong - ef))
    ranked.sort(key=lambda b: (-b.score, -b.wrong_with, b.right_with, b.kind, b.id))
    return BlameReport(ranked[:limit], wrong, right)
