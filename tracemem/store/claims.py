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


def claim(con: Any, run_id: str, steps: int) -> tuple[bool, str, Optional[int], Optional[str]]:
    """Claim a paused or interrupted run holding `steps` recorded steps (the record the caller loaded) for
    this process: (won, its status before, pid, host). The status is 'missing' when there is no such run,
    'changed' when it holds other steps by now (someone resumed it meanwhile). The caller holds the store's
    lock, and the file has one writing process, so nothing runs between the look and the UPDATE."""
    row = con.execute("SELECT status, pid, host, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) "
                      "FROM runs r WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return False, "missing", None, None
    status, pid, host, count = row
    if status not in ("paused", "interrupted"):
        return False, status, pid, host
    if count != steps:
        return False, "changed", pid, host
    won = con.execute("UPDATE runs SET status = 'running', pid = ?, host = ? "
                      "WHERE run_id = ? AND status IN ('paused', 'interrupted') RETURNING run_id",
                      [os.getpid(), socket.gethostname(), run_id]).fetchall()
    return bool(won), status, pid, host


def release(con: Any, run_id: str, status: str) -> None:
    """Give a claim back (the resume could not start): the run is `status` again."""
    con.execute("UPDATE runs SET status = ? WHERE run_id = ? AND status = 'running'", [status, run_id])
