"""Claiming a run to resume it: one atomic UPDATE, so two resumers can never both carry on one run.

A paused or interrupted run is claimed by setting it `running` with this process's
pid and host, in the same statement that checks it is still paused or interrupted;
the loser gets the row as it stands (who holds it). A claim whose process dies is
like any run whose process died: reopening the file marks it `interrupted`
(`opening.recover_dead_runs`), and it can be resumed again.

On a DuckDB file the claim's commit is not fsync'd unless the store was opened with
`fsync=True`: it survives the process dying (which is all the claim must: only one
process writes a DuckDB file at a time), and the first commit of the resumed run's
record syncs it along with everything before it in the log. A power loss before that
leaves the run as it was before the claim — paused or interrupted, resumable — which
is what the store's default durability (process-crash safe) promises. The fsync cost
the claim 2-13 ms on a shared disk: most of a resume's time (bench/resume.py).
"""
from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["claim", "release"]


def claim(con: Any, run_id: str, steps: int, lease: Optional[str] = None, *,
          sync: bool = True) -> tuple[bool, str, Optional[int], Optional[str]]:
    """Claim a paused or interrupted run holding `steps` recorded steps (the record the caller loaded) for
    this process: (True, 'running', None, None) when won, else (False, status, pid, host) of the run as
    it stands — status 'missing' when there is no such run, 'changed' when it holds other steps by now
    (someone resumed it meanwhile). `lease`: the store opening taking it, where runs carry one
    (PostgreSQL: a run running under a dead opening's lease is recovered by others, store/pg/lease.py).
    `sync=False` (DuckDB only; the caller holds the store's write lock): the commit is not fsync'd, see the
    module doc."""
    leased = ", lease = ?" if lease is not None else ""
    with _unsynced(con, not sync):
        won = con.execute(f"UPDATE runs SET status = 'running', pid = ?, host = ?{leased} "
                          "WHERE run_id = ? AND status IN ('paused', 'interrupted') "
                          "AND (SELECT count(*) FROM steps s WHERE s.run_id = ?) = ? RETURNING pid",
                          [os.getpid(), socket.gethostname(), *([lease] if lease is not None else []), run_id,
                           run_id, steps]).fetchall()
    if won:
        return True, "running", None, None
    row = con.execute("SELECT status, pid, host, (SELECT count(*) FROM steps s WHERE s.run_id = ?) "
                      "FROM runs WHERE run_id = ?", [run_id, run_id]).fetchone()
    if row is None:
        return False, "missing", None, None
    status, pid, host, count = row
    if status in ("paused", "interrupted") and count != steps:
        return False, "changed", pid, host
    return False, status, pid, host


def release(con: Any, run_id: str, status: str) -> None:
    """Give a claim back (the resume could not start): the run is `status` again."""
    con.execute("UPDATE runs SET status = ? WHERE run_id = ? AND status = 'running'", [status, run_id])


@contextmanager
def _unsynced(con: Any, skip: bool) -> Iterator[None]:
    """DuckDB commits inside are not fsync'd (`fsync_mode` is the database's: the caller holds its write
    lock, which the writer and a writable store's `sql()` take too, so no other commit of this store falls
    inside but a flush's beside a batch in flight, on a store without `fsync=True`, whose commits need no
    sync: see Writer._write_beside); the setting is restored after."""
    if not skip:
        yield
        return
    (mode,) = con.execute("SELECT current_setting('fsync_mode')").fetchall()[0]
    con.execute("SET fsync_mode = 'NONE'")
    try:
        yield
    finally:
        con.execute(f"SET fsync_mode = '{mode}'" if str(mode).isalpha() else "RESET fsync_mode")
