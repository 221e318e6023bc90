"""`tracemem_meta`: the key/value table every tracemem file carries.

It holds the format marker, the schema version, the secret salt and the memory
index's embedder facts. Both the store and the memory tables read and write it,
so its one definition lives here, below both.
"""
from __future__ import annotations

from typing import Any, Optional

META_DDL = "CREATE TABLE IF NOT EXISTS tracemem_meta (key VARCHAR PRIMARY KEY, value VARCHAR)"


def first_row(result: Any) -> Optional[tuple]:
    """The first row of a DuckDB result, draining the rest (DuckDB 2 keeps an unfinished result
    open, which blocks its connection)."""
    rows = result.fetchall()
    return rows[0] if rows else None


def get_meta(con: Any, key: str) -> Optional[str]:
    """A value of `tracemem_meta` (None when unset)."""
    row = first_row(con.execute("SELECT value FROM tracemem_meta WHERE key = ?", [key]))
    return row[0] if row else None


def set_meta(con: Any, key: str, value: str) -> None:
    """Set a value of `tracemem_meta`."""
    con.execute("INSERT INTO tracemem_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value", [key, value])
