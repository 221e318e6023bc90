"""The backend seam: what differs between a DuckDB file and a PostgreSQL database, and nothing else.

`Store` is one facade over both. Everything that reads or writes through tracemem's own SQL
(loading runs and threads, feedback, affected, blame, retention, the memory's queries) runs
unchanged on either: the PostgreSQL connection takes the same `?`-parameter SQL and has the
few DuckDB function names it uses (store/pg/connection.py, store/pg/schema.py). What cannot
be shared lives behind this interface, with one implementation per database:

| concern                          | DuckDB (store/duck.py)              | PostgreSQL (store/pg/)              |
|----------------------------------|-------------------------------------|-------------------------------------|
| opening, schema and migrations   | a file, its write lock, snapshots   | a database schema, an advisory lock |
| connections                      | cursors of one database, one each   | the store's, the writer's, the user's |
| a momentary failure (retried)    | busy, conflict, interrupted I/O     | lost session, serialization, locks  |
| liveness of a writer             | one writer per file; PIDs           | a lease per opening (pg/lease.py)   |
| a batch of runs                  | Arrow tables, INSERT … SELECT       | COPY, one transaction               |
| the journal (store/write/journal.py) | <file>.journal, appended          | step_journal rows, each committed   |
| user SQL (`store.sql`)           | a DuckDB relation; fenced instance  | a materialized result; READ ONLY tx |
| the memory's bulk SQL            | memory/sql.py (Arrow)               | pg/memory_sql.py (COPY, shared)     |
| export / copy                    | COPY TO parquet; Arrow              | rows through Arrow                  |

`open_backend(path, ...)` picks one by the path: `postgresql://…` (or `postgres://…`) is a
PostgreSQL database, anything else a DuckDB file (`:memory:` included).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol

import pyarrow as pa

from .write.rows import Batch

__all__ = ["Backend", "Writes", "open_backend", "is_postgres_url"]


def is_postgres_url(path: str) -> bool:
    """Whether a store path names a PostgreSQL database (postgresql://… or postgres://…)."""
    return str(path).startswith(("postgresql://", "postgres://"))


class Backend(Protocol):
    """One open database under a Store (see the module docstring for what each method stands for)."""

    kind: str  # "duckdb" or "postgres"
    path: str  # what messages name: the file (or snapshot copy), or the URL without its password
    label: str  # the path the user gave (the file, not its snapshot copy)
    con: Any  # the connection tracemem's own SQL runs on (`?` parameters, DuckDB function names)
    writes: Optional["Writes"]  # the writer's side; None on a read-only store
    write_lock: Any  # held around `append` (copying between stores)
    salt: Optional[str]  # the store's secret salt (tracemem_meta), hex
    interrupted: list[str]  # runs found running under a dead writer when opened
    snapshot_of: Optional[str]
    snapshot_note: str
    memory_sql: Any  # what Memory runs its bulk SQL with (memory/sql.py or pg/memory_sql.py)
    shared: bool  # other processes write the same store at the same time

    def cursor(self) -> Any: ...

    def connection(self) -> Any: ...  # for one part of the store (the memory, the snapshot index)

    def user_connection(self) -> Any: ...  # `store.con`: the user's, never used by tracemem


    def follow_snapshots(self) -> Optional[Callable[[str, str, int], tuple[int, list[tuple]]]]: ...

    def sql(self, query: str, params: Any = None, timeout: Optional[float] = None) -> Any: ...  # user SQL

    def tables(self) -> set[str]: ...

    def read(self, query: str, params: Any = None) -> Iterator[pa.RecordBatch]: ...

    def append(self, table: str, data: pa.Table) -> dict[str, list[str]]: ...  # notes on values escaped, by run

    def transaction(self) -> ContextManager[None]: ...

    def export(self, directory: str, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]: ...

    def close(self) -> None: ...


class Writes(Protocol):
    """The writer's side of a backend (store/write/writer.py): a connection of its own, and the journal."""

    con: Any  # the writer's own connection
    journal: Any  # where entries wait for the writer (store/write/journal.py); None on `:memory:`
    journal_rows: bool  # the journal is step_journal rows: a batch deletes those of what it writes
    insert: Callable[[Batch], None]  # one transaction of a batch, on `con`

    def transient(self, err: BaseException) -> Optional[str]: ...  # why a failed write is momentary

    def reset(self) -> None: ...  # `con` made sound again after a failed write

    def meta(self, key: str) -> Optional[str]: ...  # a tracemem_meta value, as `con` sees it

    def close(self) -> None: ...


def open_backend(path: str, *, read_only: bool, lock: threading.RLock, lease: str, block_size: int,
                 snapshot_if_locked: bool, log: Callable[[str], None], lease_seconds: float,
                 fsync: bool = False) -> Backend:
    """Open the database `path` names (see the module docstring). `fsync`: the run journal of a DuckDB file
    fdatasyncs each append (PostgreSQL's own commits are as durable as its server is configured)."""
    if is_postgres_url(path):
        try:
            from .pg.backend import PgBackend
        except ImportError as err:
            from ..errors import TracememError

            raise TracememError(f"{path.split('@')[-1]} is a PostgreSQL URL, but the PostgreSQL driver is not "
                                f"installed ({err}); pip install 'tracemem-agents[postgres]'") from None
        return PgBackend(path, read_only=read_only, lock=lock, lease=lease, log=log, lease_seconds=lease_seconds)
    from .duck import DuckBackend

    return DuckBackend(path, read_only=read_only, lock=lock, lease=lease, block_size=block_size,
                       snapshot_if_locked=snapshot_if_locked, log=log, fsync=fsync)
