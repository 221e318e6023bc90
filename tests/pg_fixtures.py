"""Fixtures for running tests against both backends: a real PostgreSQL server for the session, a fresh
schema per test, and `store_factory`, parametrised over ["duckdb", "postgres"].

Import them into a test module: `from pg_fixtures import pg_server, pg_url, store_factory  # noqa: F401`
(`pg_reader_url`: the same store as a login that may only read it, which read-only SQL needs).

The server is started from the `pgserver` package's binaries (PostgreSQL 16 with pgvector; `make
install` installs it) or a system PostgreSQL (tracemem/store/pg/local.py says where it looks), in a
temporary directory on a free 127.0.0.1 port. Where no server can start, the PostgreSQL cases skip
and say why; with TRACEMEM_REQUIRE_PG=1 (what .ci/run sets) they fail instead, so CI never passes
by skipping them.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Iterator

import pytest

BACKENDS = ["duckdb", "postgres"]


def postgres_unavailable(reason: str) -> None:
    """Skip (or, with TRACEMEM_REQUIRE_PG=1, fail) a test that needs a PostgreSQL server, saying why."""
    if os.environ.get("TRACEMEM_REQUIRE_PG") == "1":
        pytest.fail(f"PostgreSQL is required here (TRACEMEM_REQUIRE_PG=1) but {reason}")
    pytest.skip(f"no PostgreSQL server for the postgres cases: {reason}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A PostgreSQL server for the whole session, in a temporary directory (stopped and removed after)."""
    try:
        import psycopg  # noqa: F401

        from tracemem.store.pg.local import LocalServer, ServerUnavailable
    except ImportError as err:
        postgres_unavailable(f"psycopg is not installed ({err}); pip install 'tracemem-agents[postgres]'")
    directory = tempfile.mkdtemp(prefix="tracemem-pg-", dir="/tmp")  # /tmp: reachable by `nobody` when root
    try:
        server = LocalServer.start(directory)
        server.ensure_database("tracemem_tests")
    except ServerUnavailable as err:
        shutil.rmtree(directory, ignore_errors=True)
        postgres_unavailable(str(err))
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """A URL naming a fresh schema (one per test) in the session's database."""
    return pg_server.url("tracemem_tests") + f"?schema=t_{uuid.uuid4().hex[:12]}"


def reader_login(server: Any, url: str) -> str:
    """A URL of `url`'s store that logs in as a new role holding only the store's reader role (what read-only
    SQL needs): the store is opened for writing once first, which creates that role."""
    import psycopg

    from tracemem.store import Store
    from tracemem.store.pg.connection import parse_target
    from tracemem.store.pg.reader import reader_role

    Store(url).close()
    schema = parse_target(url).schema
    login = f"reader_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url("tracemem_tests"), autocommit=True) as con:
        con.execute(f'CREATE ROLE {login} LOGIN IN ROLE {reader_role("tracemem_tests", schema)}')
    return url.replace("postgresql://postgres@", f"postgresql://{login}@", 1)


@pytest.fixture
def pg_reader_url(pg_server: Any, pg_url: str) -> str:
    """`pg_url`'s store, as a login that may only read it (see `reader_login`)."""
    return reader_login(pg_server, pg_url)


class StoreFactory:
    """Opens stores at one place per test: `make(**kwargs)` again reopens the same store."""

    def __init__(self, kind: str, location: str) -> None:
        self.kind = kind
        self.location = location
        self.opened: list[Any] = []

    def __call__(self, **kwargs: Any) -> Any:
        from tracemem.store import Store

        store = Store(self.location, **kwargs)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=BACKENDS)
def store_factory(request: Any, tmp_path: Any) -> Iterator[Callable[..., Any]]:
    """`store_factory(**kwargs)` → a Store on this test's DuckDB file, or on its PostgreSQL schema."""
    if request.param == "postgres":
        location = request.getfixturevalue("pg_url")
    else:
        location = str(tmp_path / "store.duckdb")
    factory = StoreFactory(request.param, location)
    yield factory
    factory.close_all()
