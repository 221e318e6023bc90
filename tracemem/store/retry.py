"""Patience: a write that failed for a moment is made again, whole, rather than given up.

Why: a write can fail for reasons that pass on their own within milliseconds: the connection
was busy, another transaction changed the same rows, a lock was held, a system call was
interrupted, a PostgreSQL session was dropped or the server restarted. Taking such a failure
for bad data (and writing the run without its steps, or as its runs row alone) loses records
for good; taking it for a broken file stops the store accepting runs. So the writer retries
it, with a wait that doubles from `FIRST_WAIT` to `LONGEST_WAIT`, on a connection made sound
again (`reset`), for up to `PATIENCE` seconds; the runs stay queued (and journaled) meanwhile.
A failure that lasts longer is `StillFailing`, which the writer treats as the file's: the store
stops accepting runs, loudly, and keeps retrying the queued ones.

Which failures are momentary is the backend's call (store/diagnose.py for DuckDB,
store/pg/connection.py for PostgreSQL).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

from ..errors import StoreError

__all__ = ["PATIENCE", "FIRST_WAIT", "LONGEST_WAIT", "StillFailing", "patiently"]

PATIENCE = 5.0  # seconds of momentary failures before they count as the file's
FIRST_WAIT = 0.005  # seconds before the first retry; doubled after each
LONGEST_WAIT = 0.5

T = TypeVar("T")


class StillFailing(StoreError):
    """A momentary failure that went on for longer than `PATIENCE`: from now on the file's failure."""


def patiently(write: Callable[[int], T], transient: Callable[[BaseException], Optional[str]],
              reset: Callable[[], None], patience: float = PATIENCE) -> T:
    """`write(attempt)` (attempt 0, then 1, 2, ...), again after each momentary failure (see the module
    docstring) once `reset()` has made the connection sound; any other error is raised as it is. `write` is
    told the attempt so that it can leave out what an attempt that failed after its commit wrote."""
    attempt, waited, wait = 0, 0.0, FIRST_WAIT
    while True:
        try:
            return write(attempt)
        except Exception as err:
            why = transient(err)
            if why is None:
                raise
            if waited >= patience:
                raise StillFailing(f"{why} (still failing after {attempt + 1} tries in {waited:.1f} s)") from err
        try:
            reset()
        except Exception:  # noqa: BLE001 - a server still away: the next attempt fails again and says why
            pass
        time.sleep(wait)
        waited += wait
        wait = min(wait * 2, LONGEST_WAIT)
        attempt += 1
