"""The PostgreSQL backend: one database schema that any number of processes, on any number of
machines, write at once (see store/backend.py for the seam it fills).

Connections: the store's own (reads, memory, user SQL; it also holds this opening's lease),
the writer's and the journal's (pg/writes.py), and, made when first asked for, the user's
(`store.con`), so a transaction a user leaves open never holds tracemem's up. There is no
lock file and no PID: runs are recorded with the opening's lease, and whoever finds a lease
dead recovers its runs (pg/lease.py).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import TracememError
from ..tables import ALL_TABLES, VIEWS
from ..read.user_sql import DEFAULT_TIMEOUT, QueryTimeout, ReadOnlySQLError
from .connection import (PgConnection, PgCursor, bind, first_line, parse_target, quote_ident, translate)
from .copy import copy_arrow
from .lease import Reaper, hold, reap
from .memory_sql import PgMemorySQL
from .reader import ReaderRefused, check_session, run_read_only
from .result import ARROW_TYPES, SQLResult
from .schema import embedding_type, open_pg_schema, set_pg_meta
from .writes import PgWrites

__all__ = ["PgBackend"]


class PgBackend:
    """A PostgreSQL database (schema) under a Store."""

    kind = "postgres"
    shared = True
    snapshot_of: Optional[str] = None
    snapshot_note = ""

    def __init__(self, url: str, *, read_only: bool, lock: threading.RLock, lease: str,
                 log: Callable[[str], None], lease_seconds: float) -> None:
        self.target = parse_target(url)
        self.path = self.label = self.target.label
        self.read_only = read_only
        self.lease = lease
        self.con = PgConnection(self.target, "store", keepalive=lease_seconds)
        self.writes: Optional[PgWrites] = None  # the writer's connection and the journal's (pg/writes.py)
        self._user: Optional[PgConnection] = None
        self._user_lock = threading.Lock()
        self.reaper: Optional[Reaper] = None
        self._types: dict[int, str] = {}
        self._reader: Optional[str] = None  # the role read-only SQL runs as, once checked
        try:
            with lock:
                open_pg_schema(self.con, self.label, read_only, log)
                self.con.register_vector()  # the schema may have just installed pgvector
                if not read_only:
                    set_pg_meta(self.con, "secret_salt", os.urandom(16).hex(), keep=True)
                salt = self.con.execute("SELECT value FROM tracemem_meta WHERE key = 'secret_salt'").fetchone()
                self.salt: Optional[str] = salt[0] if salt else None  # hex
                self.memory_sql = PgMemorySQL(embedding_type(self.con))
            self.interrupted: list[str] = []
            if not read_only:
                hold(self.con, lease)  # this opening's lease: released by the server when the session ends
                self.writes = PgWrites(self.target, lease)
                self.interrupted = reap(self.writes.con, lease, log)
                self.reaper = Reaper(self.writes.con, lease, lease_seconds / 2, log)
        except BaseException:
            self.close()
            raise
        self.write_lock = self.writes.con.lock if self.writes is not None else self.con.lock

    def cursor(self) -> PgCursor:
        return self.con.cursor()

    def connection(self) -> PgCursor:
        """What one part of the store (the memory, the snapshot index) runs its SQL on: the store's own
        connection, whose lock serializes its statements and transactions."""
        return self.con.cursor()

    def user_connection(self) -> PgConnection:
        """A connection for the user's own SQL (`store.con`), made on first use: tracemem never uses it."""
        with self._user_lock:
            if self._user is None:
                self._user = PgConnection(self.target, "user")
            return self._user

    def _writer(self) -> PgConnection:
        if self.writes is None:
            raise TracememError(f"{self.label} is open read-only; open Store('{self.label}') to record runs")
        return self.writes.con

    def follow_snapshots(self) -> Callable[[str, str, int], tuple[int, list[tuple]]]:
        def follow(pipeline: str, embedder_id: str, after: int) -> tuple[int, list[tuple]]:
            rows = self.con.execute("SELECT seq, run_id, query, embedding FROM run_embeddings WHERE pipeline = ? "
                                    "AND embedder_id = ? AND seq > ? ORDER BY seq",
                                    [pipeline, embedder_id, after]).fetchall()
            return (rows[-1][0] if rows else after), [tuple(r[1:]) for r in rows]
        return follow

    # -- reading ------------------------------------------------------------------------------
    def sql(self, query: str, params: Any = None, timeout: Optional[float] = None) -> Optional[SQLResult]:
        """User SQL: on a read-only store, as the store's reader role in a READ ONLY transaction with a time
        limit (store/pg/reader.py)."""
        text = query if params is None else translate(query)
        args = None if params is None else bind(query, params)
        con = self.con
        try:
            if self.read_only:
                cur, rows = run_read_only(con, self._reader_role(), text, args, timeout or DEFAULT_TIMEOUT)
            else:
                with con.lock:
                    cur = con.raw.execute(text, args)
                    rows = cur.fetchall() if cur.description is not None else []
        except psycopg.errors.ReadOnlySqlTransaction:
            raise ReadOnlySQLError("the store cannot be changed (a read-only transaction)", self.label) from None
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(timeout or DEFAULT_TIMEOUT) from None
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ActiveSqlTransaction) as err:
            if self.read_only:
                raise ReadOnlySQLError(f"refused by the server ({first_line(err)})", self.label) from None
            raise TracememError(f"SQL error: {first_line(err)}") from None
        except psycopg.Error as err:
            if "multiple commands" in str(err):
                raise ReadOnlySQLError("one statement at a time", self.label) from None
            raise TracememError(f"SQL error: {first_line(err)}") from None
        if cur.description is None:
            return None
        return SQLResult([d.name for d in cur.description], self._type_names([d.type_code for d in cur.description]),
                         [tuple(r) for r in rows])

    def _reader_role(self) -> str:
        """The role read-only SQL runs as, once this session is found fit for it (store/pg/reader.py)."""
        if self._reader is None:
            try:
                self._reader = check_session(self.con)
            except ReaderRefused as err:
                raise ReadOnlySQLError(str(err), self.label) from None
        return self._reader

    def _type_names(self, oids: list[int]) -> list[str]:
        missing = [o for o in oids if o not in self._types]
        if missing:
            self._types.update(dict(self.con.execute("SELECT oid::int, typname FROM pg_type WHERE oid = ANY(?)",
                                                     [missing]).fetchall()))
        return [self._types.get(o, "unknown") for o in oids]

    def tables(self) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT table_name FROM information_schema.tables "
                                               "WHERE table_schema = current_schema()").fetchall()}

    def read(self, query: str, params: Any = None) -> Iterator[pa.RecordBatch]:
        """The rows of `query` as Arrow record batches, streamed through a server-side cursor."""
        con = self.con
        with con.transaction():
            with con.raw.cursor(name="tracemem_read") as cur:
                cur.execute(translate(query) if params is not None else query,
                            bind(query, params) if params is not None else None)
                names = [d.name for d in cur.description or ()]
                kinds = [ARROW_TYPES.get(t) for t in self._type_names([d.type_code for d in cur.description or ()])]
                while True:
                    rows = cur.fetchmany(20000)
                    if not rows:
                        break
                    cols = list(zip(*rows))
                    yield pa.RecordBatch.from_arrays([pa.array(c, type=k) for c, k in zip(cols, kinds)], names=names)

    def append(self, table: str, data: pa.Table) -> dict[str, list[str]]:
        """COPY an Arrow table's rows into `table` (columns by name); what had to be escaped, by run (see
        pg/copy.py `copy_arrow`)."""
        vectors = ("embedding",) if table == "memories" and self.memory_sql.kind == "vector" else ()
        return copy_arrow(self._writer(), table, data, vectors)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around `append` calls."""
        with self._writer().transaction():
            yield

    def export(self, directory: str, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]:
        """Every table (and the derived views) as `directory/<name>.parquet`; rows per name."""
        os.makedirs(directory, exist_ok=True)
        counts: dict[str, int] = {}
        everything = ALL_TABLES + VIEWS
        for i, table in enumerate(everything):
            writer = None
            counts[table] = 0
            for batch in self.read(f"SELECT * FROM {quote_ident(table)}"):
                if writer is None:
                    writer = pq.ParquetWriter(os.path.join(directory, f"{table}.parquet"), batch.schema)
                writer.write_batch(batch)
                counts[table] += batch.num_rows
            if writer is None:  # no rows: an empty file with the columns
                cols = self.con.execute(
                    "SELECT column_name, udt_name FROM information_schema.columns WHERE table_schema = "
                    "current_schema() AND table_name = ? ORDER BY ordinal_position", [table]).fetchall()
                pq.write_table(pa.table({c: pa.array([], ARROW_TYPES.get(t, pa.string())) for c, t in cols}),
                               os.path.join(directory, f"{table}.parquet"))
            else:
                writer.close()
            if progress:
                progress(i + 1, len(everything))
        return counts

    def close(self) -> None:
        if self.reaper is not None:
            self.reaper.stop()
        for part in (self.writes, self._user, self.con):
            if part is not None:
                try:
                    part.close()
                except psycopg.Error:
                    pass
