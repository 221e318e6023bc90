"""The viewer against hostile requests, heavy queries and crashes, on real stores: the SQL console runs a query
only when its own page posts it; every query stops at the time limit and a slow one never holds up other pages;
no page shows a password; CSV cells are never formulas; snapshot copies never outlive their process. The
cross-site requests a real browser sends are in tests/test_ui_browser.py."""
from __future__ import annotations

import csv
import glob
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pydantic import BaseModel

pytest.importorskip("starlette", reason="the viewer needs the ui extra: pip install -e '.[ui]'")
from starlette.testclient import TestClient  # noqa: E402

from pg_fixtures import pg_reader_url, pg_server, pg_url  # noqa: E402,F401
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store.snapshot_dirs import PREFIX, clean_stale  # noqa: E402
from tracemem.ui import create_app  # noqa: E402
from tracemem.ui.limits import time_limit  # noqa: E402

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
HEAVY = "SELECT sum(range) FROM range(100000000000)"


class Chat(BaseModel):
    question: str = ""
    answer: str = ""


def answer(s: Chat) -> None:
    s.answer = s.question


FLOW = Pipeline("chat", Chat).then(answer).build()


@pytest.fixture
def store_file(tmp_path) -> str:
    path = str(tmp_path / "store.duckdb")
    with Store(path) as store:
        for question in ("=HYPERLINK(\"http://evil.example\",\"click\")", "+1+1", "-2", "@SUM(A1)", "plain"):
            FLOW.run({"question": question}, store=store)
    return path


def client(db: str, **kwargs: Any) -> TestClient:
    return TestClient(create_app(db, **kwargs), base_url="http://127.0.0.1")


def token(web: TestClient) -> str:
    return re.search(r'name="token" value="([^"]+)"', web.get("/sql").text).group(1)


def test_the_console_runs_a_query_only_when_its_own_page_posts_it(store_file):
    web = client(store_file)
    query = "SELECT 'RAN-' || count(*) AS x FROM runs"
    filled = web.get("/sql", params={"q": query})
    assert filled.status_code == 200 and "RAN-5" not in filled.text and 'id="sql-filled"' in filled.text
    good = token(web)
    refusals = [({"q": query}, {}), ({"q": query, "token": "guess"}, {}),
                ({"q": query, "token": good}, {"Sec-Fetch-Site": "cross-site"}),
                ({"q": query, "token": good}, {"Sec-Fetch-Site": "same-site"}),
                ({"q": query, "token": good}, {"Origin": "http://evil.example"}),
                ({"q": query, "token": good}, {"Origin": "null"})]
    for where in ("/sql", "/sql.csv"):
        for form, headers in refusals:
            r = web.post(where, data=form, headers=headers)
            assert r.status_code == 403 and "RAN-" not in r.text, (where, form, headers)
    assert "another site" in web.post("/sql", data={"q": query, "token": good},
                                      headers={"Sec-Fetch-Site": "cross-site"}).text
    own = web.post("/sql", data={"q": query, "token": good},
                   headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1"})
    assert own.status_code == 200 and "RAN-5" in own.text
    assert "RAN-5" in web.post("/sql", data={"q": query, "token": good}).text  # a script with the page's token
    csv_get = web.get("/sql.csv", params={"q": query})
    assert csv_get.status_code == 405 and "RAN-" not in csv_get.text and "CSV button" in csv_get.text


def test_csv_cells_a_spreadsheet_would_run_are_neutralised(store_file):
    web = client(store_file)
    r = web.post("/sql.csv", data={"token": token(web), "q": "SELECT json_extract_string(input, '$.question') AS q, "
                                   "-3 AS n, '=1' AS \"=col\" FROM runs ORDER BY started_at"})
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["q", "n", "'=col"]
    assert [row[0] for row in rows[1:]] == ["'=HYPERLINK(\"http://evil.example\",\"click\")", "'+1+1", "'-2",
                                            "'@SUM(A1)", "plain"]
    assert {row[1] for row in rows[1:]} == {"-3"}  # a number stays a number


def test_a_heavy_query_is_stopped_at_the_time_limit_and_the_viewer_goes_on(store_file):
    web = client(store_file, timeout=1)
    r = web.post("/sql", data={"token": token(web), "q": HEAVY})
    assert r.status_code == 400 and "longer than 1 s and was stopped" in r.text
    assert web.get("/runs").status_code == 200
    assert "RAN" in web.post("/sql", data={"token": token(web), "q": "SELECT 'RAN' AS x"}).text


def test_one_slow_query_never_holds_up_the_other_pages(store_file):
    """A real server: while one request's query runs (until its time limit), other pages are answered."""
    proc = subprocess.Popen([TRACEMEM, "ui", "--db", store_file, "--port", "0", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", proc.stdout.readline()).group(0)
        page = NO_PROXY.open(url + "sql", timeout=30).read().decode()
        form = urllib.parse.urlencode({"q": HEAVY, "token": re.search(r'name="token" value="([^"]+)"', page)
                                       .group(1)}).encode()
        slow: dict[str, Any] = {}

        def post() -> None:
            try:
                NO_PROXY.open(urllib.request.Request(url + "sql", data=form), timeout=120).read()
            except urllib.error.HTTPError as err:
                slow["answer"] = err.read().decode()

        thread = threading.Thread(target=post)
        thread.start()
        answered = []
        for path in ("runs", "memories", "sql"):
            with NO_PROXY.open(url + path, timeout=30) as r:
                answered.append(r.status)
            assert thread.is_alive(), "the heavy query ended before the other pages were asked"
        assert answered == [200, 200, 200]
    finally:
        proc.terminate()  # the server stops; its worker thread's query is interrupted with the instance
        proc.wait(timeout=60)
        thread.join(timeout=120)


def test_every_page_query_has_a_time_limit_the_database_enforces(store_file, pg_url, pg_reader_url):
    with Store(store_file, read_only=True) as store:
        with pytest.raises(duckdb.InterruptException):
            with time_limit(store, 0.3):
                store.backend.con.execute(HEAVY).fetchall()
        assert store.backend.con.execute("SELECT count(*) FROM runs").fetchall() == [(5,)]
    with Store(pg_url) as writer:
        FLOW.run({"question": "q"}, store=writer)
    with Store(pg_url, read_only=True) as store:
        with time_limit(store, 0.3):
            with pytest.raises(Exception, match="statement timeout"):
                store.backend.con.execute("SELECT pg_sleep(5)")


def test_no_page_shows_the_password_of_a_postgresql_url(pg_url, pg_reader_url):
    with Store(pg_url) as writer:
        run_id = FLOW.run({"question": "what is the refund window?"}, store=writer).run_id
    secret = "Sup3rS3cretPw"
    url = pg_url.replace("postgres@", f"postgres:{secret}@", 1)  # trust authentication takes any password
    web = client(url)
    pages = ["/runs", f"/runs/{run_id}", f"/runs/{run_id}/backtrack", f"/runs/{run_id}/scope/0", "/memories",
             "/sql", "/runs/nope", "/no/such/page", "/memories/m_nope", "/sql.csv"]
    for path in pages:
        r = web.get(path)
        assert secret not in r.text and "postgres@127.0.0.1" in r.text, path
    refused = web.post("/sql", data={"token": token(web), "q": "SELECT 1"})
    assert refused.status_code == 400 and "superuser" in refused.text and secret not in refused.text
    reader = client(pg_reader_url.replace("@", f":{secret}@", 1))
    ran = reader.post("/sql", data={"token": token(reader), "q": "SELECT count(*) AS n FROM runs"})
    assert ran.status_code == 200 and '<td class="">1</td>' in ran.text and secret not in ran.text


def test_a_fault_in_a_page_is_shown_on_the_error_page_not_a_bare_500(store_file, tmp_path):
    with Store(store_file) as store:
        run_id = FLOW.run({"question": "q"}, store=store).run_id
        store.flush()
        deep = "[" * 100_000 + "]" * 100_000  # written by some other tool: Python's json cannot read it back
        store.con.execute("UPDATE writes SET value = ? WHERE run_id = ?", [deep, run_id])
    web = TestClient(create_app(store_file), base_url="http://127.0.0.1", raise_server_exceptions=False)
    r = web.get(f"/runs/{run_id}")  # (the server also logs the exception, as for any 500)
    assert r.status_code == 500 and 'id="error-message"' in r.text and "RecursionError" in r.text
    assert "Traceback" not in r.text and "store is unchanged" in r.text


def start_ui(db: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([TRACEMEM, "ui", "--db", db, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, re.search(r"http://127\.0\.0\.1:\d+/", proc.stdout.readline()).group(0)


def copies() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")))


def test_snapshot_copies_are_removed_on_exit_and_stale_ones_at_the_next_start(store_file, tmp_path):
    holder = Store(store_file)  # an agent holds the file, so the viewer reads a copy
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            before = copies()
            proc, url = start_ui(store_file)
            NO_PROXY.open(url + "runs", timeout=30).read()
            made = copies() - before
            assert made, "the viewer read no snapshot copy"
            proc.send_signal(sig)
            proc.wait(timeout=60)
            left = {d for d in made if os.path.exists(d)}
            if sig == signal.SIGTERM:
                assert not left, "a stopped viewer left its snapshot copy"
        assert left, "SIGKILL runs no clean-up: the copy stays until the next start"
        proc, url = start_ui(store_file)  # the next viewer removes what the killed one left
        proc.terminate()
        proc.wait(timeout=60)
        assert not any(os.path.exists(d) for d in left)
    finally:
        holder.close()


def test_only_copies_of_dead_processes_are_cleaned(tmp_path):
    alive, dead, unowned = (tmp_path / f"{PREFIX}{n}" for n in ("alive", "dead", "unowned"))
    for folder in (alive, dead, unowned):
        folder.mkdir()
        (folder / "store.duckdb").write_bytes(b"copy")
    (alive / "owner").write_text(f"{os.getpid()} ")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead / "owner").write_text(f"{gone.pid} ")
    assert clean_stale(str(tmp_path)) == [str(dead)]  # a folder with no owner yet is left alone for a minute
    assert alive.exists() and unowned.exists() and not dead.exists()
