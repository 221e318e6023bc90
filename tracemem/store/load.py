"""Loading recorded runs back from DuckDB as the same `Run` object the runner returns,
and a conversation thread's writes in bulk."""
from __future__ import annotations

import json
from typing import Any, Optional

from ..dbmeta import first_row
from ..errors import TracememError
from ..record import Decision, Read, Step, ThreadRun, Write
from ..run import Run
from ..scope.known import known_scopes
from ..scope.schema import ScopeSchema
from .batch import COLUMNS, EXTRA_TABLES

_CHAIN = """WITH RECURSIVE chain(run_id, continues, depth) AS (
    SELECT run_id, continues_run_id, 0 FROM runs WHERE run_id = ?
    UNION ALL SELECT r.run_id, r.continues_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.run_id = c.continues)"""


def thread(con: Any, run_id: str, root: Optional[str] = None) -> list[ThreadRun]:
    """The thread ending at `run_id`, oldest first, in two queries however long it is: each run's
    recorded input, whether it starts the thread, and its committed writes (to field `root` only, when
    given; failed steps left out)."""
    chain = con.execute(_CHAIN + """ SELECT c.run_id, r.input, c.continues IS NULL FROM chain c
        JOIN runs r USING (run_id) ORDER BY c.depth DESC""", [run_id]).fetchall()
    if not chain:
        raise TracememError(f"no run '{run_id}' in the store")
    only = "" if root is None else \
        "AND (w.path = ? OR starts_with(w.path, ? || '[') OR starts_with(w.path, ? || '.'))"
    writes = con.execute(_CHAIN + f""" SELECT w.run_id, w.step, w.seq, w.path, w.verb, w.value FROM writes w
        JOIN chain USING (run_id) WHERE true {only}
        AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = w.run_id AND s.step = w.step AND s.status <> 'ok')
        ORDER BY w.run_id, w.step, w.seq""", [run_id] + ([] if root is None else [root, root, root])).fetchall()
    by_run: dict[str, list[Write]] = {}
    for rid, *w in writes:
        by_run.setdefault(rid, []).append(Write(*w))
    return [ThreadRun(rid, json.loads(input_json), bool(first), by_run.get(rid, []))
            for rid, input_json, first in chain]


def load_run(store: Any, con: Any, run_id: str, schema: Optional[ScopeSchema]) -> Run:
    """Run `run_id` with every row it recorded (and its child runs); `store` is kept as its loader."""
    head = first_row(con.execute(
        "SELECT pipeline, pipeline_hash, status, error, epoch_ns(started_at), epoch_ns(ended_at), input, output, "
        "parent_run_id, parent_step, subject, query, trace_id, continues_run_id, degraded, pending, resume_at, "
        "forked_from_run_id, forked_from_step, span_id, counterfactual FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise TracememError(f"no run '{run_id}' in {store.path}; list runs with `tracemem runs` or store.runs()")
    (pipeline, phash, status, error, started, ended, input_json, output_json, parent, parent_step, subject, query,
     trace_id, continues, degraded, pending, resume_at, forked_from, forked_step, span_id, counterfactual) = head
    run = Run(run_id=run_id, pipeline=pipeline, pipeline_hash=phash,
              schema=schema or known_scopes.find(phash, pipeline), input_json=input_json,
              started_at=started, subject=subject, parent_run_id=parent, parent_step=parent_step)
    run.status, run.error, run.ended_at, run.output_json = status, error, ended, output_json
    run.query, run.trace_id, run.store, run.continues, run.degraded = query, trace_id, store, continues, degraded
    run.pending = json.loads(pending) if pending is not None else None
    run.resume_at = json.loads(resume_at) if resume_at is not None else None
    run.forked_from_run_id, run.forked_from_step, run.span_id = forked_from, forked_step, span_id
    run.counterfactual = json.loads(counterfactual) if counterfactual is not None else None
    run.without = frozenset((run.counterfactual or {}).get("without", ()))
    run.steps = [Step(*row[:11], tuple(row[11] or ())) for row in con.execute(
        "SELECT step, stage, name, kind, iteration, status, error, epoch_ns(started_at), epoch_ns(ended_at), "
        "routed_by, child_run_id, logs FROM steps WHERE run_id = ? ORDER BY step", [run_id]).fetchall()]
    run.reads = [Read(*row) for row in con.execute(
        "SELECT step, seq, path, source_step, source_seq FROM reads WHERE run_id = ? ORDER BY step, seq",
        [run_id]).fetchall()]
    run.writes = [Write(*row) for row in con.execute(
        "SELECT step, seq, path, verb, value FROM writes WHERE run_id = ? ORDER BY step, seq", [run_id]).fetchall()]
    run.decisions = [Decision(step, chosen, json.loads(evidence) if evidence else None) for step, chosen, evidence
                     in con.execute("SELECT step, chosen, evidence FROM decisions WHERE run_id = ? ORDER BY step",
                                    [run_id]).fetchall()]
    stepped = [t for t in sorted(EXTRA_TABLES) if "step" in (c for c, _ in COLUMNS[t])]
    present = {r[0] for r in con.execute(  # one look at which tables hold rows of this run, then only those
        " UNION ALL ".join(f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t} WHERE run_id = $1)" for t in stepped),
        [run_id]).fetchall()}
    for table in stepped:
        if table not in present:
            continue
        cols = [c for c, _ in COLUMNS[table]]
        order = "step" + (", idx" if "idx" in cols else "")
        rel = con.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? ORDER BY {order}", [run_id])
        rows = [dict(zip(cols, r)) for r in rel.fetchall()]
        if rows:
            run.rows[table] = rows
    children = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE parent_run_id = ? ORDER BY started_at", [run_id]).fetchall()]
    run.children = [load_run(store, con, child, None) for child in children]
    return run
