"""Opening a store file: creating it, the one-writer lock, snapshot copies for readers,
and recovering the runs a crashed process left behind."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

import duckdb

from ..errors import TracememError
from .journal import recover


class StoreLockedError(TracememError):
    """Another process holds the DuckDB file's write lock."""


@dataclass
class Opened:
    con: duckdb.DuckDBPyConnection
    path: str
    snapshot_of: Optional[str] = None
    note: str = ""


def connect(path: str, read_only: bool, block_size: int, snapshot_if_locked: bool) -> Opened:
    """Open (or create) the file; a locked file gives StoreLockedError, or a snapshot copy for a reader."""
    if path != ":memory:" and read_only and not os.path.exists(path):
        raise TracememError(f"no tracemem store at {path}; run a flow with Store('{path}') first, or pass --db PATH")
    try:
        if not read_only and path != ":memory:" and not os.path.exists(path):
            # the block size is fixed when the file is created; a connection opened with a config
            # would make every other Store on this file in this process "a different configuration"
            duckdb.connect(path, config={"default_block_size": str(block_size)}).close()
        return Opened(duckdb.connect(path, read_only=read_only), path)
    except duckdb.Error as err:
        text = str(err)
        same_process = "different configuration" in text
        if "lock" not in text.lower() and not same_process:
            raise TracememError(f"cannot open {path}: {text.splitlines()[0]}") from None
        pid = re.search(r"PID (\d+)", text)
        holder = f"this process ({os.getpid()})" if same_process else \
            f"process {pid.group(1)}" if pid else "another process"
        if same_process and not (snapshot_if_locked and read_only):
            raise StoreLockedError(
                f"{path} is already open for writing in this process; use that Store (store.sql(), "
                f"store.run()), or Store('{path}', read_only=True, snapshot_if_locked=True) to read a "
                f"snapshot copy") from None
        if not (snapshot_if_locked and read_only):  # a writer must never write into a throwaway copy
            raise StoreLockedError(
                f"{path} is open for writing by {holder}; DuckDB allows one writing process per file. "
                f"To read it now use Store('{path}', read_only=True, snapshot_if_locked=True) or the "
                f"`tracemem` CLI (both read a snapshot copy), query it from that process with store.sql(), "
                f"or stop {holder}.") from None
        return open_snapshot(path, holder)


def open_snapshot(path: str, holder: str) -> Opened:
    """Copy the file (and its WAL) aside and open the copy read-only: a consistent-enough read while locked."""
    folder = tempfile.mkdtemp(prefix="tracemem-snapshot-")
    copy = os.path.join(folder, os.path.basename(path))
    try:
        shutil.copyfile(path, copy)
        if os.path.exists(path + ".wal"):
            shutil.copyfile(path + ".wal", copy + ".wal")
        con = duckdb.connect(copy, read_only=True)
    except (OSError, duckdb.Error) as err:  # never leave the copy behind
        shutil.rmtree(folder, ignore_errors=True)
        raise TracememError(f"cannot open {path}: {str(err).splitlines()[0].replace(copy, path)}") from None
    note = f"{path} is locked by {holder}; reading a copy taken at {datetime.now():%H:%M:%S}"
    return Opened(con, copy, path, note)


def recover_dead_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Replay the journal of runs whose process is gone; mark those that never ended interrupted."""
    rows = con.execute("SELECT run_id, pid, host FROM runs WHERE status = 'running'").fetchall()
    here = socket.gethostname()
    dead = [r[0] for r in rows if not (r[2] == here and (r[1] == os.getpid() or _alive(r[1])))]
    # runs journaled whole (flush_interval=0) whose process ended before its writer moved them
    orphans = [run_id for run_id, payload in con.execute(
        "SELECT run_id, payload FROM step_journal WHERE kind = 'run' AND run_id NOT IN "
        "(SELECT run_id FROM runs)").fetchall()
        if not _owned_here(json.loads(payload)["run"], here)]
    unended = recover(con, dead + orphans)
    for run_id in unended:
        con.execute("UPDATE runs SET status = 'interrupted', error = 'process ended before the run did' "
                    "WHERE run_id = ?", [run_id])
    return dead


def _owned_here(row: list, host: str) -> bool:
    """Whether a journaled run row (batch.GIVEN["runs"] order) belongs to a live process here."""
    pid, row_host = row[11], row[12]
    return row_host == host and (pid == os.getpid() or _alive(pid))


def _alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
