"""SQL typed by a person or a script runs on a read-only store in its own locked-down DuckDB instance.

Why: DuckDB SQL is code. On an ordinary connection — even one opened `read_only` — a query can
read any file (`read_csv('/etc/passwd')`), write any file (`COPY … TO`), attach other databases
read-write (the store's own file included, to delete rows with no `memory_events` trail), change
settings, and `INSTALL … FROM` a URL. `Store(path, read_only=True).sql()` and `tracemem sql` without
`--write` must only query the store's tables, so they run here, fenced by DuckDB's own safeguards
(never by filtering the SQL text):

1. a separate in-memory DuckDB instance, created with extension autoload and autoinstall off, no
   persistent secrets and no temp directory (DuckDB keeps its temp directory writable whatever the
   other settings, so `COPY … TO '.tmp/x'` would still write; without it large sorts cannot spill);
2. it ATTACHes the store file READ_ONLY, under the catalog name DuckDB gives the file anyway, makes
   it the default (`USE`) and detaches its own writable scratch catalog;
3. only then `enable_external_access = false` (files, network, extensions: DuckDB still lets the
   attached file be read, and refuses to COPY over it) and `lock_configuration = true` (no SET).

DuckDB configuration belongs to a database instance, and a second connection to the same file in
one process with another configuration is refused ("different configuration"). That is why the
fence is a second instance that attaches the file, rather than settings on the store's own
connection: that one keeps its full rights for tracemem's own work (loading runs, `export` writing
Parquet) and is never handed user SQL. DuckDB's parser only picks the words of a refusal.

A query has a time limit (`DEFAULT_TIMEOUT` unless the caller gives one): DuckDB has no statement
timeout, so a timer calls `interrupt()` on the query's cursor when it runs out, whether DuckDB is
still planning it or the caller is fetching its rows; the next query on that cursor starts a new one.
PostgreSQL's fence (store/pg/reader.py) sets `statement_timeout` instead.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Optional

import duckdb

from ...errors import TracememError

# set when the instance is created: what must never happen even before the lock
CREATE_CONFIG = {"autoload_known_extensions": "false", "autoinstall_known_extensions": "false",
                 "allow_persistent_secrets": "false", "allow_community_extensions": "false",
                 "temp_directory": ""}
RESERVED_CATALOGS = ("memory", "system", "temp")
DEFAULT_TIMEOUT = 60.0  # seconds a read-only query may run (both backends)


class ReadOnlySQLError(TracememError):
    """DuckDB's fence refused a statement of read-only user SQL; `refused` says what, in one line."""

    def __init__(self, refused: str, label: str) -> None:
        self.refused = refused
        super().__init__(f"Store('{label}', read_only=True).sql() is read-only: {refused}; "
                         f"open Store('{label}') to run SQL with full access")


class QueryTimeout(TracememError):
    """A query ran past its time limit and the database stopped it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"the query ran longer than {seconds:g} s and was stopped; narrow it (a WHERE, a LIMIT) "
                         f"or allow more time")


def interrupted(err: BaseException) -> bool:
    """Whether a DuckDB error is the interrupt a time limit sent."""
    return isinstance(err, duckdb.InterruptException)


class UserSQL:
    """The fenced instance for one read-only store: opened on the first query, closed with the store."""

    def __init__(self, path: str, label: str) -> None:
        self.path = path  # the file DuckDB opens (a snapshot copy when the store reads one)
        self.label = label  # the file the user named, for messages
        self._lock = threading.Lock()
        self._con: Optional[duckdb.DuckDBPyConnection] = None
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._local = threading.local()
        self._closed = False
        self._timers: dict[int, threading.Timer] = {}  # per cursor: the time limit of its latest query

    def sql(self, query: str, params: Any = None, timeout: Optional[float] = None) -> Optional[duckdb.DuckDBPyRelation]:
        """A relation over the store's tables (None for a statement that returns nothing), interrupted after
        `timeout` seconds (DEFAULT_TIMEOUT) whether still planning or being fetched."""
        cursor = self._cursor()
        seconds = timeout or DEFAULT_TIMEOUT
        self._arm(cursor, seconds)
        try:
            return cursor.sql(query, params=params)
        except duckdb.Error as err:
            if interrupted(err):
                raise QueryTimeout(seconds) from None
            refused = refusal(query, err)
            if refused is not None:
                raise ReadOnlySQLError(refused, self.label) from None
            raise TracememError(f"SQL error: {_first_line(err)}") from None

    def _arm(self, cursor: duckdb.DuckDBPyConnection, seconds: float) -> None:
        """Stop this thread's previous query's timer and start one for the next."""
        timer = self._timers.pop(id(cursor), None)
        if timer is not None:
            timer.cancel()
        timer = self._timers[id(cursor)] = threading.Timer(seconds, _interrupt, [cursor])
        timer.daemon = True
        timer.start()

    def interrupt(self) -> None:
        """Stop every query running on this instance now (from any thread)."""
        with self._lock:
            for cursor in self._cursors:
                _interrupt(cursor)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for timer in list(self._timers.values()):
                timer.cancel()
            for cursor in self._cursors:
                cursor.close()
            if self._con is not None:
                self._con.close()
            self._cursors, self._con = [], None

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._closed:
            raise TracememError(f"the store {self.label} is closed; open it again to query it")
        cursor = getattr(self._local, "cursor", None)
        if cursor is not None:
            return cursor
        with self._lock:
            if self._closed:
                raise TracememError(f"the store {self.label} is closed; open it again to query it")
            if self._con is None:
                self._con = fenced(self.path)
            cursor = self._local.cursor = self._con.cursor()
            self._cursors.append(cursor)
        return cursor


def _interrupt(cursor: duckdb.DuckDBPyConnection) -> None:
    try:
        cursor.interrupt()
    except duckdb.Error:  # closed meanwhile: nothing runs on it
        pass


def fenced(path: str) -> duckdb.DuckDBPyConnection:
    """A new DuckDB instance that can read `path` and nothing else (see the module docstring)."""
    con = duckdb.connect(":memory:", config=CREATE_CONFIG)
    try:
        quoted = path.replace("'", "''")
        if _default_catalog_name(path).lower() in RESERVED_CATALOGS:  # e.g. memory.duckdb: keep the instance's own
            con.execute(f"ATTACH '{quoted}' AS store (READ_ONLY)")
        else:
            con.execute(f"ATTACH '{quoted}' (READ_ONLY)")
        catalog = con.execute("SELECT database_name FROM duckdb_databases() WHERE readonly AND NOT internal"
                              ).fetchall()[0][0]
        con.execute('USE "{}"'.format(catalog.replace('"', '""')))
        con.execute("DETACH memory")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _default_catalog_name(path: str) -> str:
    """The catalog name DuckDB derives from a file name (agent.duckdb → agent)."""
    name = re.split(r"[\\/]", path)[-1]
    return name.split(".")[0] if "." in name else name


def refusal(query: str, err: duckdb.Error) -> Optional[str]:
    """What the fence refused, in words, or None when `err` is an ordinary SQL error."""
    text = _first_line(err)
    kinds = _statement_kinds(query)
    if "configuration has been locked" in text:
        option = re.search(r'option "([^"]+)"', text)
        return f"changing settings is disabled ({option.group(1) if option else 'SET'})"
    if "read-only mode" in text:
        kind = re.search(r'statement of type "([^"]+)"', text)
        return f"the store cannot be changed ({kind.group(1) if kind else 'a write'})"
    if "Unique file handle conflict" in text:
        return "attaching the store's own file again is disabled (ATTACH)"
    if "belongs to an attached database" in text:
        return "writing files is disabled (COPY onto the store's own file)"
    if not isinstance(err, duckdb.PermissionException):
        return None
    target = re.search(r'"([^"]+)"', text)
    where = f" ({target.group(1)})" if target else ""
    if kinds & {"LOAD", "EXTENSION"} or "extension" in text.lower():
        return "installing and loading extensions is disabled (INSTALL, LOAD)"
    if "ATTACH" in kinds:
        return f"attaching other databases is disabled{where}"
    if kinds & {"COPY", "EXPORT", "COPY_DATABASE"}:
        return f"writing files is disabled{where}"
    if "disabled by configuration" in text:
        return f"file and network access is disabled{where}"
    return f"refused by DuckDB's sandbox ({text})"


def _statement_kinds(query: str) -> set[str]:
    try:
        return {statement.type.name for statement in duckdb.extract_statements(query)}
    except duckdb.Error:
        return set()


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
