"""What `store.sql()` returns on PostgreSQL: the methods people use on a DuckDB relation.

A DuckDB relation is lazy; this result holds its rows (a query over a fleet database is run
once, on the server, and its rows come back). `fetchall()`, `fetchone()`, `fetchmany()`,
`limit(n)`, `columns`, `types`, `arrow()` (a record batch reader, as DuckDB 2 gives),
`to_arrow_table()`, `df()` (also `fetchdf()`, with pandas installed) and `show()` behave as
DuckDB's do, so code written against one store works against the other.
"""
from __future__ import annotations

from datetime import date, datetime
from typing import Any, Optional, Sequence

import pyarrow as pa

__all__ = ["SQLResult", "ARROW_TYPES"]

# PostgreSQL type names → Arrow, for columns whose values alone do not say (all NULL, or empty)
ARROW_TYPES: dict[str, pa.DataType] = {
    "text": pa.string(), "varchar": pa.string(), "json": pa.string(), "jsonb": pa.string(), "name": pa.string(),
    "int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "float4": pa.float32(), "float8": pa.float64(),
    "numeric": pa.float64(), "bool": pa.bool_(), "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"), "date": pa.date32(), "_text": pa.list_(pa.string()),
    "_varchar": pa.list_(pa.string()), "_float4": pa.list_(pa.float32()), "_float8": pa.list_(pa.float64()),
    "_int4": pa.list_(pa.int32()), "_int8": pa.list_(pa.int64()), "vector": pa.list_(pa.float32()),
}


class SQLResult:
    """The rows and column names (and PostgreSQL type names) of one query."""

    def __init__(self, columns: Sequence[str], types: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns = list(columns)
        self.types = list(types)
        self.rows = rows
        self._at = 0

    def __repr__(self) -> str:
        return f"<SQLResult {len(self.rows)} rows: {', '.join(self.columns)}>"

    def __len__(self) -> int:
        return len(self.rows)

    def limit(self, n: int) -> "SQLResult":
        """The first `n` rows (as DuckDB's `relation.limit(n)`)."""
        return SQLResult(self.columns, self.types, self.rows[:n])

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every row (as DuckDB's relation gives them, each call)."""
        return list(self.rows)

    def fetchone(self) -> Optional[tuple[Any, ...]]:
        if self._at >= len(self.rows):
            return None
        self._at += 1
        return self.rows[self._at - 1]

    def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        out = self.rows[self._at:self._at + size]
        self._at += len(out)
        return out

    def to_arrow_table(self) -> pa.Table:
        """The rows as an Arrow table."""
        arrays = []
        for i, (name, kind) in enumerate(zip(self.columns, self.types)):
            values = [row[i] for row in self.rows]
            want = ARROW_TYPES.get(kind)
            try:
                arrays.append(pa.array(values, type=want) if want is not None else pa.array(values))
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                arrays.append(pa.array([None if v is None else str(v) for v in values], type=pa.string()))
        return pa.Table.from_arrays(arrays, names=_unique(self.columns))

    def arrow(self) -> pa.RecordBatchReader:
        """The rows as an Arrow record batch reader (as DuckDB 2's `relation.arrow()`; `.read_all()` is a table)."""
        table = self.to_arrow_table()
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())

    def df(self) -> Any:
        """The rows as a pandas DataFrame (pip install pandas)."""
        return self.to_arrow_table().to_pandas()

    fetchdf = df

    def show(self, max_width: int = 120) -> None:
        """Print the rows as a table."""
        shown = [[_cell(v) for v in row] for row in self.rows[:40]]
        widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(self.columns)]
        widths = [min(w, max(8, max_width // max(1, len(widths)))) for w in widths]
        line = lambda cells: "  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        print(line(self.columns))
        print(line(["-" * w for w in widths]))
        for row in shown:
            print(line(row))
        if len(self.rows) > 40:
            print(f"({len(self.rows)} rows, 40 shown)")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (datetime, date)):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    return str(value)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name}_{n}")
    return out
