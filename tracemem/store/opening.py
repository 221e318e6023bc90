"""Opening a store file: creating it, the one-writer lock, snapshot copies for readers,
and recovering the runs a crashed process left behind.

Which error an open gives is decided by DuckDB's exception type and fixed wording
(store/diagnose.py), never by a word that a path may contain. Crash recovery tells a
dead run by its lease (the store opening that recorded it), not by its PID: a
restarted container gets the same PID every time, but never the same lease.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Optional, Sequence

import duckdb

from ..errors import StoreError, TracememError
from .diagnose import first_line, is_data_error, lock_conflict, open_error, same_process_conflict
from .local_paths import check_local, no_downloads
from .write.recovery import recover_rows
from .snapshot_dirs import clean_stale, make_snapshot_dir


NO_DOWNLOADS = {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}


class StoreLockedError(StoreError):
    """Another process (or another Store object of this process) holds the DuckDB file's write lock."""


@dataclass
class Opened:
    con: duckdb.DuckDBPyConnection
    path: str
    snapshot_of: Optional[str] = None
    note: str = ""


def connect(path: str, read_only: bool, block_size: int, snapshot_if_locked: bool) -> Opened:
    """Open (or create) the file; a locked file gives StoreLockedError, or a snapshot copy for a reader."""
    check_local(path, "the store")
    if path != ":memory:" and read_only and not os.path.exists(path):
        raise TracememError(f"no tracemem store at {path}; run a flow with Store('{path}') first, or pass --db PATH")
    try:
        if not read_only and path != ":memory:" and not os.path.exists(path):
            # the block size is fixed when the file is created; a connection opened with a config
            # would make every other Store on this file in this process "a different configuration"
            duckdb.connect(path, config={"default_block_size": str(block_size), **NO_DOWNLOADS}).close()
        con = duckdb.connect(path, read_only=read_only)
        no_downloads(con)
        return Opened(con, path)
    except duckdb.Error as err:
        same_process = same_process_conflict(err, path)
        holder = f"this process ({os.getpid()})" if same_process else lock_conflict(err, path)
        if holder is None:
            raise open_error(err, path) from None
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
    """Copy the file (and its WAL) aside and open the copy read-only: a consistent-enough read while locked.
    Copies that processes which died left behind go first (store/snapshot_dirs.py)."""
    clean_stale()
    folder = make_snapshot_dir()
    copy = os.path.join(folder, os.path.basename(path))
    try:
        shutil.copyfile(path, copy)
        if os.path.exists(path + ".wal"):
            shutil.copyfile(path + ".wal", copy + ".wal")
        con = duckdb.connect(copy, read_only=True)
        no_downloads(con)
    except (OSError, duckdb.Error) as err:  # never leave the copy behind
        shutil.rmtree(folder, ignore_errors=True)
        raise TracememError(f"cannot open {path}: {str(err).splitlines()[0].replace(copy, path)}") from None
    note = f"{path} is locked by {holder}; reading a copy taken at {datetime.now():%H:%M:%S}"
    return Opened(con, copy, path, note)


def recover_dead_runs(con: duckdb.DuckDBPyConnection, live: frozenset[str],
                      log: Callable[[str], None] = lambda message: None, unended: Sequence[str] = ()) -> list[str]:
    """Replay the `step_journal` rows of runs no live opening of the file owns (`live`: the leases of this
    process's open stores on it, older files' journal); mark those that never ended interrupted, and the
    `unended` runs the run journal held (store/write/recovery.py). Returns the runs found running.

    Holding the file's write lock means no other process writes it, so a run left `running` by any
    other opening (a crashed process, PID reused or not) can never finish into this file."""
    rows = con.execute("SELECT run_id, lease FROM runs WHERE status = 'running'").fetchall()
    dead = [run_id for run_id, lease in rows if lease not in live]
    orphans = [run_id for (run_id,) in con.execute(  # journaled whole (flush_interval=0), never moved
        "SELECT DISTINCT run_id FROM step_journal WHERE kind = 'run' AND run_id NOT IN (SELECT run_id FROM runs)"
    ).fetchall()]
    todo = dead + [r for r in orphans if r not in dead]
    found, unended = list(dict.fromkeys([*dead, *unended])), list(unended)
    try:
        unended += recover_rows(con, todo)
    except Exception as err:  # noqa: BLE001 - one run's journal must not keep the file from opening
        if not is_data_error(err):
            raise
        for run_id in todo:
            try:
                unended += recover_rows(con, [run_id])
            except Exception as one:  # noqa: BLE001 - left in the journal, said in the log
                if not is_data_error(one):
                    raise
                log(f"run {run_id}: its step_journal rows could not be recovered ({first_line(one)}); "
                    f"they are kept in step_journal")
    for run_id in unended:
        con.execute("UPDATE runs SET status = 'interrupted', error = coalesce(error, "
                    "'process ended before the run did') WHERE run_id = ?", [run_id])
    return found
