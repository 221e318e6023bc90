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
one source causally, and `verify=k` (`verified`) tests many: each wrong answer's
answering model call is re-asked without its top k sources (`tracemem.trace.why`),
and a source that decided more wrong answers ranks first. Sources are those `why`
names: a prompt section that only carries recall (the [Memory] intro) is none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from ...errors import UsageError
from ...times import utc_naive
from ...trace.ranked import why

BASIS = ("statistical: Ochiai spectrum-based fault localisation over runs judged wrong vs right; "
         "co-occurrence, not cause — test a source with trace.counterfactual")
FILTERS = ("pipeline", "pipeline_hash", "subject")
VERIFIED = ("verified: each of {n} wrong answer(s) re-asked without its top {k} source(s) (tracemem.trace.why); "
            "sources that decided more of them first, then Ochiai")
KIND_ORDER = {"memory": 0, "snapshot": 1, "tool": 2, "section": 3, "model": 4, "stage": 5}  # what was brought in,
# before what carried it, when the statistics tie

# Each source a run (or one of its child runs: `family`) used: (run, kind, id).
SOURCES_SQL = """
    SELECT run_id, 'memory' AS kind, memory_id AS id FROM memory_uses
        WHERE outcome = 'injected' AND run_id IN (SELECT run_id FROM family)
    UNION SELECT run_id, 'section', source_kind || ':' || source_id FROM prompt_sections
        WHERE source_kind IS NOT NULL AND source_id IS NOT NULL AND source_kind NOT IN ('memory', 'recall')
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
    decided: Optional[int] = None  # verified: wrong answers it was decisive for (None: not verified)
    change: float = 0.0  # verified: how much those answers changed without it, summed


@dataclass
class BlameReport:
    """Sources ranked by how strongly they go with wrong answers (most suspicious first)."""

    ranked: list[Blamed]
    wrong: int  # runs judged wrong
    right: int  # runs judged right
    basis: str = BASIS
    verified: int = 0  # wrong runs whose answering call was re-asked (verify=k)

    def __str__(self) -> str:
        lines = [f"blame over {self.wrong} wrong and {self.right} right runs ({self.basis})"]
        for b in self.ranked:
            decided = f"decided {b.decided} of {self.verified} verified wrong answers; " if b.decided is not None else ""
            lines.append(f"  {b.score:.3f}  {b.kind}:{b.id}  {decided}wrong with {b.wrong_with}, right with "
                         f"{b.right_with}, wrong without {b.wrong_without}")
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
    ranked.sort(key=lambda b: (-b.score, -b.wrong_with, b.right_with, KIND_ORDER.get(b.kind, 9), b.kind, b.id))
    return BlameReport(ranked[:limit], wrong, right)


def _key(trace: Any, cause: Any) -> Optional[tuple[str, str]]:
    """The (kind, id) blame counts a `why` cause under (None: a kind blame does not count)."""
    d = trace.graph.nodes[cause.node]
    if cause.kind == "memory":
        return "memory", cause.cut["memory_id"]
    if cause.kind == "prompt" and d.get("source_kind") and d.get("source_id"):
        return "section", f"{d['source_kind']}:{d['source_id']}"
    if cause.kind == "tool":
        return "tool", d["name"]
    if cause.kind == "snapshot":
        return "snapshot", d["run_id"]
    return None


def verified(store: Any, report: BlameReport, wrong_runs: list[str], path: str, k: int, model: Any = None,
             env: Any = None) -> BlameReport:
    """`report` re-ranked by verification: each of `wrong_runs` answered `why(run, path, verify=k)` (k model
    calls each, recorded); sources that decided more wrong answers first (then by how much the answers
    changed without them, then by Ochiai). A source no run tested keeps its place after those tested."""
    decided: dict[tuple[str, str], list[float]] = {}
    tested: set[tuple[str, str]] = set()
    for run_id in wrong_runs:
        answer = why(store.run(run_id), path, verify=k, model=model, env=env, store=store)
        for cause in answer.causes:
            key = _key(answer.trace, cause)
            if key is None or cause.decisive is None:
                continue
            tested.add(key)
            if cause.decisive:
                decided.setdefault(key, []).append(cause.change or 0.0)
    ranked = [Blamed(b.kind, b.id, b.score, b.wrong_with, b.right_with, b.wrong_without,
                     len(decided.get((b.kind, b.id), ())) if (b.kind, b.id) in tested else None,
                     round(sum(decided.get((b.kind, b.id), ())), 4)) for b in report.ranked]
    ranked.sort(key=lambda b: (b.decided is None, -(b.decided or 0), -b.change))  # stable: Ochiai order within
    return BlameReport(ranked, report.wrong, report.right, VERIFIED.format(n=len(wrong_runs), k=k), len(wrong_runs))


def wrong_runs(con: Any, path: str, limit: int) -> list[str]:
    """The latest `limit` runs whose latest judgement on `path` says wrong."""
    return [r[0] for r in con.execute("""
        SELECT run_id FROM (SELECT run_id, verdict, score, "at", row_number() OVER (PARTITION BY run_id
                            ORDER BY "at" DESC) AS nth FROM feedback WHERE path = ?) latest
        WHERE nth = 1 AND (verdict = 'wrong' OR (verdict = 'score' AND score < 0.5))
        ORDER BY "at" DESC, run_id LIMIT ?""", [path, int(limit)]).fetchall()]
