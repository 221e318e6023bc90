"""Rows: what the writer inserts, as one columnar transaction per batch, from the pieces of runs it queued.

Rows are collected as Python tuples and inserted per table as one Arrow table
(`INSERT INTO t SELECT * FROM batch`): row-by-row `executemany` manages only hundreds of
rows a second, Arrow batches hundreds of thousands. `COLUMNS` is the one list of every run
table's columns and types (the journal, the loader and retention read it from here).
`duration_ms` of runs, steps and model_calls is derived when a batch is inserted, from the
recorded ns timestamps (a model call: its measured latency). A value Arrow or DuckDB cannot
hold (store/write/storable.py) fails the fast path; the batch is then built again with every
value checked, each change noted on its run (`runs.notes`) in the same transaction. With the
rows goes what the journal may forget: the position a DuckDB file's journal reached
(`journal_applied`), or PostgreSQL's `step_journal` rows of what the batch writes.
"""
from __future__ import annotations

import json
import os
import socket
from operator import itemgetter
from typing import Any, Iterable, NamedTuple, Optional, Sequence

import pyarrow as pa

from ...errors import TracememError
from ...record import Decision, Read, Step, Write
from ...run import Run
from ..diagnose import is_data_error
from .storable import Cleaner

NS = pa.timestamp("ns")
S, I, F, J = pa.string(), pa.int32(), pa.float64(), pa.string()

COLUMNS: dict[str, list[tuple[str, pa.DataType]]] = {
    "runs": [("run_id", S), ("pipeline", S), ("pipeline_hash", S), ("status", S), ("error", S),
             ("started_at", NS), ("ended_at", NS), ("input", J), ("output", J), ("parent_run_id", S),
             ("parent_step", I), ("pid", I), ("host", S), ("subject", S), ("query", S), ("trace_id", S),
             ("continues_run_id", S), ("degraded", S), ("duration_ms", F), ("pending", J), ("resume_at", J),
             ("forked_from_run_id", S), ("forked_from_step", I), ("span_id", S), ("counterfactual", J),
             ("thread_id", S), ("lease", S), ("notes", pa.list_(S)), ("kind", S)],
    "steps": [("run_id", S), ("step", I), ("stage", S), ("name", S), ("kind", S), ("iteration", I),
              ("status", S), ("error", S), ("started_at", NS), ("ended_at", NS), ("routed_by", I),
              ("child_run_id", S), ("logs", pa.list_(S)), ("duration_ms", F)],
    "writes": [("run_id", S), ("step", I), ("seq", I), ("path", S), ("verb", S), ("value", J)],
    "reads": [("run_id", S), ("step", I), ("seq", I), ("path", S), ("source_step", I), ("source_seq", I)],
    "decisions": [("run_id", S), ("step", I), ("chosen", S), ("evidence", J)],
    "model_calls": [("run_id", S), ("step", I), ("call_id", S), ("model", S), ("provider", S), ("prompt_id", S),
                    ("response", S), ("input_tokens", I), ("output_tokens", I), ("latency_ms", F),
                    ("started_at", NS), ("error", S), ("duration_ms", F), ("request_hash", S), ("replayed", pa.bool_()),
                    ("tool_calls", J), ("system_id", S), ("input_id", S), ("tools_id", S), ("options", J),
                    ("output_id", S)],
    "prompts": [("prompt_id", S), ("run_id", S), ("step", I), ("text", S), ("messages", J)],
    "prompt_sections": [("prompt_id", S), ("idx", I), ("kind", S), ("text", S), ("start_char", I),
                        ("end_char", I), ("source_kind", S), ("source_id", S), ("run_id", S), ("step", I)],
    "memory_uses": [("run_id", S), ("step", I), ("memory_id", S), ("outcome", S), ("reason", S), ("score", F),
                    ("rank", I)],
    "snapshot_uses": [("run_id", S), ("step", I), ("source_run_id", S), ("score", F), ("projection", S),
                      ("query", S)],
    "run_embeddings": [("run_id", S), ("pipeline", S), ("embedder_id", S), ("query", S),
                       ("embedding", pa.list_(pa.float32())), ("created_at", NS)],
    "subflows": [("run_id", S), ("step", I), ("child_run_id", S), ("inputs", J), ("outputs", J)],
    "human_inputs": [("run_id", S), ("step", I), ("idx", I), ("input_id", S), ("payload", J), ("answer", J),
                     ("answered_by", S), ("asked_step", I), ("answered_at", NS)],
    "tool_calls": [("run_id", S), ("step", I), ("call_id", S), ("name", S), ("arguments", J), ("arguments_text", S),
                   ("result", S), ("error", S), ("error_kind", S), ("truncated", pa.bool_()), ("original_chars", I),
                   ("started_at", NS), ("duration_ms", F)],
    "effects": [("run_id", S), ("step", I), ("idx", I), ("kind", S), ("name", S), ("input_hash", S),
                ("idempotency_key", S), ("mode", S), ("source_run_id", S), ("source_step", I), ("result", J),
                ("error", S), ("started_at", NS), ("duration_ms", F)],
    # keyed by content (tracemem/exchange.py): a row whose key the table has is not inserted again
    "messages": [("message_id", S), ("role", S), ("message", J), ("run_id", S)],
    "message_chains": [("chain_id", S), ("parent_id", S), ("message_id", S), ("depth", I), ("run_id", S)],
    "tool_sets": [("tools_id", S), ("tools", J), ("run_id", S)],
}
CONTENT_KEYS = {"messages": "message_id", "message_chains": "chain_id", "tool_sets": "tools_id"}
DERIVED = {t: frozenset({"duration_ms"}) for t in ("runs", "steps", "model_calls")}  # computed by `Batch.insert`,
# never part of a row tuple (a tool call's duration_ms is measured around the tool, so it is given)
GIVEN: dict[str, list[tuple[str, pa.DataType]]] = {t: [c for c in cols if c[0] not in DERIVED.get(t, ())]
                                                   for t, cols in COLUMNS.items()}
JSON_COLUMNS = frozenset({("runs", "input"), ("runs", "output"), ("runs", "pending"), ("runs", "resume_at"),
                          ("runs", "counterfactual"), ("writes", "value"), ("decisions", "evidence"),
                          ("model_calls", "tool_calls"), ("model_calls", "options"), ("prompts", "messages"),
                          ("subflows", "inputs"), ("subflows", "outputs"), ("human_inputs", "payload"),
                          ("human_inputs", "answer"), ("tool_calls", "arguments"), ("effects", "result"),
                          ("messages", "message"), ("tool_sets", "tools")})  # the JSON columns (J above)
_HOST = socket.gethostname()


def json_text(value: Any) -> Optional[str]:
    """A value as a text column stores it when it is not a str already (None stays NULL)."""
    return None if value is None else json.dumps(value, default=str)


def run_row(run: Run, lease: Optional[str] = None) -> tuple:
    """The runs row (`GIVEN["runs"]` order) of a run; `lease` names the store opening that records it (crash
    recovery tells live runs by it)."""
    return (run.run_id, run.pipeline, run.pipeline_hash, run.status, run.error, run.started_at, run.ended_at,
            run.input_json, run.output_json, run.parent_run_id, run.parent_step, os.getpid(), _HOST,
            run.subject, run.query, run.trace_id, run.continues, run.degraded, json_text(run.pending),
            json_text(run.resume_at), run.forked_from_run_id, run.forked_from_step, run.span_id, json_text(run.counterfactual),
            run.thread_id, lease, list(run.notes) or None, run.kind)


def end_facts(run: Run) -> dict[str, Any]:
    """What the runs row learns when a run ends."""
    return {"status": run.status, "error": run.error, "ended_at": run.ended_at, "output": run.output_json,
            "query": run.query, "trace_id": run.trace_id, "degraded": run.degraded, "pending": json_text(run.pending),
            "resume_at": json_text(run.resume_at), "span_id": run.span_id, "notes": list(run.notes) or None}


FINISH_SQL = ("UPDATE runs SET status = ?, error = ?, output = ?, query = ?, notes = ?, degraded = ?, pending = ?, "
              "resume_at = ?, ended_at = make_timestamp_ns(?), trace_id = coalesce(?, trace_id), "
              "span_id = coalesce(?, span_id), duration_ms = (? - epoch_ns(started_at)) / 1e6 WHERE run_id = ?")
"""What completes a runs row written when its run began (a resumed run keeps its earlier trace id unless it has
a new one): `finish_params` are its parameters."""
_FINISHED = (("status", "text"), ("error", "text"), ("output", "json"), ("query", "text"), ("notes", "texts"),
             ("degraded", "text"), ("pending", "json"), ("resume_at", "json"))


def finish_params(run_id: str, end: dict[str, Any], cleaner: Optional[Cleaner] = None) -> list[Any]:
    """FINISH_SQL's parameters for a run's end facts (`end_facts`), each made storable by `cleaner` if given."""
    values = [end.get(c) for c, _ in _FINISHED]
    if cleaner is not None:
        values = [cleaner.one(run_id, f"runs.{c}", fix, v) for (c, fix), v in zip(_FINISHED, values)]
    return values + [end["ended_at"], end.get("trace_id"), end.get("span_id"), end["ended_at"], run_id]


RUN_COLUMNS = tuple(c for c, _ in GIVEN["runs"])
_KEPT_UNLESS_NEW = frozenset({"trace_id", "span_id"})  # as FINISH_SQL's coalesce: a resumed run keeps its trace


def completed(row: tuple, end: dict[str, Any]) -> tuple:
    """A runs row not written yet, with its run's end facts (`end_facts`) in it: what FINISH_SQL would
    leave, without an UPDATE (a "stage" run's row and end usually go in the same batch)."""
    values = dict(zip(RUN_COLUMNS, row))
    values.update((c, v) for c, v in end.items() if c in values and (v is not None or c not in _KEPT_UNLESS_NEW))
    return tuple(values.values())


def extra_row(table: str, row: dict[str, Any]) -> tuple:
    cols = GIVEN[table]
    unknown = set(row) - {c for c, _ in COLUMNS[table]}
    if unknown:
        raise TracememError(f"row for table '{table}' has unknown columns {sorted(unknown)}; "
                            f"columns are {[c for c, _ in cols]}")
    return tuple(json_text(row.get(c)) if t == J and not isinstance(row.get(c), (str, type(None)))
                 else row.get(c) for c, t in cols)


def _derived(table: str, arrays: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """The derived columns of a table's batch: `duration_ms` from the ns timestamps (or a call's latency)."""
    if table == "model_calls":
        return {"duration_ms": arrays["latency_ms"]}
    if table in ("runs", "steps"):  # numpy, not pyarrow.compute: ten times quicker on a batch this size
        # (`view`, not `cast`: a cast imports pyarrow.compute, 20 ms on the first batch a process writes)
        ended, started = (arrays[c].view(pa.int64()).to_numpy(zero_copy_only=False)
                          for c in ("ended_at", "started_at"))
        return {"duration_ms": pa.array((ended - started) / 1e6, type=F, from_pandas=True)}  # NaN (no end): null
    return {}


COLUMNAR = ("steps", "reads", "writes")  # the hot tables, collected column by column


Records = tuple[Sequence[tuple], Sequence[tuple], Sequence[tuple], Sequence[Decision], Sequence[tuple[str, dict]]]
"""A run's records, or some: steps, reads, writes (plain tuples), decisions, extra rows as (table, row)."""


def plain_records(steps: Iterable[Step], reads: Iterable[Read], writes: Iterable[Write],
                  decisions: Iterable[Decision], rows: Iterable[tuple[str, dict[str, Any]]]) -> Records:
    """Records as the writer's queue holds them: steps, reads and writes as plain tuples, which the garbage
    collector stops tracking (named tuples it tracks for as long as they live, and a queued run's would
    live long enough to make its full collections come several times as often)."""
    return (tuple(map(tuple, steps)), tuple(map(tuple, reads)), tuple(map(tuple, writes)), tuple(decisions),
            tuple(rows))


def run_records(run: Run, since: Optional[tuple[Any, ...]] = None) -> Records:
    """A run's records (`plain_records`), all of them or those after `since` (a resumed run's counts of steps,
    reads, writes, decisions and rows by table when it was resumed)."""
    steps, reads, writes, decisions, rows = since[:5] if since is not None else (0, 0, 0, 0, {})
    return plain_records(run.steps[steps:], run.reads[reads:], run.writes[writes:], run.decisions[decisions:],
                         [(t, r) for t, made in run.rows.items() for r in made[rows.get(t, 0):]])


class RunFacts(NamedTuple):
    """What the writer needs of a live run: not the run itself, which a queued piece would keep alive (with its
    whole record) after the caller has let it go. `notes` is the run's own list: notes the writer adds reach it."""

    run_id: str
    pipeline: str
    notes: list[str]
    query: Optional[str]
    status: str
    parent_run_id: Optional[str]
    counterfactual: Any

    @classmethod
    def of(cls, run: Run) -> "RunFacts":
        return cls(run.run_id, run.pipeline, run.notes, run.query, run.status, run.parent_run_id, run.counterfactual)


class Piece(NamedTuple):
    """What the writer puts into the tables for a run, at one time: its runs row (`row`: a new run's, a
    "stage" run's as it began), records (`records`), and end facts (`end`: completing a runs row written
    before). `position`: the journal's, once it is in."""

    run: RunFacts
    row: Optional[tuple]
    records: Records
    end: Optional[dict[str, Any]]
    position: Optional[int]
    cost: int

    def merged(self, later: "Piece") -> "Piece":
        """This piece and the next of its run as one (the queue merges a "stage" run's pieces while queued); the
        records become lists that the queue owns and extends from then on."""
        records = self.records if isinstance(self.records[0], list) else tuple(list(r) for r in self.records)
        for mine, added in zip(records, later.records):
            if added:
                mine.extend(added)
        return Piece(later.run, self.row, records, later.end,
                     self.position if later.position is None else later.position, self.cost + later.cost)


class Batch:
    """Rows waiting to be inserted: `rows` per table, and for the hot tables their records (with a run id column
    beside them), turned into columns once per batch; the runs rows to complete (`finished`); and what the
    journal may then forget (`position`, or `journaled` step_journal rows)."""

    def __init__(self, lease: Optional[str] = None) -> None:
        self.lease = lease  # the store opening whose runs rows this batch writes
        self.runs: dict[str, RunFacts] = {}  # the live runs this batch holds rows of (told about notes it adds)
        self.notes: dict[str, list[str]] = {}  # notes to add to runs rows already in the file (recovery)
        self.rows: dict[str, list[tuple]] = {t: [] for t in COLUMNS}
        self.records: dict[str, tuple[list[str], list[tuple]]] = {t: ([], []) for t in COLUMNAR}  # run ids, records
        self.finished: list[tuple[str, dict[str, Any]]] = []  # runs rows to complete: (run_id, end facts)
        self._row_at: dict[str, int] = {}  # run id → where its runs row is in `rows["runs"]`, while not written
        self.journaled: list[tuple[str, Optional[list[int]]]] = []  # step_journal rows it supersedes (None: all)
        self.position: Optional[int] = None  # how far a DuckDB file's journal the tables hold with this batch
        self.token: Optional[str] = None  # written with the batch: a retry after a lost commit answer looks for it

    def __len__(self) -> int:
        return sum(len(r) for r in self.rows.values()) + sum(len(ids) for ids, _ in self.records.values())

    def _columns(self, table: str, run_id: str, records: Sequence[tuple]) -> None:
        if records:  # no per-row work here: the batch is transposed once, in `columns`
            ids, kept = self.records[table]
            ids.extend([run_id] * len(records))
            kept.extend(records)

    def columns(self) -> list[tuple[str, list[Sequence[Any]]]]:
        """Each table this batch has rows for, as its given columns (`GIVEN` order)."""
        tables: list[tuple[str, list[Sequence[Any]]]] = [(t, list(zip(*rows))) for t, rows in self.rows.items()
                                                         if rows]
        return tables + [(t, [ids, *(list(map(itemgetter(i), records)) for i in range(len(GIVEN[t]) - 1))])
                         for t, (ids, records) in self.records.items() if ids]

    def add_steps(self, run_id: str, steps: Sequence[Step], reads: Sequence[Read], writes: Sequence[Write],
                  decisions: Iterable[Decision]) -> None:
        self._columns("steps", run_id, steps)
        self._columns("reads", run_id, reads)
        self._columns("writes", run_id, writes)
        self.rows["decisions"].extend((run_id, d.step, d.chosen, json_text(d.evidence)) for d in decisions)

    def add_extra(self, rows: Iterable[tuple[str, dict[str, Any]]]) -> None:
        for table, row in rows:
            if not table.startswith("_"):  # "_span" and other telemetry-only rows are not stored
                self.rows[table].append(extra_row(table, row))

    def add_embeddings(self, rows: list[tuple]) -> None:
        self.rows["run_embeddings"].extend(rows)

    def add(self, piece: Piece, extra: bool = True, records: bool = True) -> None:
        """A piece of a run (store/write/writer.py): its runs row, records (`extra`: with their extra rows) and
        end facts."""
        run = piece.run
        self.runs[run.run_id] = run
        if piece.row is not None:
            self._row_at[run.run_id] = len(self.rows["runs"])
            self.rows["runs"].append(piece.row)
        if records:
            steps, reads, writes, decisions, rows = piece.records
            self.add_steps(run.run_id, steps, reads, writes, decisions)
            if extra:
                self.add_extra(rows)
        if piece.end is not None:
            at = self._row_at.get(run.run_id)
            if at is None:  # its row is in the tables already
                self.finished.append((run.run_id, piece.end))
            else:
                self.rows["runs"][at] = completed(self.rows["runs"][at], piece.end)
        if piece.position is not None:
            self.position = max(self.position or 0, piece.position)

    def insert(self, con: Any) -> None:
        """Insert everything as one transaction of one Arrow batch per table; if a value cannot be held, again
        with every value made storable and each change noted on its run."""
        try:
            self._insert(con, None)
        except BaseException as err:
            if not is_data_error(err):
                raise
            cleaner = Cleaner()
            self._insert(con, cleaner)
            for run_id, notes in cleaner.rendered().items():
                if run_id in self.runs:
                    self.runs[run_id].notes.extend(notes)

    def arrow(self, cleaner: Optional[Cleaner] = None) -> list[tuple[str, pa.Table]]:
        """Each table this batch has rows for, as an Arrow table (given and derived columns); through
        `cleaner`, with every value made storable and each change noted."""
        out = []
        for table, columns in self.columns():
            cols = GIVEN[table]
            if cleaner is None:
                arrays = {c: pa.array(values, type=t) for (c, t), values in zip(cols, columns)}
            else:
                names = [c for c, _ in cols]
                run_ids = list(columns[names.index("run_id")])
                steps = list(columns[names.index("step")]) if "step" in names else None
                arrays = {c: cleaner.column(table, c, t, (table, c) in JSON_COLUMNS, list(values), run_ids, steps)
                          for (c, t), values in zip(cols, columns)}
            arrays.update(_derived(table, arrays))
            out.append((table, pa.Table.from_arrays(list(arrays.values()), names=list(arrays))))
        return out

    def _insert(self, con: Any, cleaner: Optional[Cleaner]) -> None:
        """As few DuckDB calls as the batch allows (each call from the writer's thread waits for the GIL several
        times, `python bench/duckdb_gil.py`): one for the rows, the journal position, the token and the commit;
        the runs it completes and notes it adds (which take parameters) between two calls when there are any."""
        tables = self.arrow(cleaner)  # built before the transaction: a value Arrow rejects never opens one
        names = [f"_tracemem_{table}" for table, _ in tables]
        rows = "BEGIN TRANSACTION; " + "".join(insert_sql(table, name, batch.column_names)
                                               for name, (table, batch) in zip(names, tables))
        notes = list(self.notes.items()) + list(cleaner.rendered().items() if cleaner is not None else ())
        tail = "".join(meta_sql(key, value) for key, value in (
            ("journal_applied", None if self.position is None else str(self.position)),
            (f"batch:{self.lease}", self.token)) if value is not None) + "COMMIT"
        try:
            if not (self.finished or notes or self.journaled):
                execute_with(con, rows + tail, dict(zip(names, (t for _, t in tables))))
                return
            execute_with(con, rows, dict(zip(names, (t for _, t in tables))))
            for run_id, end in self.finished:
                con.execute(FINISH_SQL, finish_params(run_id, end, cleaner))
            for run_id, added in notes:
                added = [n.encode("utf-8", "backslashreplace").decode("utf-8") for n in added]
                con.execute("UPDATE runs SET notes = list_concat(coalesce(notes, []::VARCHAR[]), ?::VARCHAR[]) "
                            "WHERE run_id = ?", [added, run_id])
            for run_id, steps in self.journaled:
                if steps is None:
                    con.execute("DELETE FROM step_journal WHERE run_id = ?", [run_id])
                else:
                    con.execute("DELETE FROM step_journal WHERE run_id = ? AND step IN (SELECT unnest(?::INTEGER[]))",
                                [run_id, steps])
            con.execute(tail)
        except BaseException:
            rollback(con)
            raise


META_SQL = "INSERT INTO tracemem_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
"""What a batch moves in `tracemem_meta`: how far a DuckDB file's journal the tables hold (`journal_applied`), and
the token of the last batch this store opening committed (`batch:<lease>`)."""


def meta_sql(key: str, value: str) -> str:
    """META_SQL with its values written in as SQL strings, to go in one call with other statements."""
    key, value = (text.replace("'", "''") for text in (key, value))
    return META_SQL.replace("?, ?", f"'{key}', '{value}'") + "; "


def insert_sql(table: str, name: str, columns: Sequence[str]) -> str:
    """The statement inserting batch `name` into `table`; content-keyed tables take only keys they lack."""
    key = CONTENT_KEYS.get(table)
    if key is None:
        return f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM {name}; "
    return (f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM {name} b WHERE NOT EXISTS "
            f"(SELECT 1 FROM {table} t WHERE t.{key} = b.{key}) QUALIFY row_number() OVER (PARTITION BY b.{key}) = 1; ")


_EXECUTE = compile("con.execute(sql).fetchall()", "<tracemem: Arrow tables in scope>", "exec")


def execute_with(con: Any, sql: str, tables: dict[str, pa.Table]) -> None:
    """Run `sql` on `con` with `tables` readable by name for this call only. DuckDB's Python client finds a
    name no table has among the calling frame's local variables (its replacement scan), so the tables go in
    as the locals of a one-line frame: no register() and unregister() calls around it, and no catalog change."""
    exec(_EXECUTE, {}, {"con": con, "sql": sql, **tables})  # noqa: S102 - a fixed, compiled line


def rollback(con: Any) -> None:
    """Roll back the open transaction, if DuckDB still has one (a failed COMMIT ends it, and a second
    error from ROLLBACK would hide the first, e.g. ENOSPC behind "no transaction is active")."""
    try:
        con.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the caller raises the error that matters
        pass
