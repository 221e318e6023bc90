"""DuckDB 2 keeps a result open until a fetch returns nothing, blocking the connection;
`first` reads one row and drains the rest."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional


def first(result: Any) -> Optional[tuple]:
    rows = result.fetchall()
    return rows[0] if rows else None


def utc_naive(when: Optional[datetime]) -> Optional[datetime]:
    """Run times are stored as naive UTC: an aware datetime is converted, a naive one taken as UTC."""
    return when.astimezone(timezone.utc).replace(tzinfo=None) if when is not None and when.tzinfo else when
