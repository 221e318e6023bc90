"""Bulk rows into PostgreSQL with COPY: a batch of runs as one transaction.

Why COPY through CSV written by Arrow: `executemany` costs a round trip (or a pipeline slot)
and Python work per row; COPY streams the rows in one statement per table, and Arrow's C++
CSV writer turns a whole column of timestamps, numbers and quoted strings into that stream
without a Python loop per value. The batch's rows are the same Arrow tables the DuckDB
writer inserts (`Batch.arrow`); only list columns (text[], real[], vector) are spelled as
PostgreSQL array literals first.

Text is stored as on DuckDB: what a column cannot hold is escaped and noted on its run
(store/write/storable.py). PostgreSQL cannot hold what DuckDB cannot (a lone surrogate), nor a NUL
character (in text, or escaped inside JSON, where `->>` could not give it back): a batch
holding one (found with one scan of the CSV for NUL, and of the JSON columns for `\\u0000`
and surrogate escapes) is built again with every value made storable, NULs as `\\u0000`, each
change noted on its run in the same transaction, as is a batch the server refuses for a value.
"""
from __future__ import annotations

import io
import json
import math
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ...errors import TracememError
from ..write.rows import CONTENT_KEYS, FINISH_SQL, JSON_COLUMNS, META_SQL, Batch, finish_params
from ..diagnose import is_data_error
from ..write.storable import Cleaner, storable_value
from .connection import PgConnection, PgError, first_line, quote_ident

__all__ = ["copy_table", "copy_arrow", "insert_batch", "array_literal", "vector_literal", "FEED_LOCK", "NotStorable",
           "is_pg_data_error"]

FEED_LOCK = 0x7473  # advisory-lock class: rows of a followed table (run_embeddings) get their seq in commit order
_OPTIONS = pcsv.WriteOptions(include_header=False)
_ESCAPES = r"\\u(0000|[dD][89abcdefABCDEF])"  # in JSON text: a NUL, or half of a surrogate pair (maybe a lone one)


class NotStorable(TracememError, ValueError):
    """A value PostgreSQL cannot hold as it is (a NUL character, a lone surrogate): the batch is built again
    with every value made storable (a ValueError, so store/diagnose.py calls it a data error)."""


def is_pg_data_error(err: BaseException) -> bool:
    """Whether `err` is about a value (Arrow could not hold it, or the server refused it: SQLSTATE 22 or 23)."""
    if is_data_error(err):
        return True
    cause = err.__cause__
    return isinstance(cause, (psycopg.DataError, psycopg.IntegrityError)) or \
        cause is not None and is_data_error(cause)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=16)
def _float_format(n: int) -> str:
    return ",".join(["%.9g"] * n)  # 9 significant digits: every float32 reads back exactly


def _floats(values: np.ndarray) -> str:
    """A float vector as text, formatted in C (one % for the whole row) rather than per value in Python."""
    flat = values.reshape(-1)
    if not np.isfinite(flat).all():
        return ",".join(_number(float(v)) for v in flat.tolist())
    return _float_format(len(flat)) % tuple(flat.tolist())


def array_literal(values: Optional[Sequence[Any]]) -> Optional[str]:
    """A PostgreSQL array literal ({...}) for a list of strings or numbers (None stays NULL)."""
    if values is None:
        return None
    if isinstance(values, np.ndarray):
        return "{" + _floats(values) + "}"
    if not values:
        return "{}"
    if all(isinstance(v, float) for v in values):  # an embedding as a list
        return "{" + _floats(np.asarray(values, dtype=np.float32)) + "}"
    return "{" + ",".join("NULL" if v is None else _quote(v) if isinstance(v, str) else _number(v)
                          for v in values) + "}"


def vector_literal(values: Optional[Sequence[float]]) -> Optional[str]:
    """A pgvector literal ([...])."""
    if values is None:
        return None
    return "[" + _floats(np.asarray(values, dtype=np.float32)) + "]"


def _number(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return repr(float(v)) if isinstance(v, (float, np.floating)) else str(v)


def _column(values: Any, kind: pa.DataType, vector: bool, escape_nul: bool = False) -> Any:
    """One column (Python values, or already an Arrow array) as an Arrow array COPY can read as CSV
    (`escape_nul`: each NUL character of its text as the six characters `\\u0000`)."""
    arrow = isinstance(values, (pa.Array, pa.ChunkedArray))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        spell = vector_literal if vector else array_literal
        items = values.to_pylist() if arrow else values
        if escape_nul and not vector:
            items = [v if v is None else [x.replace("\x00", "\\u0000") if isinstance(x, str) else x for x in v]
                     for v in items]
        return pa.array([None if v is None else "{}" if not len(v) and not vector else spell(v)
                         for v in items], type=pa.string())
    arr = values if arrow else pa.array(values, type=kind)
    if escape_nul and pa.types.is_string(kind):
        arr = pc.replace_substring(arr, "\x00", "\\u0000")
    return arr


def copy_table(con: PgConnection, table: str, names: Sequence[str], kinds: Sequence[pa.DataType],
               columns: Sequence[Sequence[Any]], *, vectors: Sequence[str] = (), escape_nul: bool = False) -> None:
    """COPY rows, given column by column, into `table` (`vectors`: list columns typed pgvector `vector`). Text
    holding a NUL character raises `NotStorable`, unless `escape_nul` (then it is stored as `\\u0000`)."""
    if not columns or not len(columns[0]):
        return  # (Arrow arrays and lists both have a length)
    arrays = [_column(values, kind, name in vectors, escape_nul) for name, kind, values in zip(names, kinds, columns)]
    buffer = io.BytesIO()
    pcsv.write_csv(pa.Table.from_arrays(arrays, names=list(names)), buffer, _OPTIONS)
    data = buffer.getvalue()
    if b"\x00" in data:  # (one memchr: a NUL byte is only ever a NUL character of some text)
        raise NotStorable(f"a NUL character in a text value of {table}, which PostgreSQL text cannot hold")
    cols = ", ".join(quote_ident(n) for n in names)
    with con.lock:
        try:
            with con.raw.cursor() as cur:
                with cur.copy(f"COPY {quote_ident(table)} ({cols}) FROM STDIN (FORMAT csv)") as copy:
                    copy.write(data)
        except psycopg.Error as err:
            raise PgError(f"{con.target.label}: copying rows into {table} failed: {first_line(err)}") from err


def _texts(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        pa.types.is_list(kind) and pa.types.is_string(kind.value_type)


def copy_arrow(con: PgConnection, table: str, data: pa.Table, vectors: Sequence[str] = ()) -> dict[str, list[str]]:
    """COPY an Arrow table's rows into `table` (columns by name), as `tracemem copy` does. A value PostgreSQL
    cannot hold (a NUL character from a DuckDB file) is escaped as the writer escapes it and noted on the run
    its row belongs to, in `runs.notes` and in what is returned (run id -> notes): one such value never
    keeps the other rows out."""
    names, kinds = data.column_names, [f.type for f in data.schema]
    try:
        _check_json(table, data)
        with _undoable(con):
            copy_table(con, table, names, kinds, list(data.columns), vectors=vectors)
        return {}
    except Exception as err:
        if not is_pg_data_error(err):
            raise
    cleaner = Cleaner(nul=True)
    ids = data.column("run_id").to_pylist() if "run_id" in names else [None] * data.num_rows
    steps = data.column("step").to_pylist() if "step" in names else None
    columns = [cleaner.column(table, name, kind, (table, name) in JSON_COLUMNS, data.column(name).to_pylist(), ids,
                              steps) if _texts(kind) else data.column(name) for name, kind in zip(names, kinds)]
    with _undoable(con):
        copy_table(con, table, names, [c.type for c in columns], columns, vectors=vectors)
        notes = cleaner.rendered()
        for run_id, lines in notes.items():
            con.execute("UPDATE runs SET notes = coalesce(notes, '{}'::text[]) || ?::text[] WHERE run_id = ?",
                        [[f"copied: {line}" for line in lines], run_id])
    return notes


def _json_storable(column: pa.Array) -> bool:
    """Whether a column of JSON text holds no escaped NUL nor lone surrogate (PostgreSQL's `json` takes both,
    but `->>` cannot give them back as text): a regex over the column, and a look at each row it matches."""
    hits = pc.match_substring_regex(column, _ESCAPES)
    if not pc.any(hits).as_py():
        return True
    for text in column.filter(hits).to_pylist():
        try:
            if storable_value(json.loads(text), nul=True)[1]:
                return False
        except ValueError:  # not JSON at all: the server says so, and the batch is cleaned then
            return False
    return True


def _check_json(table: str, data: pa.Table) -> None:
    """Raise `NotStorable` when a JSON column holds an escaped NUL or lone surrogate (`_json_storable`)."""
    for name in data.column_names:
        if (table, name) in JSON_COLUMNS and not _json_storable(data.column(name)):
            raise NotStorable(f"{table}.{name} holds a NUL or a lone surrogate, escaped in its JSON")


@contextmanager
def _undoable(con: PgConnection) -> Iterator[None]:
    """A transaction of its own, or inside the caller's (crash recovery) a savepoint, so a batch the server
    refuses is undone alone and can be tried again."""
    if not con.owns_transaction():
        with con.transaction():
            yield
        return
    con.execute("SAVEPOINT tracemem_batch")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK TO SAVEPOINT tracemem_batch")
        raise
    con.execute("RELEASE SAVEPOINT tracemem_batch")


def insert_batch(con: PgConnection, batch: Batch) -> None:
    """Everything a batch holds, as one transaction: COPY per table, then the runs it completes and the
    journal rows it supersedes; if a value cannot be held, again with every value made storable and each
    change noted on its run (see the module docstring)."""
    try:
        with _undoable(con):
            _insert(con, batch, None)
    except Exception as err:
        if not is_pg_data_error(err):
            raise
        cleaner = Cleaner(nul=True)
        with _undoable(con):
            _insert(con, batch, cleaner)
        for run_id, notes in cleaner.rendered().items():
            if run_id in batch.runs:
                batch.runs[run_id].notes.extend(notes)


def _insert(con: PgConnection, batch: Batch, cleaner: Optional[Cleaner]) -> None:
    tables = batch.arrow(cleaner)  # (a value Arrow cannot hold fails here, before any statement)
    if cleaner is None:
        for table, data in tables:
            _check_json(table, data)
    if cleaner is None and batch.finished:  # (few: runs journaled stage by stage, or resumed)
        probe = Cleaner(nul=True)
        for run_id, end in batch.finished:
            finish_params(run_id, end, probe)
        if probe.notes:
            raise NotStorable("a NUL character or a lone surrogate in a run's end facts")
    for table, data in tables:
        if table == "run_embeddings":
            continue
        key = CONTENT_KEYS.get(table)
        if key is None:
            copy_table(con, table, data.column_names, [f.type for f in data.schema], list(data.columns))
            continue
        # keyed by content: copied beside the table, then inserted where its key is new (another writer may
        # have inserted the same content a moment ago; the unique key settles it)
        staged = f"tracemem_new_{table}"
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {staged} (LIKE {quote_ident(table)}) ON COMMIT DELETE ROWS")
        copy_table(con, staged, data.column_names, [f.type for f in data.schema], list(data.columns))
        names = ", ".join(quote_ident(n) for n in data.column_names)
        con.execute(f"INSERT INTO {quote_ident(table)} ({names}) SELECT {names} FROM {staged} "
                    f"ON CONFLICT ({quote_ident(key)}) DO NOTHING")
    if batch.finished:  # the runs rows these runs' ends complete
        con.executemany(FINISH_SQL, [finish_params(run_id, end, cleaner) for run_id, end in batch.finished])
    added = list(batch.notes.items()) + list(cleaner.rendered().items() if cleaner is not None else ())
    for run_id, notes in added:  # what recovery had to leave out of a run, and what was escaped, said on it
        con.execute("UPDATE runs SET notes = coalesce(notes, '{}'::text[]) || ?::text[] WHERE run_id = ?",
                    [notes, run_id])
    whole = [run_id for run_id, steps in batch.journaled if steps is None]
    if whole:  # the step_journal rows of what this batch writes
        con.execute("DELETE FROM step_journal WHERE run_id = ANY(?::text[])", [whole])
    for run_id, steps in batch.journaled:
        if steps is not None:
            con.execute("DELETE FROM step_journal WHERE run_id = ? AND step = ANY(?::integer[])", [run_id, steps])
    if batch.token is not None:  # what a retry after a lost commit answer looks for
        con.execute(META_SQL, [f"batch:{batch.lease}", batch.token])
    embeddings = [data for table, data in tables if table == "run_embeddings"]
    if embeddings:  # last, under a lock held to the commit: seq values then become visible in order
        con.execute("SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", [FEED_LOCK])
        data = embeddings[0]
        copy_table(con, "run_embeddings", data.column_names, [f.type for f in data.schema], list(data.columns))

