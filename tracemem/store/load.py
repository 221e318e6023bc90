"""Loading a recorded run back from DuckDB as the same `Run` object the runner returns."""
from __future__ import annotations

from .rows import first as _first

import json
from typing import Any, Optional

from ..errors import TracememError
from ..record import Decision, Read, Step, Write
from ..run import Run
from ..schema import ScopeSchema
from .writer import COLUMNS, EXTRA_TABLES


def load_run(store: Any, con: Any, run_id: str, schema: Optional[ScopeSchema]) -> Run:
    head = _first(con.execute(
        "SELECT pipeline, pipeline_hash, status, error, epoch_ns(started_at), epoch_ns(ended_at), input, output, "
        "parent_run_id, parent_step, subject, query, trace_id, continues_run_id FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise TracememError(f"no run '{run_id}' in {store.path}; list runs with `tracemem runs` or store.runs()")
    (pipeline, phash, status, error, started, ended, input_json, output_json, parent, parent_step, subject, query,
     trace_id, continues) = head
    schema = schema or store._schemas.get(pipeline)
    run = Run(run_id=run_id, pipeline=pipeline, pipeline_hash=phash, schema=schema, input_json=input_json,
              started_at=started, subject=subject, parent_run_id=parent, parent_step=parent_step)
    run.status, run.error, run.ended_at, run.output_json = status, error, ended, output_json
    run.query, run.trace_id, run.store, run.continues = query, trace_id, store, continues
    run._flow = store._flows.get(pipeline)
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
    for table in sorted(EXTRA_TABLES):
        cols = [c for c, _ in COLUMNS[table]]
        if "step" not in cols:
            continue
        order = "step" + (", idx" if "idx" in cols else "")
        rel = con.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? ORDER BY {order}", [run_id])
        rows = [dict(zip(cols, r)) for r in rel.fetchall()]
        if rows:
            run.rows[table] = rows
    children = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE parent_run_id = ? ORDER BY started_at", [run_id]).fetchall()]
    run.children = [load_run(store, con, child, None) for child in children]
    return run
