"""Read-only SQL on PostgreSQL is fenced by the server (store/pg/reader.py): it runs as the store's reader
role, which may only SELECT the store's tables, in a READ ONLY transaction with a statement_timeout; a
session that could take those rights back (a superuser, a file or program role, a login that can change
the store) is refused with what to set up. Every case runs on a real server (tests/pg_fixtures.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from pg_fixtures import pg_reader_url, pg_server, pg_url, reader_login  # noqa: F401
from tracemem import Pipeline
from tracemem.errors import TracememError
from tracemem.store import Store
from tracemem.store.pg.reader import reader_role
from tracemem.store.tables import ALL_TABLES, VIEWS
from tracemem.store.read.user_sql import QueryTimeout, ReadOnlySQLError

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))


class Note(BaseModel):
    text: str = ""


def record(url: str, n: int = 2) -> list[str]:
    flow = Pipeline("note", Note).then(lambda s: setattr(s, "text", s.text + "!"), id="shout").build()
    with Store(url) as store:
        return [flow.run({"text": f"note {i}"}, store=store).run_id for i in range(n)]


def admin(server, sql: str, params=None):
    with psycopg.connect(server.url("tracemem_tests"), autocommit=True) as con:
        cur = con.execute(sql, params)
        return cur.fetchall() if cur.description else None


def refused(store: Store, query: str) -> str:
    with pytest.raises(ReadOnlySQLError) as info:
        store.sql(query)
    assert "\n" not in str(info.value) and "read-only" in str(info.value)
    return info.value.refused


def test_the_attacks_of_a_hostile_query_are_refused_by_the_server(pg_server, pg_url, pg_reader_url, tmp_path):
    ids = record(pg_url)
    marker = tmp_path / "ran"
    os.chmod(tmp_path, 0o777)  # the server runs as `nobody` under root: a write would be possible, if allowed
    with Store(pg_reader_url, read_only=True) as store:
        assert "external program" in refused(store, f"COPY (SELECT 1) TO PROGRAM 'id > {marker}'")
        assert "COPY to a file" in refused(store, f"COPY runs TO '{tmp_path / 'runs.csv'}'")
        for function in ("pg_read_file('/etc/passwd')", "pg_ls_dir('.')", "pg_reload_conf()",
                         "lo_import('/etc/passwd')", "pg_terminate_backend(pg_backend_pid())",
                         "pg_stat_file('postgresql.conf')"):
            assert "permission denied" in refused(store, f"SELECT {function}"), function
        assert 'set role "postgres"' in refused(store, "SET ROLE postgres")
        assert 'set role "postgres"' in refused(store, "SELECT set_config('role', 'postgres', true)")
        assert "permission denied" in refused(store, "SELECT * FROM pg_authid")
        assert "cannot be changed" in refused(store, "DELETE FROM runs")
        assert "cannot be changed" in refused(store, "CREATE TABLE t (x int)")
        assert refused(store, "ALTER SYSTEM SET work_mem = '1MB'")
        assert refused(store, "SELECT 1; DELETE FROM runs") == "one statement at a time"
        # a setting the query changes is rolled back with its transaction
        store.sql("SELECT set_config('statement_timeout', '0', false)").fetchall()
        assert store.sql("SELECT current_setting('statement_timeout')", timeout=7).fetchall() == [("7s",)]
        assert store.sql("SELECT current_user").fetchall() == [(reader_role("tracemem_tests",
                                                                            pg_url.split("schema=")[1]),)]
        assert sorted(r[0] for r in store.sql("SELECT run_id FROM runs").fetchall()) == sorted(ids)
    assert not marker.exists() and not (tmp_path / "runs.csv").exists()
    with Store(pg_url) as full:
        assert full.sql("SELECT count(*) FROM runs").fetchall() == [(2,)]


def test_every_documented_table_and_view_can_be_read_and_nothing_else(pg_server, pg_url, pg_reader_url):
    record(pg_url, 1)
    schema = pg_url.split("schema=")[1]
    with Store(pg_reader_url, read_only=True) as store:
        for name in (*ALL_TABLES, *VIEWS):
            assert store.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0] >= 0, name
        joined = store.sql("SELECT r.pipeline, count(s.step) FROM runs r JOIN steps s USING (run_id) GROUP BY 1")
        assert joined.fetchall() == [("note", 1)]
    admin(pg_server, f'CREATE TABLE "{schema}".private_notes (x int)')
    with Store(pg_reader_url, read_only=True) as store:
        assert "permission denied for table private_notes" in refused(store, "SELECT * FROM private_notes")


def test_a_query_is_stopped_at_its_time_limit(pg_url, pg_reader_url):
    record(pg_url, 1)
    with Store(pg_reader_url, read_only=True) as store:
        started = time.monotonic()
        with pytest.raises(QueryTimeout, match="longer than 0.5 s"):
            store.sql("SELECT count(*) FROM generate_series(1, 10000000000)", timeout=0.5)
        assert time.monotonic() - started < 30
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]  # the session is fine afterwards


def test_a_superuser_session_is_refused_and_told_how_to_set_up_a_reader(pg_server, pg_url):
    record(pg_url, 1)
    role = reader_role("tracemem_tests", pg_url.split("schema=")[1])
    with Store(pg_url, read_only=True) as store:
        said = refused(store, "SELECT 1")
        assert "logs in as postgres, which is a superuser" in said
        assert f"CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE {role}" in said
        assert len(store.runs()) == 1  # tracemem's own reading still works on that session
    code, _, err = cli("sql", "SELECT 1", "--db", pg_url)
    assert code == 1 and "superuser" in err and f"IN ROLE {role}" in err and len(err.strip().splitlines()) == 1
    code, out, _ = cli("sql", "SELECT count(*) AS n FROM runs", "--db", pg_url, "--write", "--json")
    assert code == 0 and '"n": 1' in out


def test_a_login_that_can_write_or_read_files_is_refused_too(pg_server, pg_url):
    record(pg_url, 1)
    schema = pg_url.split("schema=")[1]
    role = reader_role("tracemem_tests", schema)
    writer, filer, outsider = (f"w_{schema}", f"f_{schema}", f"o_{schema}")
    admin(pg_server, f"CREATE ROLE {writer} LOGIN IN ROLE {role}")
    admin(pg_server, f'GRANT USAGE ON SCHEMA "{schema}" TO {writer}')
    admin(pg_server, f'GRANT INSERT ON "{schema}".runs TO {writer}')
    admin(pg_server, f"CREATE ROLE {filer} LOGIN IN ROLE {role}, pg_read_server_files")
    admin(pg_server, f"CREATE ROLE {outsider} LOGIN")
    admin(pg_server, f'GRANT USAGE ON SCHEMA "{schema}" TO {outsider}')
    admin(pg_server, f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO {outsider}')
    as_ = lambda login: pg_url.replace("postgres@", f"{login}@", 1)  # noqa: E731
    with Store(as_(writer), read_only=True) as store:
        assert "can change the store" in refused(store, "SELECT 1")
    with Store(as_(filer), read_only=True) as store:
        assert "server files" in refused(store, "SELECT 1")
    with Store(as_(outsider), read_only=True) as store:
        assert f"GRANT {role} TO {outsider}" in refused(store, "SELECT 1")


def test_a_migration_adds_its_tables_to_the_readers_grants(pg_server, pg_url, pg_reader_url):
    record(pg_url, 1)
    schema = pg_url.split("schema=")[1]
    admin(pg_server, f'REVOKE SELECT ON "{schema}".feedback FROM {reader_role("tracemem_tests", schema)}')
    with Store(pg_reader_url, read_only=True) as store:
        assert "permission denied" in refused(store, "SELECT * FROM feedback")
    Store(pg_url).close()  # a writable open grants what the role lacks
    with Store(pg_reader_url, read_only=True) as store:
        assert store.sql("SELECT count(*) FROM feedback").fetchall() == [(0,)]


def test_a_writer_that_may_not_create_roles_says_what_an_administrator_runs(pg_server, pg_url):
    schema = pg_url.split("schema=")[1]
    owner = f"own_{schema}"
    admin(pg_server, f"CREATE ROLE {owner} LOGIN")
    admin(pg_server, f'CREATE SCHEMA "{schema}" AUTHORIZATION {owner}')
    logs: list[str] = []
    url = pg_url.replace("postgres@", f"{owner}@", 1)
    with Store(url, log=logs.append):
        pass
    role = reader_role("tracemem_tests", schema)
    said = [m for m in logs if role in m]
    assert said and f"CREATE ROLE {role} NOLOGIN" in said[0] and "permission denied" in said[0]


def cli(*argv: str) -> tuple[int, str, str]:
    proc = subprocess.run([TRACEMEM, *argv], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_cli_sql_reads_as_the_reader(pg_url, pg_reader_url):
    record(pg_url, 2)
    code, out, err = cli("sql", "SELECT count(*) AS n FROM runs", "--db", pg_reader_url, "--json")
    assert code == 0 and '"n": 2' in out, err
    code, _, err = cli("sql", "SELECT pg_read_file('/etc/passwd')", "--db", pg_reader_url)
    assert code == 1 and "read-only" in err and "permission denied" in err
    code, _, err = cli("sql", "SELECT count(*) FROM generate_series(1, 10000000000)", "--db", pg_reader_url,
                       "--timeout", "0.5")
    assert code == 1 and "longer than 0.5 s" in err
    with pytest.raises(TracememError):
        Store(pg_reader_url)  # a reader cannot open the store for writing
