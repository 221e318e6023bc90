"""Read-only user SQL — `Store(path, read_only=True).sql()` and `tracemem sql` without `--write` — is fenced
by DuckDB's own safeguards: no file or network access, no ATTACH, no SET, no extension installs, no
changes to the store. Every query over the store's tables still runs, and `--write` is the way out."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import duckdb
import pytest

from stages.cli import main
from tracemem.errors import TracememError
from tracemem.store import Store
from tracemem.store.tables import ALL_TABLES
from tracemem.store.read.user_sql import ReadOnlySQLError

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    """The demo's store: every table holds rows (runs, model calls, prompt sections, memories, …)."""
    path = str(tmp_path_factory.mktemp("usersql") / "demo.duckdb")
    assert main(["demo", "--db", path, "--fresh"], out=io.StringIO()) == 0
    return path


@pytest.fixture
def store(demo) -> Iterator[Store]:
    with Store(demo, read_only=True) as opened:
        yield opened


@pytest.fixture
def copy(demo, tmp_path) -> str:
    target = str(tmp_path / "copy.duckdb")
    shutil.copyfile(demo, target)
    return target


def refused(store: Store, query: str) -> str:
    """The statement is refused with a one-line ReadOnlySQLError; returns what it says was refused."""
    with pytest.raises(ReadOnlySQLError) as info:
        store.sql(query)
    message = str(info.value)
    assert "\n" not in message and "read-only" in message and info.value.refused in message
    return info.value.refused


def counts(path: str) -> dict[str, int]:
    """Rows per table, read with plain DuckDB (not through tracemem)."""
    con = duckdb.connect(path, read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ALL_TABLES}
    finally:
        con.close()


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cli(*argv: str) -> tuple[int, str, str]:
    proc = subprocess.run([TRACEMEM, *argv], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


# -- the API --------------------------------------------------------------------------------------


def test_reading_any_file_is_refused(store, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("token\nhunter2\n")
    for query in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/passwd')",
                  "SELECT * FROM read_blob('/etc/passwd')", f"SELECT * FROM '{secret}'",
                  "SELECT * FROM glob('/etc/*')", f"SELECT (SELECT count(*) FROM read_csv('{secret}')) AS n"):
        what = refused(store, query)
        assert what.startswith("file and network access is disabled"), what
    assert "/etc/passwd" in refused(store, "SELECT * FROM read_text('/etc/passwd')")


def test_copy_to_is_refused_and_creates_no_file(store, demo, tmp_path):
    before = digest(demo)
    target = tmp_path / "out.csv"
    for query in (f"COPY runs TO '{target}'", f"COPY (SELECT * FROM memories) TO '{target}' (FORMAT parquet)",
                  f"EXPORT DATABASE '{tmp_path / 'dump'}'", f"COPY runs TO '{demo}'", f"COPY runs TO '{demo}.wal'"):
        assert refused(store, query).startswith("writing files is disabled"), query
    assert not target.exists() and not (tmp_path / "dump").exists() and not os.path.exists(demo + ".wal")
    assert digest(demo) == before


def test_attach_is_refused_for_another_store_and_for_the_store_itself(store, demo, tmp_path):
    other = str(tmp_path / "other.duckdb")
    with Store(other) as writable:
        writable.memory.remember("bo", "bo likes tea")
    other_before = counts(other)
    link = str(tmp_path / "same-file.duckdb")
    os.link(demo, link)  # another name for the store's own file
    before = counts(demo)
    assert refused(store, f"ATTACH '{other}' AS other (READ_WRITE)").startswith("attaching other databases")
    assert refused(store, f"ATTACH '{other}' AS other (READ_ONLY)").startswith("attaching other databases")
    assert refused(store, f"ATTACH '{link}' AS again (READ_WRITE)").startswith("attaching other databases")
    assert refused(store, f"ATTACH '{demo}' AS again (READ_WRITE)").startswith("attaching the store's own file")
    for query in ("DELETE FROM again.runs", "DELETE FROM other.memories"):
        with pytest.raises(Exception):
            store.sql(query)
    assert counts(demo) == before and counts(other) == other_before


def test_settings_cannot_be_changed(store):
    for query, option in (("SET threads = 1", "threads"), ("PRAGMA threads = 1", "threads"),
                          ("RESET memory_limit", "memory_limit"),
                          ("SET enable_external_access = true", "enable_external_access"),
                          ("SET lock_configuration = false", "lock_configuration"),
                          ("SET allowed_directories = ['/']", "allowed_directories")):
        assert refused(store, query) == f"changing settings is disabled ({option})"
    with pytest.raises(ReadOnlySQLError):  # still fenced after all those attempts
        store.sql("SELECT * FROM read_text('/etc/passwd')")


class Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_install_from_a_url_is_refused_and_sends_no_request(store):
    Recorder.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with duckdb.connect() as plain:  # the server does receive what DuckDB sends when unfenced
            with pytest.raises(duckdb.Error):
                plain.execute(f"INSTALL tracemem_probe FROM '{url}'")
        assert Recorder.hits and "tracemem_probe" in Recorder.hits[0]
        Recorder.hits.clear()
        for query in (f"INSTALL tracemem_probe FROM '{url}'", f"FORCE INSTALL httpfs FROM '{url}'", "LOAD httpfs"):
            assert refused(store, query).startswith("installing and loading extensions is disabled")
        assert refused(store, f"SELECT * FROM read_csv('{url}/data.csv')").startswith("file and network access")
        assert refused(store, f"SET custom_extension_repository = '{url}'").startswith("changing settings")
        assert Recorder.hits == []
    finally:
        server.shutdown()
        server.server_close()


def test_changes_to_the_store_are_refused(store, demo):
    before = counts(demo)
    for query, kind in (("DELETE FROM runs", "DELETE"), ("UPDATE memories SET confidence = 100", "UPDATE"),
                        ("INSERT INTO tracemem_meta VALUES ('x', 'y')", "INSERT"), ("CREATE TABLE t (x INT)", "CREATE"),
                        ("DROP TABLE memory_events", "DROP"), ("TRUNCATE steps", "DELETE"),
                        ("ALTER TABLE runs ADD COLUMN x INT", "ALTER")):
        assert refused(store, query) == f"the store cannot be changed ({kind})"
    assert counts(demo) == before


def test_every_table_and_join_still_answers(store, demo):
    expected = counts(demo)
    empty = ("step_journal", "subflows", "human_inputs", "snapshot_uses", "tool_calls", "pruned_runs", "effects",
             "tool_sets")  # no tools
    assert all(expected[t] > 0 for t in ALL_TABLES if t not in empty)  # the demo fills the rest (its rerun skips the suspect run)
    for table in ALL_TABLES:
        assert store.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0] == expected[table], table
        assert len(store.sql(f"SELECT * FROM {table}").fetchall()) == expected[table]
    plain = duckdb.connect(demo, read_only=True)
    joins = [
        "SELECT r.run_id, s.stage, count(w.seq) FROM runs r JOIN steps s USING (run_id) "
        "LEFT JOIN writes w ON w.run_id = s.run_id AND w.step = s.step GROUP BY ALL ORDER BY ALL",
        "SELECT u.run_id, m.text, m.review_state FROM memory_uses u JOIN memories m USING (memory_id) "
        "JOIN runs r USING (run_id) ORDER BY ALL",
        "SELECT c.model, p.kind, count(*) FROM model_calls c JOIN prompt_sections p USING (prompt_id) "
        "GROUP BY ALL ORDER BY ALL",
        "SELECT e.event, count(*) FROM memory_events e JOIN memories USING (memory_id) GROUP BY ALL ORDER BY ALL",
        "SELECT d.chosen, rd.path FROM decisions d JOIN reads rd USING (run_id, step) ORDER BY ALL",
        "SELECT s.run_id, e.embedder_id FROM run_embeddings e LEFT JOIN snapshot_uses s ON e.run_id = s.source_run_id "
        "ORDER BY ALL",
        "SELECT s.run_id, s.reason, r.status FROM suspect_runs s JOIN runs r USING (run_id) ORDER BY ALL",  # a view
    ]
    try:
        for query in joins:
            rows = store.sql(query).fetchall()
            assert rows and rows == plain.execute(query).fetchall(), query
    finally:
        plain.close()
    assert store.sql("SELECT count(*) FROM runs WHERE status = ?", ["ok"]).fetchall()[0][0] >= 1  # parameters


def test_the_store_itself_still_loads_and_exports(store, tmp_path):
    refused(store, f"COPY runs TO '{tmp_path / 'never.csv'}'")
    run_id = store.runs()[0]["run_id"]
    assert store.run(run_id).steps
    written = store.export(str(tmp_path / "parquet"))  # tracemem's own COPY TO still works
    assert written["runs"] == len(store.runs(include_children=True, limit=1000))
    assert {p.stem for p in (tmp_path / "parquet").glob("*.parquet")} == set(written)


def test_read_only_stores_share_a_file_and_release_it(demo, copy):
    first, second = Store(copy, read_only=True), Store(copy, read_only=True)
    try:
        assert first.sql("SELECT count(*) FROM runs").fetchall() == second.sql("SELECT count(*) FROM runs").fetchall()
        first.close()
        assert second.sql("SELECT count(*) FROM memories").fetchall()[0][0] == counts(demo)["memories"]
        with pytest.raises(ReadOnlySQLError):
            second.sql("SELECT * FROM read_text('/etc/passwd')")
    finally:
        first.close()
        second.close()
    with Store(copy) as writable:  # nothing of the fence holds the file any more
        assert writable.sql("DELETE FROM tracemem_meta WHERE key = 'nothing'").fetchall() == [(0,)]
    with pytest.raises(TracememError, match="is closed"):
        first.sql("SELECT 1")


def test_a_writable_store_keeps_full_sql(copy, tmp_path):
    target = tmp_path / "runs.csv"
    with Store(copy) as writable:
        writable.sql(f"COPY runs TO '{target}'")
        assert writable.sql("DELETE FROM memory_events WHERE false").fetchall() == [(0,)]
    assert target.read_text().startswith("run_id,")


# -- the command line -------------------------------------------------------------------------------


def test_cli_sql_is_fenced_with_a_one_line_error(demo, tmp_path):
    target = tmp_path / "out.csv"
    for query, what in (("SELECT * FROM read_csv('/etc/passwd')", "file and network access is disabled (/etc/passwd)"),
                        (f"COPY runs TO '{target}'", "writing files is disabled"),
                        (f"ATTACH '{tmp_path / 'x.duckdb'}' AS x", "attaching other databases is disabled"),
                        ("SET threads = 1", "changing settings is disabled (threads)"),
                        ("INSTALL httpfs FROM 'http://127.0.0.1:9'", "installing and loading extensions"),
                        ("DELETE FROM runs", "the store cannot be changed (DELETE)")):
        code, out, err = cli("sql", query, "--db", demo)
        assert code == 1 and out == "" and err.count("\n") == 1, (query, err)
        assert err.startswith(f"tracemem: error: tracemem sql is read-only: {what}"), err
        assert "Use --write" in err and "Traceback" not in err
    assert not target.exists() and not (tmp_path / "x.duckdb").exists()


def test_cli_sql_reads_every_table(demo):
    expected = counts(demo)
    union = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t}" for t in ALL_TABLES)
    code, out, err = cli("sql", union, "--db", demo, "--json")
    assert code == 0, err
    assert {row["t"]: row["n"] for row in json.loads(out)} == expected
    code, out, err = cli("sql", "SELECT m.text, count(*) AS uses FROM memory_uses u JOIN memories m USING (memory_id) "
                                "GROUP BY m.text ORDER BY m.text", "--db", demo)
    assert code == 0 and out.splitlines()[0].split() == ["text", "uses"] and "(no rows)" not in out


def test_cli_write_is_the_way_out(copy, tmp_path):
    target = tmp_path / "runs.csv"
    code, out, err = cli("sql", f"COPY runs TO '{target}'", "--db", copy, "--write")
    assert code == 0 and target.read_text().startswith("run_id,"), err
    code, out, err = cli("sql", "DELETE FROM memory_events", "--db", copy, "--write")
    assert code == 0 and counts(copy)["memory_events"] == 0, err


def test_cli_fences_the_snapshot_it_reads_while_another_process_writes(copy, tmp_path):
    ready = str(tmp_path / "ready")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from tracemem.store import Store
        store = Store({copy!r})
        open({ready!r}, "w").write("held")
        time.sleep(120)
    """)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ready) or not open(ready).read():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        code, out, err = cli("sql", "SELECT count(*) AS n FROM runs", "--db", copy, "--json")
        assert code == 0 and json.loads(out)[0]["n"] > 0 and "reading a copy" in err
        code, out, err = cli("sql", "SELECT * FROM read_text('/etc/passwd')", "--db", copy)
        assert code == 1 and "tracemem sql is read-only: file and network access is disabled" in err
        code, out, err = cli("sql", f"ATTACH '{copy}' AS held (READ_WRITE)", "--db", copy)
        assert code == 1 and "tracemem sql is read-only: attaching other databases is disabled" in err
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_relations_it_returns_are_fenced_too(store, tmp_path):
    rel = store.sql("SELECT * FROM runs")
    for write in (lambda: rel.to_csv(str(tmp_path / "r.csv")), lambda: rel.to_parquet(str(tmp_path / "r.parquet")),
                  lambda: rel.create("copied_runs")):
        with pytest.raises(duckdb.Error, match="disabled by configuration|read-only"):
            write()
    assert list(tmp_path.iterdir()) == []
    assert rel.arrow().read_all().num_rows == len(rel.fetchall())


def test_threads_query_one_read_only_store(store, demo):
    expected = counts(demo)
    results: list[bool] = []

    def work() -> None:
        for table in ALL_TABLES:
            results.append(store.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0] == expected[table])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4 * len(ALL_TABLES) and all(results)
