"""Liveness without PIDs: each store opening holds a lease, and a lease that nobody holds is dead.

A PID names a process on one machine only (and a restarted container gets the same one
again), so a fleet cannot tell a dead writer by it. Instead every writing store opening
takes a random 64-bit lease id (recorded on its runs and journal rows) and holds a
PostgreSQL session advisory lock on it for as long as it is open. The server releases that
lock the moment the session ends: at once when the process dies (its socket closes), and
after the TCP keepalive time (`lease_seconds`) when a machine or its network vanishes.

Any store opening can therefore tell a dead lease by trying its lock. On opening, and then
every `lease_seconds / 2` from a background thread, each store looks for runs still `running`
(and journal rows) under leases other than its own, and for each lease whose lock it can
take, replays that lease's journal into the tables (finished stages are kept) and marks its
runs that never ended `interrupted`, in one transaction, holding the dead lease's lock so
two recoverers never replay the same rows.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ..write.recovery import replay
from .connection import PgConnection, first_line
from .copy import insert_batch

__all__ = ["lease_key", "hold", "reap", "recover_lease", "Reaper"]


def lease_key(lease: str) -> int:
    """A lease id (16 hex digits) as the signed bigint advisory-lock key PostgreSQL takes."""
    value = int(lease, 16) & (2**64 - 1)
    return value - 2**64 if value >= 2**63 else value


def hold(con: PgConnection, lease: str) -> None:
    """Take this opening's lease on `con` (held until the session ends)."""
    con.execute("SELECT pg_advisory_lock(?)", [lease_key(lease)])


def _candidates(con: PgConnection, mine: str) -> list[str]:
    rows = con.execute(
        "SELECT lease FROM runs WHERE status = 'running' AND lease IS NOT NULL AND lease <> ? "
        "UNION SELECT DISTINCT lease FROM step_journal WHERE lease IS NOT NULL AND lease <> ?", [mine, mine]).fetchall()
    return sorted(r[0] for r in rows)


def reap(con: PgConnection, mine: str, log: Callable[[str], None] = lambda m: None) -> list[str]:
    """Recover every dead lease's runs (see the module docstring); returns the runs found running under them."""
    found: list[str] = []
    for lease in _candidates(con, mine):
        key = lease_key(lease)
        with con.lock:
            if not con.execute("SELECT pg_try_advisory_lock(?)", [key]).fetchone()[0]:
                continue  # its opening is alive (or another store is recovering it right now)
            try:
                found += recover_lease(con, lease)
            except Exception as err:  # noqa: BLE001 - one lease must not stop the others; said in the log
                log(f"recovering runs of lease {lease} failed: {first_line(err)}; retried later")
            finally:
                con.execute("SELECT pg_advisory_unlock(?)", [key])
    return found


def recover_lease(con: PgConnection, lease: str) -> list[str]:
    """Replay a dead lease's journal and mark its unended runs interrupted, in one transaction."""
    with con.transaction():
        running = [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE status = 'running' AND lease = ?", [lease]).fetchall()]
        entries = con.execute("SELECT run_id, step, kind, payload FROM step_journal WHERE lease = ? "
                              "ORDER BY run_id, step", [lease]).fetchall()
        batch, ends = replay(entries)
        batch.finished = [(run_id, end) for run_id, end in ends.items() if end is not None]
        batch.journaled = [(run_id, None) for run_id in sorted({e[0] for e in entries})]
        insert_batch(con, batch)
        unended = [r for r in running if r not in ends]
        if unended:
            con.execute("UPDATE runs SET status = 'interrupted', error = coalesce(error, "
                        "'process ended before the run did (its store lease expired)') "
                        "WHERE run_id = ANY(?::text[]) AND status = 'running'", [unended])
    return running


class Reaper:
    """A daemon thread that runs `reap` every `interval` seconds until stopped."""

    def __init__(self, con: PgConnection, mine: str, interval: float, log: Callable[[str], None]) -> None:
        self.con, self.mine, self.interval, self.log = con, mine, interval, log
        self.found: list[str] = []
        self.rounds = 0  # looks taken so far (what a test waits on, rather than on time)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = threading.Thread(target=self._loop, name="tracemem-lease",
                                                                    daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.found += reap(self.con, self.mine, self.log)
            except Exception as err:  # noqa: BLE001 - the thread lives on; the next round retries
                self.log(f"looking for dead store leases failed: {first_line(err)}")
            self.rounds += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
