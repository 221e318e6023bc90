"""The writer's side of a PostgreSQL store: a connection of its own for batches, and the journal's.

The journal (store/write/journal.py on a file) is `step_journal` rows here: each finished run, or
stage, committed with this opening's lease on a connection of its own before the call that made it
returns, so a batch being copied in never waits behind a journal row, and the other way round. A
batch deletes the journal rows of what it writes (store/write/rows.py); whoever finds a lease dead
recovers its runs from them (pg/lease.py).
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from ..write.rows import Batch
from .connection import PgConnection, PgError, PgTarget, transient_failure
from .copy import insert_batch

__all__ = ["PgWrites", "PgJournal"]


class PgJournal:
    """The journal of a PostgreSQL store (store/write/journal.py): each entry a `step_journal` row with this
    opening's lease, committed on a connection of its own before the call that made it returns."""

    fsync = False  # (as durable as the server's commits)

    def __init__(self, con: PgConnection, lease: str) -> None:
        self.con, self.lease = con, lease
        self.lock = threading.RLock()

    def append(self, entry: tuple[str, int, str, str], sync: bool) -> None:
        """One row, committed; again, in a new session, after a momentary failure (a dropped session, a lock)."""
        run_id, step, kind, payload = entry
        for wait in (0.01, 0.05, 0.2, 0.5, 1.0, None):
            try:
                if self.con.broken:
                    self.con.reopen()
                self.con.execute("INSERT INTO step_journal (run_id, step, kind, payload, lease) VALUES (?, ?, ?, ?, ?)",
                                 [run_id, step, kind, payload, self.lease])
                return
            except Exception as err:
                if wait is None or transient_failure(err) is None:
                    raise
                time.sleep(wait)

    def sync(self) -> None:
        return None

    def close(self) -> None:
        self.con.close()


class PgWrites:
    """The writer's connection (batches, recovering dead leases) and the journal (see the module docstring)."""

    journal_rows = True  # durable progress is step_journal rows: any worker can recover a dead one's runs

    def __init__(self, target: PgTarget, lease: str) -> None:
        self.con = PgConnection(target, "writer")
        self.con.register_vector()
        self.journal = PgJournal(PgConnection(target, "journal"), lease)

    def insert(self, batch: Batch) -> None:
        insert_batch(self.con, batch)

    def meta(self, key: str) -> Optional[str]:
        """A `tracemem_meta` value as the writer's connection sees it (what its last batch committed)."""
        row = self.con.execute("SELECT value FROM tracemem_meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    def transient(self, err: BaseException) -> Optional[str]:
        return transient_failure(err)

    def reset(self) -> None:
        """After a failed write: a new session if the server or network dropped the writer's, else none of its
        transaction left open."""
        if self.con.broken:
            self.con.reopen()
        elif self.con.in_transaction:
            try:
                self.con.execute("ROLLBACK")
            except PgError:
                self.con.reopen()

    def close(self) -> None:
        self.journal.close()
        self.con.close()
