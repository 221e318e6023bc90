"""Read-only SQL on PostgreSQL, fenced by the server: a role that may only SELECT the store's tables.

Why: SQL typed by a person is code, and on a superuser session a "read-only" transaction still runs
`COPY … TO PROGRAM`, `pg_read_file`, `pg_reload_conf` and `SET ROLE`. No parser can list every way
in, so the server does the refusing:

- when a writable store sets up its schema, it creates the role `reader_role(database, schema)`
  (NOLOGIN) and grants it USAGE on the schema and SELECT on the store's tables and views
  (`ALL_TABLES`, `VIEWS`), nothing else; each writable open grants what a migration added;
- user SQL on a read-only store runs as one prepared statement (the extended protocol takes exactly
  one) inside `BEGIN READ ONLY; SET LOCAL ROLE <reader>; SET LOCAL statement_timeout`, and is
  rolled back, settings it changed included;
- only on a session whose login role is not a superuser, holds none of the server file and program
  roles, and cannot change the store. Such a role could take its own rights back within the one
  statement (`set_config('role', 'none', true)`), so `check_session` refuses it and says how an
  administrator makes a reading login: `CREATE ROLE alice LOGIN IN ROLE <reader>`.

What is left is the reader's: SELECT on the store, and PostgreSQL's functions every role has.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Callable, Optional

from ...errors import TracememError
from ..tables import ALL_TABLES, VIEWS
from .connection import PgConnection, quote_ident

__all__ = ["FILE_ROLES", "ReaderRefused", "check_session", "grant_reader", "reader_role", "run_read_only",
           "setup_hint"]

FILE_ROLES = ("pg_read_server_files", "pg_write_server_files", "pg_execute_server_program")


class ReaderRefused(TracememError):
    """Why user SQL cannot run on this session (one line; the caller adds the store's name)."""


def reader_role(database: str, schema: str) -> str:
    """The reader role of a store: `tracemem_read_<database>_<schema>`, made a plain lower-case SQL name
    (a short hash of the real names is added when they had to be changed or cut to fit 63 bytes)."""
    raw = f"{database}_{schema}"
    plain = re.sub(r"[^a-z0-9_]", "_", raw.lower())
    name = f"tracemem_read_{plain}"
    if plain != raw or len(name) > 63:
        name = f"{name[:54]}_{hashlib.sha256(raw.encode()).hexdigest()[:8]}"
    return name


def _role(con: PgConnection) -> str:
    database = con.execute("SELECT current_database()").fetchone()[0]
    return reader_role(database, con.target.schema)


def setup_hint(role: str, schema: str, exists: bool = True) -> str:
    """The SQL an administrator runs to make a login that can only read (and the reader role, when missing)."""
    make = "" if exists else (f"CREATE ROLE {role} NOLOGIN; GRANT USAGE ON SCHEMA {quote_ident(schema)} TO {role}; "
                              f"then open the store once for writing (it grants the SELECTs); ")
    return (f"an administrator runs: {make}CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE {role}; and readers log in "
            f"as alice")


def grant_reader(con: PgConnection, log: Callable[[str], None]) -> Optional[str]:
    """Create the store's reader role if missing and grant it what it lacks (see the module docstring);
    the role's name, or None when this login may not create it (said in `log`, with what to run)."""
    role, schema = _role(con), con.target.schema
    exists = con.execute("SELECT 1 FROM pg_roles WHERE rolname = ?", [role]).fetchone() is not None
    try:
        if not exists:
            con.execute(f"CREATE ROLE {quote_ident(role)} NOLOGIN")
        if not con.execute("SELECT has_schema_privilege(?, ?, 'USAGE')", [role, schema]).fetchone()[0]:
            con.execute(f"GRANT USAGE ON SCHEMA {quote_ident(schema)} TO {quote_ident(role)}")
        have = {r[0] for r in con.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ? AND c.relkind IN ('r', 'v', 'p')", [schema]).fetchall()}
        wanted = [t for t in (*ALL_TABLES, *VIEWS) if t in have]
        lacking = [t for t, ok in con.execute(
            "SELECT t, has_table_privilege(?, format('%I.%I', ?::text, t), 'SELECT') FROM unnest(?::text[]) t",
            [role, schema, wanted]).fetchall() if not ok]
        if lacking:
            con.execute(f"GRANT SELECT ON {', '.join(quote_ident(t) for t in lacking)} TO {quote_ident(role)}")
    except TracememError as err:  # (PgError: the server's first line) the store opens all the same
        made = con.execute("SELECT 1 FROM pg_roles WHERE rolname = ?", [role]).fetchone() is not None
        log(f"read-only SQL needs the role {role}, which this login could not set up ({err}); "
            f"{setup_hint(role, schema, made)}")
        return None
    return role


def check_session(con: PgConnection) -> str:
    """The reader role user SQL may run as on this session; ReaderRefused saying why not and what to do."""
    role, schema = _role(con), con.target.schema
    login, superuser, files, writes = con.execute(
        "SELECT session_user, r.rolsuper, "
        "(SELECT coalesce(bool_or(pg_has_role(session_user, f, 'MEMBER')), false) FROM unnest(?::text[]) f), "
        "(SELECT coalesce(bool_or(has_table_privilege(session_user, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')), "
        "false) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND "
        "c.relname = ANY(?::text[])) FROM pg_roles r WHERE r.rolname = session_user",
        [list(FILE_ROLES), schema, list(ALL_TABLES)]).fetchone()
    why = ("is a superuser" if superuser else "may read or write server files or run programs" if files
           else "can change the store" if writes else "")
    exists = con.execute("SELECT 1 FROM pg_roles WHERE rolname = ?", [role]).fetchone() is not None
    if why:
        raise ReaderRefused(f"this connection logs in as {login}, which {why} and could take back the rights "
                            f"a read-only fence removes; connect as a role that can only read: "
                            f"{setup_hint(role, schema, exists)}")
    if not exists:
        raise ReaderRefused(f"the store has no reader role {role} yet (its writer could not create it): "
                            f"{setup_hint(role, schema, exists)}")
    if login != role and not con.execute("SELECT pg_has_role(session_user, ?, 'MEMBER')", [role]).fetchone()[0]:
        raise ReaderRefused(f"{login} is not a member of the store's reader role {role}; an administrator runs: "
                            f"GRANT {role} TO {login}")
    return role


def run_read_only(con: PgConnection, role: str, text: str, args: Any, timeout: float) -> tuple[Any, list[tuple]]:
    """One prepared statement as `role` in a READ ONLY transaction with a statement_timeout, rolled back:
    (its cursor, its rows)."""
    with con.lock:
        con.execute("BEGIN READ ONLY")
        try:
            con.raw.execute(f"SET LOCAL ROLE {quote_ident(role)}")
            con.raw.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
            cur = con.raw.execute(text, args, prepare=True)  # prepared: the extended protocol runs one statement
            rows = cur.fetchall() if cur.description is not None else []
        finally:
            con.execute("ROLLBACK")
    return cur, rows
