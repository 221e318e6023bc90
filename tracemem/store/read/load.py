"""Loading recorded runs back from DuckDB as the same `Run` object the runner returns, and a
conversation thread's writes in bulk.

Every lookup is by run id, which each run table indexes (schema v6), and several runs load
together: a query per table however many runs (`load_runs`), so a backtrack that walks
forty turns of a thread, or a store of a million runs, costs index lookups, never scans.
"""
from __future__ import annotations

import json
from itertools import groupby
from operator import itemgetter
from typing import Any, Iterable, Optional

from ...dbmeta import first_row
from ...errors import RunNotFoundError
from ...record import EXTRA_TABLES, Decision, Read, Step, ThreadRun, Write
from ...run import Run
from ...scope.known import known_scopes
from ...scope.schema import ScopeSchema
from ..write.rows import COLUMNS
from ...fastjson import loads

# the runs of a thread recorded before runs.thread_id existed (schema < 6), newest first
_CHAIN = """WITH RECURSIVE chain(run_id, continues, depth) AS (
    SELECT run_id, continues_run_id, 0 FROM runs WHERE run_id = ?
    UNION ALL SELECT r.run_id, r.continues_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.run_id = c.continues)
    SELECT c.run_id, c.continues, r.input FROM chain c JOIN runs r USING (run_id) ORDER BY c.depth"""


def _ids(column: str, ids: list[str]) -> tuple[str, list[Any]]:
    """A filter on `column` for a list of run ids, and its parameters: a few ids as parameters (an index
    lookup each), many as one list (a join, which beats a long IN list)."""
    if len(ids) <= 8:
        return f"{column} IN ({', '.join('?' * len(ids))})", list(ids)
    return f"{column} IN (SELECT unnest(?::VARCHAR[]))", [list(ids)]


def chain_of(con: Any, run_id: str) -> list[tuple[str, Optional[str], str]]:
    """(run id, the run it continues, its input) for each run of the thread ending at `run_id`, oldest
    first: one indexed lookup of the thread's runs (`runs.thread_id`), and a recursive walk for the part
    recorded before that column existed; [] when the run does not exist."""
    head = first_row(con.execute("SELECT thread_id, continues_run_id, input FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        return []
    thread_id, continues, input_json = head
    chain = [(run_id, continues, input_json)]
    if continues is None:
        return chain
    by_id: dict[str, tuple[str, Optional[str], str]] = {}
    if thread_id is not None:
        by_id = {r[0]: r for r in con.execute(
            "SELECT run_id, continues_run_id, input FROM runs WHERE thread_id = ? "
            "UNION ALL SELECT run_id, continues_run_id, input FROM runs WHERE run_id = ?",
            [thread_id, thread_id]).fetchall()}
    seen = {run_id}
    while chain[-1][1] is not None:
        at = by_id.get(chain[-1][1])
        if at is None:  # runs recorded without a thread_id: walk them
            rest = [r for r in con.execute(_CHAIN, [chain[-1][1]]).fetchall() if r[0] not in seen]
            chain.extend(rest)
            break
        if at[0] in seen:
            break
        seen.add(at[0])
        chain.append(at)
    chain.reverse()
    return chain


def thread(con: Any, run_id: str, root: Optional[str] = None) -> list[ThreadRun]:
    """The thread ending at `run_id`, oldest first, in three queries however long it is: each run's
    recorded input, whether it starts the thread, and its committed writes (to field `root` only, when
    given; failed steps left out)."""
    chain = chain_of(con, run_id)
    if not chain:
        raise RunNotFoundError(f"no run '{run_id}' in the store")
    where, params = _ids("run_id", [rid for rid, _, _ in chain])
    only = "" if root is None else \
        "AND (path = ? OR starts_with(path, ? || '[') OR starts_with(path, ? || '.'))"
    writes = con.execute(f"SELECT run_id, step, seq, path, verb, value FROM writes WHERE {where} {only} "
                         "ORDER BY run_id, step, seq", params + ([] if root is None else [root, root, root])).fetchall()
    failed = set(con.execute(f"SELECT run_id, step FROM steps WHERE {where} AND status <> 'ok'", params).fetchall())
    by_run: dict[str, list[Write]] = {}
    for rid, *w in writes:
        if (rid, w[0]) not in failed:
            by_run.setdefault(rid, []).append(Write(*w))
    return [ThreadRun(rid, json.loads(input_json), continues is None, by_run.get(rid, []))
            for rid, continues, input_json in chain]


# What a load reads of each table, in the order of the record it builds: a query per table that holds
# rows (an index lookup each), sorted in Python. One UNION ALL BY NAME of all of them was tried: its rows
# are as wide as every table's columns together, nearly all NULL, and turning those into Python tuples
# made a 1,000-step run load 2-3× slower than a query per table (bench/resume.py).
_READ: dict[str, tuple[str, list[str], str, str]] = {  # table → (key column, columns, step, seq)
    "runs": ("run_id", ["run_id", "pipeline", "pipeline_hash", "status", "error", "epoch_ns(started_at)",
                        "epoch_ns(ended_at)", "input", "output", "parent_run_id", "parent_step", "subject", "query",
                        "trace_id", "continues_run_id", "thread_id", "degraded", "pending", "resume_at",
                        "forked_from_run_id", "forked_from_step", "span_id", "counterfactual", "notes", "kind"],
             "NULL", "NULL"),
    "children": ("parent_run_id", ["run_id", "parent_run_id"], "NULL", "epoch_ns(started_at)"),
    "steps": ("run_id", ["step", "stage", "name", "kind", "iteration", "status", "error", "epoch_ns(started_at)",
                         "epoch_ns(ended_at)", "routed_by", "child_run_id", "logs"], "step", "NULL"),
    "reads": ("run_id", ["step", "seq", "path", "source_step", "source_seq"], "step", "seq"),
    "writes": ("run_id", ["step", "seq", "path", "verb", "value"], "step", "seq"),
    "decisions": ("run_id", ["step", "chosen", "evidence"], "step", "NULL"),
    **{t: ("run_id", [c for c, _ in COLUMNS[t]], "step", "idx" if any(c == "idx" for c, _ in COLUMNS[t]) else "NULL")
       for t in sorted(EXTRA_TABLES) if any(c == "step" for c, _ in COLUMNS[t])},
}

# PostgreSQL has no rowid: the row's physical place stands for its insertion order (rows are appended by
# COPY, never moved)
_CTID = "((ctid::text::point)[0]::bigint * 65536 + (ctid::text::point)[1]::bigint)"


def _layout(name: str, many: bool, rowid: str) -> tuple[list[str], list[int]]:
    """What a load selects of a table (its columns, then what its order needs beyond them) and where the
    order's columns are in that: the run id (first, when the rows are of several runs), step, seq (or idx,
    or start), insertion."""
    key, cols, step, seq = _READ[name]
    select, order = list(cols), []
    for expr in ([key] if many else []) + [e for e in (step, seq) if e != "NULL"] + [rowid]:
        if expr not in select:
            select.append(expr)
        order.append(select.index(expr))
    return select, order


def _where(ids: list[str]) -> tuple[str, list[Any]]:
    """`IN (...)` of the ids as $1..$n, or as one list $1 when many (a query may use it more than once)."""
    n = len(ids)
    return (", ".join(f"${i + 1}" for i in range(n)), ids) if n <= 8 else ("SELECT unnest($1::VARCHAR[])", [ids])


def _sorted(rows: list[tuple], order: list[int]) -> list[tuple]:
    """Rows in the order they are read (NULLs last, as DuckDB sorts them)."""
    try:
        rows.sort(key=itemgetter(*order))
    except TypeError:  # a NULL beside a value (a NULL-able seq column): NULLs go last
        rows.sort(key=lambda row: tuple((1, 0) if row[i] is None else (0, row[i]) for i in order))
    return rows


def _fetch(con: Any, name: str, ids: list[str], rowid: str, many: bool,
           steps: Optional[tuple[int, int]] = None) -> list[tuple]:
    """One table's rows of the runs `ids` (of steps `steps[0]`..`steps[1]` only, when given), in the order it
    is read. `many`: the rows' run id is their first order column."""
    select, order = _layout(name, many, rowid)
    where, params = _where(ids)
    if steps is not None:
        where += f") AND (step BETWEEN ${len(params) + 1} AND ${len(params) + 2}"
        params = [*params, *steps]
    rows = con.execute(f"SELECT {', '.join(select)} FROM {name} WHERE {_READ[name][0]} IN ({where})",
                       params).fetchall()
    return _sorted(rows, order)


def _heads(con: Any, ids: list[str], rowid: str,
           steps: Optional[tuple[int, int]] = None) -> tuple[list[tuple], list[tuple[str, str]]]:
    """The runs rows of `ids` and (child, parent) of their child runs (of steps `steps` only, when given), in
    one query: two index lookups joined by UNION ALL, a child's few columns in the places the runs row has
    them."""
    select, order = _layout("runs", True, rowid)
    child_select, child_order = _layout("children", True, rowid)
    at = [select.index(c) for c in child_select]  # run_id, parent_run_id, started, rowid: all in `select`
    padded = ["NULL"] * len(select)
    for i, expr in zip(at, child_select):
        padded[i] = expr
    where, params = _where(ids)
    within = ""
    if steps is not None:
        within = f" AND parent_step BETWEEN ${len(params) + 1} AND ${len(params) + 2}"
        params = [*params, *steps]
    rows = con.execute(f"SELECT false, {', '.join(select)} FROM runs WHERE run_id IN ({where}) UNION ALL "
                       f"SELECT true, {', '.join(padded)} FROM runs WHERE parent_run_id IN ({where}){within}",
                       params).fetchall()
    heads = _sorted([row[1:] for row in rows if not row[0]], order)
    children = _sorted([tuple(row[1 + i] for i in at) for row in rows if row[0]], child_order)
    return heads, [(row[0], row[1]) for row in children]


def _tables(con: Any) -> list[str]:
    """The tables a load reads that may hold rows (a lookup in an empty table still costs a query)."""
    own = ("runs", "children")  # read by _heads
    if getattr(con, "dialect", "duckdb") == "postgres":  # store/pg/connection.py
        return [name for name in _READ if name not in own]
    empty = frozenset(t for t, size in con.execute(
        "SELECT table_name, estimated_size FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main'").fetchall() if size == 0)
    return [name for name in _READ if name not in own and name not in empty]


def load_runs(store: Any, con: Any, run_ids: list[str], schema: Optional[ScopeSchema] = None,
              steps: Optional[tuple[int, int]] = None) -> dict[str, Run]:
    """The runs among `run_ids` that exist, each with every row it recorded and its child runs, in a query
    per table that holds rows however many runs (and that again per level of subflows); `store` is kept
    as their loader. `steps` (first, last): only the rows of those steps, and the child runs they started
    (a page of a long run: the Run then holds those steps alone)."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return {}
    rowid = _CTID if getattr(con, "dialect", "duckdb") == "postgres" else "rowid"
    tables = _tables(con)
    heads, children = _heads(con, ids, rowid, steps)
    if not heads:
        return {}
    ids = [row[0] for row in heads]
    many = len(ids) > 1
    records: dict[str, Record] = {}
    for name in tables:
        rows = _fetch(con, name, ids, rowid, many, steps if _READ[name][2] == "step" else None)
        if not rows:
            continue
        width = len(_READ[name][1])
        groups = groupby(rows, itemgetter(_layout(name, True, rowid)[1][0])) if many else [(ids[0], rows)]
        for rid, group in groups:
            record = records.get(rid)
            if record is None:
                record = records[rid] = Record()
            record.add(name, group, width)
    out: dict[str, Run] = {}
    for (run_id, pipeline, phash, status, error, started, ended, input_json, output_json, parent, parent_step,
         subject, query, trace_id, continues, thread_id, degraded, pending, resume_at, forked_from, forked_step,
         span_id, counterfactual, notes, kind, *_) in heads:
        run = Run(run_id=run_id, pipeline=pipeline, pipeline_hash=phash,
                  schema=schema or known_scopes.find(phash, pipeline), input_json=input_json,
                  started_at=started, subject=subject, parent_run_id=parent, parent_step=parent_step)
        run.status, run.error, run.ended_at, run.output_json = status, error, ended, output_json
        run.query, run.trace_id, run.store, run.continues, run.thread_id = query, trace_id, store, continues, thread_id
        run.degraded, run.span_id, run.notes = degraded, span_id, list(notes or ())
        run.pending = json.loads(pending) if pending is not None else None
        run.resume_at = json.loads(resume_at) if resume_at is not None else None
        run.forked_from_run_id, run.forked_from_step = forked_from, forked_step
        run.counterfactual = json.loads(counterfactual) if counterfactual is not None else None
        run.without = frozenset((run.counterfactual or {}).get("without", ()))
        run.kind = kind or "run"
        if run_id in records:
            records[run_id].give(run)
        out[run_id] = run
    if children:
        loaded = load_runs(store, con, [c for c, _ in children])
        for child, parent in children:
            if child in loaded and parent in out:
                out[parent].children.append(loaded[child])
    return out


class Record:
    """One run's rows as a load reads them, until its head row makes the `Run`."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.reads: list[Read] = []
        self.writes: list[Write] = []
        self.decisions: list[Decision] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, table: str, rows: Iterable[tuple], width: int) -> None:
        """Rows of `table` as `_fetch` gives them (its `width` columns first), in order."""
        if table == "steps":
            self.steps = [Step(*row[:11], tuple(row[11] or ())) for row in rows]
        elif table == "reads":
            self.reads = [Read(*row[:5]) for row in rows]
        elif table == "writes":
            self.writes = [Write(*row[:5]) for row in rows]
        elif table == "decisions":
            self.decisions = [Decision(row[0], row[1], loads(row[2]) if row[2] else None) for row in rows]
        else:
            cols = _READ[table][1]
            self.rows[table] = [dict(zip(cols, row[:width])) for row in rows]

    def give(self, run: Run) -> None:
        run.steps, run.reads, run.writes, run.decisions, run.rows = (
            self.steps, self.reads, self.writes, self.decisions, self.rows)


def load_run(store: Any, con: Any, run_id: str, schema: Optional[ScopeSchema]) -> Run:
    """Run `run_id` (or the one run whose id starts with it) with every row it recorded (and its child runs);
    `store` is kept as its loader."""
    run = load_runs(store, con, [run_id], schema).get(run_id)
    if run is None:
        run_id = resolve_run_id(con, run_id, store.path)
        run = load_runs(store, con, [run_id], schema)[run_id]
    return run


def resolve_run_id(con: Any, ref: str, where: str) -> str:
    """The full id of the one run whose id is `ref` or starts with it (people copy the first 8 characters);
    RunNotFoundError saying whether it was pruned, or that the prefix is ambiguous."""
    rows = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY run_id "
                                      "LIMIT 3", [ref]).fetchall()]
    if len(rows) == 1:
        return rows[0]
    if rows:
        raise RunNotFoundError(f"run id prefix '{ref}' is ambiguous in {where} ({', '.join(rows)}…); give more "
                               f"characters")
    gone = con.execute("SELECT run_id, max(pruned_at) FROM pruned_runs WHERE starts_with(run_id, ?) "
                       "GROUP BY run_id LIMIT 2", [ref]).fetchall()
    if len(gone) == 1:
        raise RunNotFoundError(f"run {gone[0][0]} was pruned from {where} at {gone[0][1]:%Y-%m-%d %H:%M:%S} UTC "
                               f"(store.prune); its record is gone, so it cannot be loaded or resumed")
    raise RunNotFoundError(f"no run '{ref}' in {where} (a full run id or a unique prefix of one); list runs with "
                           f"`tracemem runs` or store.runs()")
