"""Folding journal entries into the tables inside DuckDB, off the GIL.

Why: to journal a finished run, or each stage of a durability "stage" run (store/run_log.py),
the flow's thread has already encoded its records as JSON entries (store/log_codec.py).
Building the same runs, steps, reads and writes rows again as Arrow columns from Python
tuples held the GIL for ~3 µs per stage in the background writer (~5 under durability
"stage"), time the flow's thread spent waiting. DuckDB parses the entries itself,
without the GIL: a batch's entries go in as one JSON text, are parsed once into a temporary
table, and four statements prepared when the file opens unnest them into their tables,
each column cast as `batch.GIVEN` types it and
`duration_ms` derived as `Batch` derives it. A run's decisions and extra rows (whose JSON
text the store writes with the standard library's formatting), and the runs row of a run
journaled stage by stage, still go the Python way, in the same transaction.

The SQL is generated from `batch.GIVEN` and log_codec's entry layout, so a column added
to a table reaches the fold as it reaches the journal. A value DuckDB cannot parse or cast
(a lone surrogate, an int beyond 32 bits) fails the batch; the writer then writes its runs
again the Python way (`Writer._write`), which makes values storable and notes each change.

The JSON text is a string literal in the batch's SQL rather than an Arrow table: DuckDB's
Python client hands the GIL back and forth while it scans a Python object, and each time the
background writer then waits for the flow's thread to give the GIL up (~1 ms); with the text
in the SQL a batch takes the GIL back about half as often (bench/writer_gil.py counts it).
"""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from .batch import GIVEN, NS, F, I

__all__ = ["EntryFold"]

PARSED = "_tracemem_entries"  # a temporary table: one row per entry, its items as text (`e`)
# 1-based positions of a log_codec entry's items: [version, kind, run_id, steps, reads, writes, run, end, free]
KIND, RUN_ID, RECORDS, RUN_ROW = 2, 3, {"steps": 4, "reads": 5, "writes": 6}, 7
TEXT_LIST = '["VARCHAR"]'  # a JSON array, its items as text (strings decoded, anything else as its JSON)


def _cast(item: str, kind: pa.DataType) -> str:
    """SQL turning a JSON item (as text) into the column's type, as Arrow turns the Python value."""
    if kind == NS:
        return f"make_timestamp_ns({item}::BIGINT)"
    if kind == I:
        return f"{item}::INTEGER"
    if kind == F:
        return f"{item}::DOUBLE"
    if kind == pa.bool_():
        return f"{item}::BOOLEAN"
    if kind == pa.list_(pa.string()):
        return f"from_json({item}, '{TEXT_LIST}')"
    return item  # text, and JSON held as text


def _insert(table: str, values: list[str], source: str) -> str:
    """`INSERT INTO table` from the given columns' expressions (and `duration_ms` where it is derived)."""
    names = [c for c, _ in GIVEN[table]]
    exprs = [_cast(v, kind) for v, (_, kind) in zip(values, GIVEN[table])]
    if table in ("runs", "steps"):  # derived as batch._derived derives it: the ns timestamps' difference
        at = {c: v for c, v in zip(names, values)}
        names.append("duration_ms")
        exprs.append(f"({at['ended_at']}::BIGINT - {at['started_at']}::BIGINT) / 1e6")
    return f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(exprs)} FROM {source}"


def statements() -> dict[str, str]:
    """The fold's statement per table: the runs row is a whole-run entry's run item; steps, reads and writes
    are any entry's records, a whole run's or a stage's (their fields in `GIVEN` order after the run id)."""
    runs = _insert("runs", [f"r[{i + 1}]" for i in range(len(GIVEN["runs"]))],
                   f"(SELECT from_json(e[{RUN_ROW}], '{TEXT_LIST}') AS r FROM {PARSED} WHERE e[{KIND}] = 'run')")
    out = {"runs": runs}
    for table, at in RECORDS.items():
        fields = [f"x[{i}]" for i in range(1, len(GIVEN[table]))]
        out[table] = _insert(table, ["run_id", *fields],
                             f"(SELECT e[{RUN_ID}] AS run_id, unnest(from_json(e[{at}], '[{TEXT_LIST}]')) AS x "
                             f"FROM {PARSED})")
    return out


class EntryFold:
    """The fold on one DuckDB connection: its temporary table and prepared statements, made once."""

    def __init__(self, con: Any) -> None:
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {PARSED} (e VARCHAR[])")
        self.names: list[str] = []  # the prepared statements, in the order they run
        for table, sql in statements().items():
            name = f"_tracemem_fold_{table}"
            con.execute(f"PREPARE {name} AS {sql}")
            self.names.append(name)
        # what goes before and after the entries in `sql`: the literal is a subquery's column with an alias,
        # so no expression holding it is named after its own SQL text (DuckDB would write the ~0.5 MB literal
        # out again, quoted, to name it: the entries' insert of a 200-run batch took 9.6 ms here, now 6.9)
        self._head = f"INSERT INTO {PARSED} SELECT unnest(from_json(j, '[{TEXT_LIST}]')) AS e FROM (SELECT '[".encode()
        self._tail = (f"]' AS j); " + "".join(f"EXECUTE {name}; " for name in self.names)
                      + f"DELETE FROM {PARSED}; ").encode()

    def sql(self, entries: Sequence[bytes], before: str = "", after: str = "") -> str:
        """The statements that fold a batch's entries in, between `before` and `after` (inside its transaction):
        one JSON array of them as a string literal (JSON has no character a literal must escape but the quote,
        which it doubles). Built in one pass: a batch's entries are ~0.5 MB, and each concatenation copies
        them (four took ~1.3 ms a batch of 300 runs, holding the GIL; one pass takes ~0.45)."""
        if any(b"'" in entry for entry in entries):
            entries = [entry.replace(b"'", b"''") for entry in entries]
        parts = [before.encode(), self._head]
        for entry in entries:
            parts += (entry, b",")
        if entries:
            parts.pop()  # the last comma
        parts += (self._tail, after.encode())
        return b"".join(parts).decode()
