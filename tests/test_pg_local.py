"""The local PostgreSQL server the tests, benches and CI start (tracemem/store/pg/local.py)."""
from __future__ import annotations

import shutil
import socket
import tempfile

from pg_fixtures import postgres_unavailable


def test_a_free_port_taken_before_the_server_binds_it_is_replaced(monkeypatch) -> None:
    """`free_port` picks a port no one holds, but another process (a second pytest worker starting its own
    server) can bind it before PostgreSQL does: the server then starts on another free port."""
    try:
        import psycopg

        from tracemem.store.pg import local
    except ImportError as err:
        postgres_unavailable(f"psycopg is not installed ({err})")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = taken.getsockname()[1]
    picks = [held]
    real = local.free_port
    monkeypatch.setattr(local, "free_port", lambda: picks.pop() if picks else real())
    directory = tempfile.mkdtemp(prefix="tracemem-pg-", dir="/tmp")  # /tmp: reachable by `nobody` when root
    try:
        try:
            server = local.LocalServer.start(directory)
        except local.ServerUnavailable as err:
            postgres_unavailable(str(err))
        try:
            assert server.port != held and picks == []
            with psycopg.connect(server.url()) as con:
                assert con.execute("SELECT 1").fetchone() == (1,)
        finally:
            server.stop()
    finally:
        taken.close()
        shutil.rmtree(directory, ignore_errors=True)
