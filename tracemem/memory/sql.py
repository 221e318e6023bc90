"""The SQL side of the memory: every statement against `memories` and `memory_events`.

Callers hold the store's lock; nothing here takes it. Bulk inserts go through
Arrow (a registered table and one INSERT ... SELECT), because row-by-row
executemany manages only hundreds of rows a second.
"""

from __future__ import annotations

import itertools
import json
import warnings
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from . import fingerprint
from .fingerprint import Fingerprint
from ..dbmeta import META_DDL
from .tables import MEMORY_COLUMNS, MEMORY_DDL

__all__ = ["transaction", "insert_records", "records_table", "insert_table", "insert_events",
           "fetch_records", "load_live", "update_record", "update_statement", "write_embeddings", "get_meta", "set_meta",
           "ensure_tables", "event_json", "event_text", "SHARED"]

SHARED = False  # one process writes a DuckDB file: its index is the truth (see memory/shared.py)

_COLS = ", ".join(MEMORY_COLUMNS)
_names = itertools.count()


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN/COMMIT around a change, so a record never exists without its event.

    If the caller already opened a transaction on this shared connection, join it.
    """
    try:
        con.execute("BEGIN TRANSACTION")
    except duckdb.TransactionException:
        yield
        return
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def records_table(recs: Sequence[tuple[Any, ...]], vecs: np.ndarray | None, dim: int | None) -> pa.Table:
    """The Arrow table `insert_records` writes (built apart: a bulk insert builds the next while one is written)."""
    cols = list(zip(*recs)) if recs else [() for _ in MEMORY_COLUMNS]
    data: dict[str, pa.Array] = {}
    types = {
        "tags": pa.list_(pa.string()), "confidence": pa.float64(), "source_step": pa.int32(),
        "valid_from": pa.timestamp("us"), "valid_until": pa.timestamp("us"), "created_at": pa.timestamp("us"),
        "updated_at": pa.timestamp("us"), "deleted_at": pa.timestamp("us"),
    }
    for name, values in zip(MEMORY_COLUMNS, cols):
        values = [list(v) for v in values] if name == "tags" else list(values)
        data[name] = pa.array(values, type=types.get(name, pa.string()))
    if vecs is None or dim is None:
        data["embedding"] = pa.array([None] * len(recs), type=pa.list_(pa.float32()))
    else:
        flat = pa.array(np.ascontiguousarray(vecs, dtype=np.float32).ravel())
        data["embedding"] = pa.ListArray.from_arrays(pa.array(np.arange(0, len(recs) * dim + 1, dim, dtype=np.int32)), flat)
    return pa.table(data)


def insert_records(con: duckdb.DuckDBPyConnection, recs: Sequence[tuple[Any, ...]],
                   vecs: np.ndarray | None, dim: int | None) -> list[tuple[str, Fingerprint, int]]:
    """Insert full records (MEMORY_COLUMNS tuples) and their vectors in one statement.

    Returns what the rows add to the table's fingerprint (see fingerprint.py).
    """
    if not recs:
        return []
    return insert_table(con, records_table(recs, vecs, dim))


def insert_table(con: duckdb.DuckDBPyConnection, table: pa.Table) -> list[tuple[str, Fingerprint, int]]:
    """Insert a `records_table`; returns what its rows add to the table's fingerprint."""
    name = f"_tracemem_mem_{next(_names)}"
    con.register(name, table)
    try:
        con.execute(f"INSERT INTO memories ({_COLS}, embedding) SELECT {_COLS}, embedding FROM {name}")
        return [(s, fp, +1) for s, fp in fingerprint.of_relation(con, name).items()]
    finally:
        con.unregister(name)


def event_json(value: dict[str, Any] | None) -> str | None:
    """The text stored in `memory_events.old`/`new` for a dict of fields (None stays NULL)."""
    return None if value is None else json.dumps(value, default=str, sort_keys=True)


def event_text(value: dict[str, Any] | str | None) -> str | None:
    """`event_json`, or the text as it is when a caller made it already (remember events: memory/bulk.py)."""
    return value if isinstance(value, str) else event_json(value)


def insert_events(con: duckdb.DuckDBPyConnection, events: Sequence[tuple[str, str, Any, Any, str | None, datetime, str | None]]) -> None:
    """Append (memory_id, event, old, new, run_id, at, reason) rows; ids come from the sequence."""
    if not events:
        return
    if len(events) == 1:
        mid, ev, old, new, run_id, at, reason = events[0]
        con.execute('INSERT INTO memory_events (memory_id, event, old, new, run_id, "at", reason) VALUES (?, ?, ?, ?, ?, ?, ?)',
                    [mid, ev, event_text(old), event_text(new), run_id, at, reason])
        return
    mids, evs, olds, news, runs, ats, reasons = zip(*events)
    tbl = pa.table({
        "memory_id": pa.array(mids, pa.string()), "event": pa.array(evs, pa.string()),
        "old": pa.array([event_text(o) for o in olds], pa.string()), "new": pa.array([event_text(n) for n in news], pa.string()),
        "run_id": pa.array(runs, pa.string()), "at": pa.array(ats, pa.timestamp("us")),
        "reason": pa.array(reasons, pa.string()),
    })
    name = f"_tracemem_ev_{next(_names)}"
    con.register(name, tbl)
    try:
        con.execute(f'INSERT INTO memory_events (memory_id, event, old, new, run_id, "at", reason) '
                    f'SELECT memory_id, event, old, new, run_id, "at", reason FROM {name}')
    finally:
        con.unregister(name)


def fetch_records(con: duckdb.DuckDBPyConnection, where: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    return con.execute(f"SELECT {_COLS} FROM memories WHERE {where}", list(params)).fetchall()


def update_statement(memory_id: str, fields: dict[str, Any],
                     embedding: str = "CAST(? AS FLOAT[])") -> tuple[str, list[Any]]:
    """The UPDATE of the given columns of one record (embedding as a float list, cast by `embedding`)."""
    sets, params = [], []
    for col, value in fields.items():
        if col not in MEMORY_COLUMNS and col != "embedding":
            raise KeyError(col)
        if col == "tags":
            value = list(value)
        elif col == "embedding" and value is not None:
            value = np.asarray(value, dtype=np.float32).tolist()
        sets.append(f"{col} = ?" if col != "embedding" else f"embedding = {embedding}")
        params.append(value)
    return f"UPDATE memories SET {', '.join(sets)} WHERE memory_id = ?", [*params, memory_id]


def update_record(con: duckdb.DuckDBPyConnection, memory_id: str, fields: dict[str, Any]) -> None:
    """UPDATE the given columns of one record (embedding as a float list)."""
    con.execute(*update_statement(memory_id, fields))


def load_live(con: duckdb.DuckDBPyConnection,
              subjects: Sequence[str] | None = None) -> tuple[list[tuple[Any, ...]], list[np.ndarray | None]]:
    """Records not forgotten (of the given subjects, or all), with their embeddings, through Arrow."""
    where = "deleted_at IS NULL"
    if subjects is not None:
        where += " AND subject IN (SELECT unnest(?::VARCHAR[]))"
    query = f"SELECT {_COLS}, embedding FROM memories WHERE {where} ORDER BY updated_at, rowid"  # in the order of writes, as the index adds rows
    params = [] if subjects is None else [list(subjects)]
    try:
        rel = con.sql(query, params=params) if params else con.sql(query)
        tbl = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    except duckdb.Error:  # another user of the shared connection left a result open: execute() supersedes it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = con.execute(query, params)
            tbl = res.to_arrow_table() if hasattr(res, "to_arrow_table") else res.fetch_arrow_table()
    if isinstance(tbl, pa.RecordBatchReader):
        tbl = tbl.read_all()
    columns = [tbl.column(c).to_pylist() for c in MEMORY_COLUMNS]
    recs = [tuple(r) for r in zip(*columns)] if tbl.num_rows else []
    emb = tbl.column("embedding").combine_chunks()
    vecs: list[np.ndarray | None] = []
    if tbl.num_rows:
        offsets = emb.offsets.to_numpy()
        values = emb.values.to_numpy(zero_copy_only=False)
        valid = emb.is_valid().to_numpy(zero_copy_only=False)
        for i in range(tbl.num_rows):
            vecs.append(values[offsets[i]:offsets[i + 1]] if valid[i] else None)
    return recs, vecs


def write_embeddings(con: duckdb.DuckDBPyConnection, ids: Sequence[str], vecs: np.ndarray, embedder_id: str) -> None:
    """Store vectors for records that had none (indexed lazily after an embedder was configured)."""
    dim = vecs.shape[1]
    tbl = pa.table({
        "memory_id": pa.array(list(ids), pa.string()),
        "embedding": pa.ListArray.from_arrays(pa.array(np.arange(0, len(ids) * dim + 1, dim, dtype=np.int32)),
                                              pa.array(np.ascontiguousarray(vecs, dtype=np.float32).ravel())),
    })
    name = f"_tracemem_vec_{next(_names)}"
    con.register(name, tbl)
    try:
        con.execute(f"UPDATE memories SET embedding = v.embedding, embedder_id = ? FROM {name} v "
                    f"WHERE memories.memory_id = v.memory_id", [embedder_id])
    finally:
        con.unregister(name)


def get_meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    rows = con.execute("SELECT value FROM tracemem_meta WHERE key = ?", [key]).fetchall()  # fetchall: leave no open result
    return rows[0][0] if rows else None


def set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute("INSERT INTO tracemem_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value", [key, value])


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the memory tables if missing (the store already has; a bare connection in tests may not)."""
    for stmt in [META_DDL, *MEMORY_DDL]:
        con.execute(stmt)
