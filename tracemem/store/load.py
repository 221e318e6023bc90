"""Loading a recorded run back from DuckDB as the same `Run` object the runner returns."""
from __future__ import annotations

from .rows import first as _first

import json
from typing import Any, Optional

from ..errors import TracememError
from ..paths import apply_write, parse_path
from ..schema import pipeline_schema
from ..record import Decision, Read, Step, Write
from ..run import Run
from ..schema import ScopeSchema
from .writer import COLUMNS, EXTRA_TABLES


def final_state(con: Any, run_id: str, reset: Any) -> dict[str, Any]:
    """The final scope data of a run, replaying its whole thread (resumed runs) in two queries."""
    chain = con.execute("""
        WITH RECURSIVE chain(run_id, continues, depth) AS (
            SELECT run_id, continues_run_id, 0 FROM runs WHERE run_id = ?
            UNION ALL SELECT r.run_id, r.continues_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.run_id = c.continues)
        SELECT c.run_id, r.input, c.depth FROM chain c JOIN runs r USING (run_id) ORDER BY c.depth DESC""",
                        [run_id]).fetchall()
    if not chain:
        raise TracememError(f"no run '{run_id}' in the store")
    writes = con.execute("""
        WITH RECURSIVE chain(run_id, continues) AS (
            SELECT run_id, continues_run_id FROM runs WHERE run_id = ?
            UNION ALL SELECT r.run_id, r.continues_run_id FROM runs r JOIN chain c ON r.run_id = c.continues)
        SELECT w.run_id, w.path, w.verb, w.value FROM writes w JOIN chain USING (run_id)
        WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = w.run_id AND s.step = w.step AND s.status <> 'ok')
        ORDER BY w.run_id, w.step, w.seq""", [run_id]).fetchall()
    by_run: dict[str, list[tuple]] = {}
    for w in writes:
        by_run.setdefault(w[0], []).append(w)
    data: dict[str, Any] = {}
    for rid, input_json, _ in chain:
        data = {**data, **json.loads(input_json)}
        for _, path, verb, value in by_run.get(rid, ()):
            apply_write(data, parse_path(path), verb, None if value is None else json.loads(value), reset)
    return data


_CHAIN = """WITH RECURSIVE chain(run_id, continues, depth) AS (
    SELECT run_id, continues_run_id, 0 FROM runs WHERE run_id = ?
    UNION ALL SELECT r.run_id, r.continues_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.run_id = c.continues)"""


def thread_writes(con: Any, run_id: str, root: str) -> list[tuple[str, dict[str, Any], bool, list[Write]]]:
    """The thread ending at `run_id`, oldest first: (run id, recorded input, starts the thread, its
    writes touching field `root`, failed steps left out)."""
    chain = con.execute(_CHAIN + """ SELECT c.run_id, r.input, c.continues IS NULL FROM chain c
        JOIN runs r USING (run_id) ORDER BY c.depth DESC""", [run_id]).fetchall()
    writes = con.execute(_CHAIN + """ SELECT w.run_id, w.step, w.seq, w.path, w.verb, w.value FROM writes w
        JOIN chain USING (run_id) WHERE (w.path = ? OR starts_with(w.path, ? || '[') OR starts_with(w.path, ? || '.'))
        AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = w.run_id AND s.step = w.step AND s.status <> 'ok')
        ORDER BY w.run_id, w.step, w.seq""", [run_id, root, root, root]).fetchall()
    by_run: dict[str, list[Write]] = {}
    for rid, *w in writes:
        by_run.setdefault(rid, []).append(Write(*w))
    return [(rid, json.loads(input_json), bool(first), by_run.get(rid, [])) for rid, input_json, first in chain]


def load_run(store: Any, con: Any, run_id: str, schema: Optional[ScopeSchema]) -> Run:
    head = _first(con.execute(
        "SELECT pipeline, pipeline_hash, status, error, epoch_ns(started_at), epoch_ns(ended_at), input, output, "
        "parent_run_id, parent_step, subject, query, trace_id, continues_run_id FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise TracememError(f"no run '{run_id}' in {store.path}; list runs with `tracemem runs` or store.runs()")
    (pipeline, phash, status, error, started, ended, input_json, output_json, parent, parent_step, subject, query,
     trace_id, continues) = head
    schema = schema or pipeline_schema(phash) or store._schemas.get(pipeline)
    run = Run(run_id=run_id, pipeline=pipeline, pipeline_hash=phash, schema=schema, input_json=input_json,
              started_at=started, subject=subject, parent_run_id=parent, parent_step=parent_step)
    run.status, run.error, run.ended_at, run.output_json = status, error, ended, output_json
    run.query, run.trace_id, run.store, run.continues = query, trace_id, store, continues
    run._flow = store._flows.get(phash)
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
