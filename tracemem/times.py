"""Timestamps as tracemem stores them: naive UTC.

DuckDB `TIMESTAMP` columns carry no zone, so every time that reaches a query or a
row is converted here first: an aware datetime to UTC, a naive one taken as UTC.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

__all__ = ["utc_naive", "utc_now"]


def utc_naive(when: Optional[datetime]) -> Optional[datetime]:
    """`when` as naive UTC (None stays None)."""
    return when.astimezone(timezone.utc).replace(tzinfo=None) if when is not None and when.tzinfo else when


def utc_now() -> datetime:
    """The current time as naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)
