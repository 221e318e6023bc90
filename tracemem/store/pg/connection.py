"""One PostgreSQL connection on which tracemem's own SQL runs as written for DuckDB.

Why: the loader, thread, feedback, affected, blame and memory code is plain SQL with `?`
parameters. Rather than keep a second copy of each query, this connection takes the same
text: `?` becomes psycopg's `%s` (outside quotes and comments), and the few DuckDB functions
that SQL uses (`epoch_ns`, `starts_with`, `list_contains`, `json_keys`, ...) exist in the
store's schema (pg/schema.py). What cannot be shared (bulk inserts, the journal, DDL) lives
behind the backend seam instead.

Values come back as DuckDB gives them: JSON as its text, numeric as float, a pgvector
`vector` as a list of floats. Sessions use UTC, as tracemem stores naive UTC times.

Threads: psycopg runs one statement at a time per connection, but a transaction spans
statements, so `BEGIN` takes this connection's lock until `COMMIT`/`ROLLBACK`: another
thread's statement can never land inside someone else's transaction.
"""
from __future__ import annotations

import re
import struct
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping, Optional
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.numeric import FloatLoader
from psycopg.types.string import TextBinaryLoader, TextLoader

from ...errors import TracememError

__all__ = ["PgConnection", "PgCursor", "PgTarget", "PgError", "translate", "bind", "parse_target", "quote_ident",
           "first_line", "transient_failure"]

_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\?|\$\d+|\$[A-Za-z_]\w*|%")
_BEGIN = ("BEGIN", "BEGIN TRANSACTION", "START TRANSACTION", "BEGIN READ ONLY")
_END = ("COMMIT", "ROLLBACK", "END")


@lru_cache(maxsize=1024)
def translate(query: str) -> str:
    """DuckDB-style parameters for psycopg: `?` as `%s`, `$n` as `%(pn)s` and `$name` as `%(name)s` (see
    `bind`), and a literal `%` as `%%` (psycopg reads `%` everywhere)."""
    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token[0] == "$":
            return f"%(p{token[1:]})s" if token[1:].isdigit() else f"%({token[1:]})s"
        return token.replace("%", "%%")
    return _TOKENS.sub(one, query)


def bind(query: str, params: Any) -> Any:
    """The parameters as psycopg takes them for `translate(query)`: a list, or by name for `$n` and `$name`."""
    if isinstance(params, Mapping):
        return dict(params)
    values = list(params)
    if "%(p" in translate(query):
        return {f"p{i + 1}": v for i, v in enumerate(values)}
    return values


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PgError(TracememError):
    """PostgreSQL refused a statement tracemem ran; the message is the server's first line."""


class PgTarget:
    """Where a store lives: the connection string psycopg gets, the schema, and a label without secrets."""

    def __init__(self, conninfo: str, schema: str, label: str) -> None:
        self.conninfo, self.schema, self.label = conninfo, schema, label


def parse_target(url: str) -> PgTarget:
    """Split tracemem's own `schema=` query parameter off a URL (default schema: public)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "public")
    if not schema or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", schema):
        raise TracememError(f"schema={schema!r} in the store URL is not a plain SQL name (letters, digits, _)")
    rest = [(k, v) for k, v in query if k != "schema"]
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    host = parts.hostname or "localhost"
    netloc = f"{parts.username + '@' if parts.username else ''}{host}{':' + str(parts.port) if parts.port else ''}"
    label = urlunsplit((parts.scheme, netloc, parts.path, "schema=" + schema if schema != "public" else "", ""))
    return PgTarget(conninfo, schema, label)


class _VectorTextLoader(Loader):
    def load(self, data: Any) -> list[float]:
        text = bytes(data).decode()
        return [float(x) for x in text.strip("[]").split(",")] if text.strip("[]") else []


class _VectorBinaryLoader(Loader):
    format = psycopg.pq.Format.BINARY

    def load(self, data: Any) -> list[float]:
        raw = bytes(data)
        dim = struct.unpack_from(">H", raw)[0]
        return list(struct.unpack_from(f">{dim}f", raw, 4))


class PgConnection:
    """A psycopg connection in autocommit mode, in the store's schema, taking DuckDB-style SQL."""

    dialect = "postgres"

    def __init__(self, target: PgTarget, name: str, *, keepalive: Optional[float] = None) -> None:
        self.target = target
        self.options = {"application_name": f"tracemem {name}"[:63]}
        if keepalive:
            # the server ends the session of a client machine that vanished (releasing its advisory locks,
            # pg/lease.py) after about `keepalive` seconds of silence; the client notices a vanished server too
            idle, every = max(1, int(keepalive / 2)), max(1, int(keepalive / 6))
            given = conninfo_to_dict(target.conninfo).get("options") or ""
            self.options.update(keepalives="1", keepalives_idle=str(idle), keepalives_interval=str(every),
                                keepalives_count="3", options=f"{given} -c tcp_keepalives_idle={idle} "
                                f"-c tcp_keepalives_interval={every} -c tcp_keepalives_count=3".strip())
        self.lock = threading.RLock()
        self._held = 0  # how many transactions this connection's lock is held for (0 or 1)
        self._owner: Optional[int] = None  # the thread whose transaction is open
        self.raw = self._connect()

    def _connect(self) -> psycopg.Connection:
        try:
            raw = psycopg.connect(self.target.conninfo, autocommit=True, connect_timeout=10, **self.options)
        except psycopg.Error as err:
            raise TracememError(f"cannot connect to {self.target.label}: {first_line(err)}; check the URL, that "
                                f"the server runs and that this user may log in") from None
        for kind in ("json", "jsonb"):
            raw.adapters.register_loader(kind, TextLoader)
            raw.adapters.register_loader(kind, TextBinaryLoader)
        raw.adapters.register_loader("numeric", FloatLoader)
        raw.execute("SET TIME ZONE 'UTC'")
        raw.execute(f"SET search_path TO {quote_ident(self.target.schema)}, public")
        self._register_vector(raw)
        return raw

    @property
    def broken(self) -> bool:
        """Whether the session is gone (the server restarted or the network dropped it)."""
        return bool(self.raw.closed or self.raw.broken)

    def reopen(self) -> None:
        """A new session in place of a broken one (what a session held, such as advisory locks, is gone)."""
        with self.lock:
            try:
                self.raw.close()
            except psycopg.Error:
                pass
            self.raw = self._connect()

    def register_vector(self) -> None:
        """Load pgvector's `vector` as a list of floats, when the server has the extension installed."""
        self._register_vector(self.raw)

    @staticmethod
    def _register_vector(raw: psycopg.Connection) -> None:
        row = raw.execute("SELECT oid FROM pg_type WHERE typname = 'vector'").fetchone()
        if row is not None:
            raw.adapters.register_loader(row[0], _VectorTextLoader)
            raw.adapters.register_loader(row[0], _VectorBinaryLoader)

    # -- statements ------------------------------------------------------------------------
    def execute(self, query: str, params: Any = None, *, binary: bool = False) -> Any:
        """Run one statement (`?` parameters); the cursor holds its rows (`fetchall()`)."""
        word = query.strip().upper()
        if word in _BEGIN:
            self.lock.acquire()
            self._held += 1
            self._owner = threading.get_ident()
        try:
            with self.lock:
                if params is None:
                    cur = self.raw.execute(query, binary=binary)
                else:
                    cur = self.raw.execute(translate(query), bind(query, params), binary=binary)
        except BaseException as err:
            if word in _BEGIN or word in _END:  # (a failed COMMIT or ROLLBACK ends the transaction too)
                self._release()
            if isinstance(err, psycopg.Error):
                raise PgError(f"{self.target.label}: {first_line(err)}") from err
            raise
        if word in _END:
            self._release()
        if cur.description is None and (cur.statusmessage or "").split(" ")[0] in ("INSERT", "UPDATE", "DELETE"):
            return _Count(cur.rowcount)  # as DuckDB answers a change: one row holding how many rows it changed
        return cur

    def executemany(self, query: str, rows: Iterable[Any]) -> None:
        with self.lock:
            try:
                with self.raw.cursor() as cur:
                    cur.executemany(translate(query), [list(r) for r in rows])
            except psycopg.Error as err:
                raise PgError(f"{self.target.label}: {first_line(err)}") from err

    def _release(self) -> None:
        if self._held:
            self._held -= 1
            self._owner = None
            self.lock.release()

    def owns_transaction(self) -> bool:
        """Whether the calling thread has a transaction open on this connection."""
        return self._owner == threading.get_ident() and self.in_transaction

    @contextmanager
    def transaction(self) -> Iterator["PgConnection"]:
        """BEGIN … COMMIT (ROLLBACK on error), holding this connection for the calling thread; inside a
        transaction this thread already has open, it joins that one."""
        if self.owns_transaction():
            yield self
            return
        self.execute("BEGIN")
        try:
            yield self
        except BaseException:
            try:
                self.execute("ROLLBACK")
            except PgError:  # (a lost session ends the transaction anyway: the first error is the one to raise)
                pass
            raise
        self.execute("COMMIT")

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def cursor(self) -> "PgCursor":
        """A handle on this connection, as DuckDB hands out cursors (psycopg serializes statements itself;
        closing the handle leaves the connection open)."""
        return PgCursor(self)

    def close(self) -> None:
        with self.lock:
            self.raw.close()


class _Count:
    """The result of an INSERT, UPDATE or DELETE: one row holding the number of rows it changed."""

    description = [("Count",)]

    def __init__(self, rows: int) -> None:
        self.rowcount = rows

    def fetchall(self) -> list[tuple[int]]:
        return [(self.rowcount,)]

    def fetchone(self) -> tuple[int]:
        return (self.rowcount,)


class PgCursor:
    """What `PgConnection.cursor()` hands out: the connection's methods, and a `close()` that closes nothing."""

    def __init__(self, con: PgConnection) -> None:
        self.con = con

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)

    def cursor(self) -> "PgCursor":
        return self

    def close(self) -> None:
        """Nothing: the connection belongs to the store."""


def transient_failure(err: BaseException) -> Optional[str]:
    """Why `err` (or the psycopg error behind it) is momentary, worth the same write again shortly on a
    sound session (None: it is not): the session or the server went away, a serialization failure, a
    deadlock or a lock not available, a cancelled statement, the server short of resources for a moment."""
    seen = err
    while seen is not None and not isinstance(seen, psycopg.Error):
        seen = seen.__cause__
    if isinstance(seen, (psycopg.OperationalError, psycopg.InterfaceError,  # SQLSTATE classes 08, 40, 53, 55, 57
                         psycopg.errors.InFailedSqlTransaction)):
        return f"{type(seen).__name__}: {first_line(seen)}"
    return None


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
