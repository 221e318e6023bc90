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


def claim(con: Any, run_id: str) -> Optional[tuple[str, Optional[int], Optional[str]]]:
    """Claim a paused or interrupted run for this process: None when claimed, else (status, pid, host) of
    the run as it stands (status 'missing' when there is no such run)."""
    won = con.execute("UPDATE runs SET status = 'running', pid = ?, host = ? "
                      "WHERE run_id = ? AND status IN ('paused', 'interrupted') RETURNING run_id",
                      [os.getpid(), socket.gethostname(), run_id]).fetchall()
    if won:
        return None
    row = con.execute("SELECT status, pid, host FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return (row[0], row[1], row[2]) if row else ("missing", None, None)


def release(con: Any, run_id: str, status: str) -> None:
    """Give a claim back (the resume could not start): the run is `status` again."""
    con.execute("UPDATE runs SET status = ? WHERE run_id = ? AND status = 'running'", [status, run_id])
