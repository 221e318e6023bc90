"""Bulk rows into PostgreSQL with COPY: a batch of runs as one transaction.

Why COPY through CSV written by Arrow: `executemany` costs a round trip (or a pipeline slot)
and Python work per row; COPY streams the rows in one statement per table, and Arrow's C++
CSV writer turns a whole column of timestamps, numbers and quoted strings into that stream
without a Python loop per value. The batch's rows are the same `COLUMNS` tuples the DuckDB
writer registers as Arrow tables; only list columns (text[], real[], vector) are spelled as
PostgreSQL array literals first, and NUL characters, which PostgreSQL text cannot hold,
become U+FFFD.
"""
from __future__ import annotations

import io
import math
from functools import lru_cache
from typing import Any, Optional, Sequence

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ..batch import CONTENT_KEYS, GIVEN, Batch, table_arrays
from .connection import PgConnection, PgError, first_line, quote_ident

__all__ = ["copy_table", "insert_batch", "array_literal", "vector_literal", "FEED_LOCK"]

FINISH_SQL = ("UPDATE runs SET status = ?, error = ?, output = ?, query = ?, notes = ?, degraded = ?, "
              "ended_at = make_timestamp_ns(?), trace_id = coalesce(?, trace_id), pending = ?, resume_at = ?, "
              "span_id = coalesce(?, span_id), duration_ms = (? - epoch_ns(started_at)) / 1e6 WHERE run_id = ?")

FEED_LOCK = 0x7473  # advisory-lock class: rows of a followed table (run_embeddings) get their seq in commit order
_OPTIONS = pcsv.WriteOptions(include_header=False)


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


def _column(values: Any, kind: pa.DataType, vector: bool) -> Any:
    """One column (Python values, or already an Arrow array) as an Arrow array COPY can read as CSV."""
    arrow = isinstance(values, (pa.Array, pa.ChunkedArray))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        spell = vector_literal if vector else array_literal
        return pa.array([None if v is None else "{}" if not len(v) and not vector else spell(v)
                         for v in (values.to_pylist() if arrow else values)], type=pa.string())
    arr = values if arrow else pa.array(values, type=kind)
    if pa.types.is_string(kind) and arr.null_count < len(arr):
        arr = pc.replace_substring(arr, "\x00", "\ufffd")
    return arr


def copy_table(con: PgConnection, table: str, names: Sequence[str], kinds: Sequence[pa.DataType],
               columns: Sequence[Sequence[Any]], *, vectors: Sequence[str] = ()) -> None:
    """COPY rows, given column by column, into `table` (`vectors`: list columns typed pgvector `vector`)."""
    if not columns or not len(columns[0]):
        return  # (Arrow arrays and lists both have a length)
    arrays = [_column(values, kind, name in vectors) for name, kind, values in zip(names, kinds, columns)]
    buffer = io.BytesIO()
    pcsv.write_csv(pa.Table.from_arrays(arrays, names=list(names)), buffer, _OPTIONS)
    cols = ", ".join(quote_ident(n) for n in names)
    with con.lock:
        try:
            with con.raw.cursor() as cur:
                with cur.copy(f"COPY {quote_ident(table)} ({cols}) FROM STDIN (FORMAT csv)") as copy:
                    copy.write(buffer.getbuffer())
        except psycopg.Error as err:
            raise PgError(f"{con.target.label}: copying rows into {table} failed: {first_line(err)}") from err


def insert_batch(con: PgConnection, batch: Batch, lease: Optional[str]) -> None:
    """Everything a batch holds, as one transaction: COPY per table, then the runs it completes and the
    journal rows it supersedes. `lease` is recorded on the runs rows it starts (crash recovery)."""
    tables = [(t, columns) for t, columns in batch.columns() if t != "run_embeddings"]
    with con.transaction():
        for table, columns in tables:
            arrays = table_arrays(table, columns)
            if table == "runs" and "lease" not in arrays:
                arrays["lease"] = pa.array([lease] * len(columns[0]), pa.string())
            key = CONTENT_KEYS.get(table)
            if key is None:
                copy_table(con, table, list(arrays), [a.type for a in arrays.values()], list(arrays.values()))
                continue
            # keyed by content: copied beside the table, then inserted where its key is new (another writer may
            # have inserted the same content a moment ago; the unique key settles it)
            staged = f"tracemem_new_{table}"
            con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {staged} (LIKE {quote_ident(table)}) ON COMMIT DELETE ROWS")
            copy_table(con, staged, list(arrays), [a.type for a in arrays.values()], list(arrays.values()))
            names = ", ".join(quote_ident(n) for n in arrays)
            con.execute(f"INSERT INTO {quote_ident(table)} ({names}) SELECT {names} FROM {staged} "
                        f"ON CONFLICT ({quote_ident(key)}) DO NOTHING")
        if batch.finished:  # the runs rows these runs' ends complete (the DuckDB writer's statement, batch.py)
            con.executemany(FINISH_SQL, [[e["status"], e["error"], e["output"], e["query"], e.get("notes"),
                                          e.get("degraded"), e["ended_at"], e["trace_id"], e.get("pending"),
                                          e.get("resume_at"), e.get("span_id"), e["ended_at"], run_id]
                                         for run_id, e in batch.finished])
        for run_id, notes in batch.notes.items():  # what recovery had to leave out of a run, said on it
            con.execute("UPDATE runs SET notes = coalesce(notes, '{}'::text[]) || ?::text[] WHERE run_id = ?",
                        [notes, run_id])
        if batch.journaled:
            con.execute("DELETE FROM step_journal WHERE run_id = ANY(?::text[])", [batch.journaled])
        for run_id, steps in batch.journaled_steps:
            con.execute("DELETE FROM step_journal WHERE run_id = ? AND kind = 'step' AND step = ANY(?::integer[])",
                        [run_id, steps])
        embeddings = batch.rows["run_embeddings"]
        if embeddings:  # last, under a lock held to the commit: seq values then become visible in order
            con.execute("SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", [FEED_LOCK])
            spec = GIVEN["run_embeddings"]
            copy_table(con, "run_embeddings", [c for c, _ in spec], [k for _, k in spec], list(zip(*embeddings)))
