"""DuckDB 2 keeps a result open until a fetch returns nothing, blocking the connection;
`first` reads one row and drains the rest."""
from __future__ import annotations

from typing import Any, Optional


def first(result: Any) -> Optional[tuple]:
    rows = result.fetchall()
    return rows[0] if rows else None
