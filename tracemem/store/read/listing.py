"""`store.runs()`: the newest runs, cheap however many the store holds.

Two things made it slow on a big store: it counted the steps of every run, not only
of those it returned, and it ordered every run by start time to keep twenty. Steps
are now counted for the returned runs only (index lookups), and the newest runs are
looked for first among the rows inserted last — runs are written roughly in the order
they start — with a cut-off on `started_at` that lets DuckDB skip every older row
group. The cut-off never changes the answer: when fewer rows than asked pass it, the
query runs again without it.
"""
from __future__ import annotations

import json

from datetime import datetime
from typing import Any, Optional

from ...dbmeta import first_row
from ...times import utc_naive

_COLUMNS = ("r.run_id, r.pipeline, coalesce(r.kind, 'run') AS kind, r.status, r.error, r.degraded, r.started_at, "
            "r.ended_at, round(r.duration_ms, 3) AS duration_ms, r.subject, r.parent_run_id, r.pending, "
            "r.forked_from_run_id, r.forked_from_step")


def list_runs(con: Any, *, pipeline: Optional[str] = None, status: Optional[str] = None,
              since: Optional[datetime] = None, until: Optional[datetime] = None, subject: Optional[str] = None,
              limit: int = 100, include_children: bool = False, kind: Optional[str] = None) -> list[dict[str, Any]]:
    """Run summaries with their step counts, newest first, filtered (naive datetimes are UTC). Paused runs
    (`status="paused"`) are the runs waiting for a person: a counterfactual that stopped at a pause waits for
    no one, so it is listed only when asked for by `kind="counterfactual"`."""
    where, params = [], []
    for column, value in (("pipeline", pipeline), ("status", status), ("subject", subject)):
        if value is not None:
            where.append(f"r.{column} = ?")
            params.append(value)
    if kind is not None:
        where.append("coalesce(r.kind, 'run') = ?")
        params.append(kind)
    elif status == "paused":
        where.append("coalesce(r.kind, 'run') <> 'counterfactual'")
    if since is not None:
        where.append("r.started_at >= ?")
        params.append(utc_naive(since))
    if until is not None:
        where.append("r.started_at < ?")
        params.append(utc_naive(until))
    if not include_children:
        where.append("r.parent_run_id IS NULL")
    limit = int(limit)
    if limit <= 0:
        return []
    # the oldest start among the rows inserted last (rowids follow insertion): a guess at the cut-off
    cut = None  # (PostgreSQL has no rowid; it reads the newest runs by its index on started_at)
    if getattr(con, "dialect", "duckdb") != "postgres":  # store/pg/connection.py
        total = first_row(con.execute("SELECT count(*) FROM runs"))[0]
        cut = first_row(con.execute("SELECT min(started_at) FROM runs WHERE rowid >= ?", [total - (8 * limit + 64)]))
    rel = None
    rows: list[tuple] = []
    for guess in ([cut[0]] if cut and cut[0] is not None else []) + [None]:
        clause = where + (["r.started_at >= ?"] if guess is not None else [])
        rel = con.execute(f"SELECT {_COLUMNS} FROM runs r {'WHERE ' + ' AND '.join(clause) if clause else ''} "
                          f"ORDER BY r.started_at DESC, r.run_id LIMIT {limit}",
                          params + ([guess] if guess is not None else []))
        rows = rel.fetchall()
        if len(rows) == limit:  # a full page past the cut-off: no run before it can be newer
            break
    if not rows or rel is None:
        return []
    cols = [d[0] for d in rel.description]
    ids = [row[0] for row in rows]
    steps = dict(con.execute(f"SELECT run_id, count(*) FROM steps WHERE run_id IN ({', '.join('?' * len(ids))}) "
                             "GROUP BY run_id", ids).fetchall())
    out = [{**dict(zip(cols, row)), "steps": steps.get(row[0], 0)} for row in rows]
    for row in out:  # what a paused run asks, as data
        row["pending"] = json.loads(row["pending"]) if isinstance(row["pending"], str) else row["pending"]
    return out
