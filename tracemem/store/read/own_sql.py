"""tracemem's own fixed queries on a store's connection, beside the SQL people type.

Why: `store.sql()` on a read-only store is user SQL, so it is fenced (DuckDB: a locked-down
instance, store/read/user_sql.py; PostgreSQL: the store's reader role, refused on a superuser session,
store/pg/reader.py). The CLI and the viewer also run SQL of their own: fixed text with parameters,
written in this package. That runs here, on the connection tracemem reads with
(`store.backend.con`), which a read-only Store opened read-only (DuckDB refuses any change on it;
PostgreSQL runs it as the login of the URL, as every loader does), so a fleet's superuser URL still
lists runs while it may not run user SQL.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["own_rows"]


def own_rows(store: Any, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of one of tracemem's own queries (`?` parameters, on both backends)."""
    with store.lock:
        cursor = store.backend.con.execute(query, list(params))
        return [d[0] for d in cursor.description], [tuple(r) for r in cursor.fetchall()]
