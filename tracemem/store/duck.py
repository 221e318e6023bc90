"""The DuckDB backend: one file (or `:memory:`), one writing process, the embedded default.

This is the store as it always was, behind the backend seam (store/backend.py): opening
takes the file's write lock or reads a snapshot copy (store/opening.py), the schema is
created or migrated (store/tables.py), what the run journal holds is put into the tables
(store/write/recovery.py), batches go in as Arrow tables (store/write/rows.py), and
read-only user SQL runs fenced in its own DuckDB instance (store/read/user_sql.py).

Connections: a DuckDB connection runs one call at a time and refuses a second one made
meanwhile ("connection is busy") rather than waiting, so nothing is shared across owners.
The store's own (`con`: tracemem's reads, under the store's lock), the writer's
(`writes.con`: batches, nobody else's), one for the memory and one for the
snapshot index (`connection()`), and one per user thread (`user_connection()`, what
`store.con` is): each a `cursor()` of the same database, so each sees what the others commit.
"""
from __future__ import annotations

import os
import shutil
import threading
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Optional

import duckdb
import pyarrow as pa

from ..dbmeta import get_meta, set_meta
from ..errors import TracememError
from ..ids import new_id
from ..memory import sql as memory_sql
from .diagnose import open_error, transient_failure
from .opening import connect, recover_dead_runs
from .audit.retention import export
from .tables import open_schema
from .read.user_sql import UserSQL
from .write.journal import FileJournal
from .write.recovery import recover_file
from .write.rows import Batch

__all__ = ["DuckBackend"]

CHECKPOINT_THRESHOLD = "64MiB"
"""How much WAL a writable file gathers before DuckDB checkpoints (its default: 16 MiB, every ~6,000 runs
of ten stages). Each checkpoint also rewrites the row groups the last one left part-filled, so fewer, larger
checkpoints cost less per run: 2.3 µs of CPU per stage at 16 MiB, 1.4 at 64 MiB (folding 6,000 runs, then
24,000, checkpointing after each). The WAL, and so a crash recovery's replay, stays bounded by it."""


class DuckBackend:
    """A DuckDB file under a Store (see store/backend.py for what each member stands for)."""

    kind = "duckdb"
    shared = False
    memory_sql = memory_sql

    def __init__(self, path: str, *, read_only: bool, lock: threading.RLock, lease: str, block_size: int,
                 snapshot_if_locked: bool, log: Callable[[str], None], fsync: bool = False) -> None:
        self.label = path
        self.read_only = read_only
        self.write_lock = lock  # one connection: writes share the store's lock
        self.snapshot_of: Optional[str] = None
        self.snapshot_note = ""
        opened = connect(path, read_only, block_size, snapshot_if_locked)
        self.con = opened.con
        self.path = opened.path
        self._snapshot_dir: Optional[str] = None
        if opened.snapshot_of:
            self.snapshot_of, self.snapshot_note = opened.snapshot_of, opened.note
            self._snapshot_dir = os.path.dirname(opened.path)
            # removed by close(); if setup fails or close() is never called, when this goes (or at exit)
            weakref.finalize(self, shutil.rmtree, self._snapshot_dir, ignore_errors=True)
        self._local = threading.local()
        self._made: list[duckdb.DuckDBPyConnection] = []  # connections handed out (`connection`), closed with the file
        self._users: dict[int, duckdb.DuckDBPyConnection] = {}  # thread id -> its user connection (store.con)
        self._users_lock = threading.Lock()
        self.writes: Optional[DuckWrites] = None  # the writer's connection and the run journal (a writable file)
        journal: Optional[FileJournal] = None
        try:
            with lock:
                open_schema(self.con, self.path, read_only or self.snapshot_of is not None, log)
                salt = get_meta(self.con, "secret_salt")
                if salt is None and not read_only:
                    salt = os.urandom(16).hex()
                    set_meta(self.con, "secret_salt", salt)
                self.salt: Optional[str] = salt  # hex (the Store derives its key from it)
                unended: list[str] = []
                if not read_only and path != ":memory:":  # what the journal holds first: runs left running
                    unended = recover_file(self.con, self.path + ".journal", log)
                    ident = get_meta(self.con, "journal_id") or new_id()
                    set_meta(self.con, "journal_id", ident)
                    journal = FileJournal(self.path + ".journal", fsync, ident)
                    self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
                # runs left 'running' by an opening that is gone (a crashed process, whatever its PID): those that
                # never ended are marked interrupted
                self.interrupted = [] if read_only else recover_dead_runs(self.con, frozenset({lease}), log, unended)
                if not read_only:
                    self.writes = DuckWrites(self.con, journal)
        except BaseException as err:
            if self.writes is None and journal is not None:
                journal.close()
            self._close_files()
            if isinstance(err, duckdb.Error):  # a corrupt file, a failing disk: say so, never a raw DuckDB error
                raise open_error(err, opened.snapshot_of or self.path) from None
            raise
        # user SQL on a read-only store runs fenced (store/read/user_sql.py): no files, ATTACH, SET or changes
        self.user_sql = UserSQL(self.path, self.snapshot_of or self.path) if read_only else None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor on the file, for tracemem's own reads."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self.con.cursor()
            self._made.append(cur)
        return cur

    def interrupt(self) -> None:
        """Cancel what tracemem's own reads run on the file now, from any thread (a caller's time limit; the
        query raises duckdb.InterruptException). User SQL keeps its own limit (store/read/user_sql.py)."""
        for con in [self.con, *self._made]:
            try:
                con.interrupt()
            except duckdb.Error:  # closed meanwhile: nothing runs on it
                pass

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for one part of the store (the memory, the snapshot index), closed with it."""
        con = self.con.cursor()
        self._made.append(con)
        return con

    def user_connection(self) -> duckdb.DuckDBPyConnection:
        """The calling thread's connection for the user's own SQL (`store.con`): tracemem never uses it, so
        nothing done on it can make the writer, or another thread's call, fail. Those of ended threads are
        closed as new ones are made."""
        me = threading.get_ident()
        with self._users_lock:
            con = self._users.get(me)
            if con is None:
                alive = {t.ident for t in threading.enumerate()}
                for ident in [i for i in self._users if i not in alive]:
                    self._users.pop(ident).close()
                con = self._users[me] = self.con.cursor()
            return con

    def follow_snapshots(self) -> None:
        return None  # this process is the file's only writer: the index learns of new rows as it writes them

    # -- reading -----------------------------------------------------------------------------
    def sql(self, query: str, params: Any = None, timeout: Optional[float] = None
            ) -> Optional[duckdb.DuckDBPyRelation]:
        if self.user_sql is not None:
            return self.user_sql.sql(query, params, timeout)
        try:
            with self.write_lock:  # a write statement runs here: never inside the claim's unsynced commit (claims.py)
                return self.cursor().sql(query, params=params)
        except duckdb.Error as err:
            raise TracememError(f"SQL error: {str(err).splitlines()[0]}") from None

    def tables(self) -> set[str]:
        return {r[0] for r in self.cursor().execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}

    def read(self, query: str, params: Any = None) -> Iterator[pa.RecordBatch]:
        """The rows of `query` as Arrow record batches (for copying between stores)."""
        reader = self.cursor().sql(query, params=params or None).to_arrow_reader(65536)
        yield from reader

    def append(self, table: str, data: pa.Table) -> dict[str, list[str]]:
        """Insert an Arrow table's rows into `table` (columns by name), inside `transaction()` if open; nothing
        needs escaping (DuckDB holds any text another store holds): no notes."""
        self.con.register("_tracemem_append", data)
        try:
            cols = ", ".join(f'"{c}"' for c in data.column_names)
            self.con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _tracemem_append")
        finally:
            self.con.unregister("_tracemem_append")
        return {}

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around `append` calls."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def export(self, directory: str, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]:
        return export(self.con, directory, progress=progress)

    def _close_files(self) -> None:
        for con in self._made + list(self._users.values()):
            con.close()
        if self.writes is not None:
            self.writes.close()
        self.con.close()

    def close(self) -> None:
        self._close_files()
        if self.user_sql is not None:
            self.user_sql.close()
        if self._snapshot_dir is not None:
            shutil.rmtree(self._snapshot_dir, ignore_errors=True)


class DuckWrites:
    """The writer's side of a DuckDB file: a connection of its own (a cursor of the file's), and the run journal
    beside the file (None on `:memory:`)."""

    journal_rows = False

    def __init__(self, file_con: duckdb.DuckDBPyConnection, journal: Optional[FileJournal]) -> None:
        self.file_con, self.journal = file_con, journal
        self.con = file_con.cursor()
        self.insert = partial(Batch.insert, con=self.con)  # a batch, on this connection (store/write/rows.py)

    def meta(self, key: str) -> Optional[str]:
        """A `tracemem_meta` value as the writer's connection sees it (what its last batch committed)."""
        return get_meta(self.con, key)

    def transient(self, err: BaseException) -> Optional[str]:
        return transient_failure(err)

    def reset(self) -> None:
        """After a failed write: the connection holds no transaction (a new connection if it cannot say so)."""
        try:
            self.con.execute("ROLLBACK")
            return
        except duckdb.TransactionException as err:
            if "no transaction is active" in str(err):
                return
        except duckdb.Error:
            pass
        self.con.close()  # (rolls back whatever it had open)
        self.con = self.file_con.cursor()
        self.insert = partial(Batch.insert, con=self.con)

    def close(self) -> None:
        self.con.close()
        if self.journal is not None:
            self.journal.close()
