"""Claiming a run to resume it: one atomic UPDATE, so two resumers can never both carry on one run.

A paused or interrupted run is claimed by setting it `running` with this process's
pid and host, in the same statement that checks it is still paused or interrupted;
the loser gets the row as it stands (who holds it). A claim whose process dies is
like any run whose process died: reopening the file marks it `interrupted`
(`opening.recover_dead_runs`), and it can be resumed again.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Optional

__all__ = ["claim", "release"]


def claim(con: Any, run_id: str, steps: int, lease: Optional[str] = None) -> tuple[bool, str, Optional[int],
                                                                                  Optional[str]]:
    """Claim a paused or interrupted run holding `steps` recorded steps (the record the caller loaded) for
    this process: (True, 'running', None, None) when won, else (False, status, pid, host) of the run as
    it stands — status 'missing' when there is no such run, 'changed' when it holds other steps by now
    (someone resumed it meanwhile). `lease`: the store opening taking it, where runs carry one
    (PostgreSQL: a run running under a dead opening's lease is recovered by others, store/pg/lease.py)."""
    leased = ", lease = ?" if lease is not None else ""
    won = con.execute(f"UPDATE runs SET status = 'running', pid = ?, host = ?{leased} "
                      "WHERE run_id = ? AND status IN ('paused', 'interrupted') "
                      "AND (SELECT count(*) FROM steps s WHERE s.run_id = ?) = ? RETURNING pid",
                      [os.getpid(), socket.gethostname(), *([lease] if lease is not None else []), run_id, run_id,
                       steps]).fetchall()
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
