"""Every query a viewer page runs stops at a time limit, cancelled by the database itself.

Why: a page is a few indexed lookups, but a crafted URL (a backtrack asked to walk 20,000 nodes)
or a store far bigger than expected can make one run for minutes, and the client giving up does not
stop the server. So each request's store gets a deadline:

- DuckDB has no statement timeout: a timer calls `interrupt()` on the connections tracemem reads
  with when the time is up (`DuckBackend.interrupt`); the query raises `InterruptException`;
- PostgreSQL: the request's own connection gets a `statement_timeout`, so the server cancels it.

SQL typed in the console has its own limit, set where it runs (store/read/user_sql.py, store/pg/reader.py).
A page that ran out says so on the error page (`TimedOut`), never as a bare 500.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import TracememError

__all__ = ["TimedOut", "interrupt", "time_limit"]


class TimedOut(TracememError):
    """A page's query ran past the viewer's time limit and was cancelled."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"this page took longer than {seconds:g} s and was stopped; narrow it (fewer steps, a "
                         f"smaller walk, a filter) or start the viewer with a longer --timeout")


@contextmanager
def time_limit(store: Any, seconds: float) -> Iterator[None]:
    """Queries on `store` (tracemem's own reads) are cancelled once `seconds` have passed."""
    backend = store.backend
    if backend.kind == "postgres":
        backend.con.execute(f"SET statement_timeout = {max(1, int(seconds * 1000))}")  # the request's own session
        yield
        return
    timer = threading.Timer(seconds, backend.interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def interrupt(store: Any) -> None:
    """Cancel every query running on `store` now, its user SQL included (the viewer is stopping)."""
    backend = store.backend
    if backend.kind == "postgres":
        backend.con.raw.cancel()  # (psycopg: safe from another thread)
        return
    backend.interrupt()
    if backend.user_sql is not None:
        backend.user_sql.interrupt()
