"""The demo's story in a real headless Chromium, against a real `tracemem ui` process.

Open the runs page, click the run that gave the wrong answer, open its backtrack and find the bad
memory with the run and turn it was learned in; open that memory and see every run that used it;
run a SELECT in the SQL console and see a write refused; watch a new run appear on the runs page
while another process writes the file. Each page is saved as a screenshot under
$TRACEMEM_ARTIFACTS (else the test's tmp directory).

Needs Debian's chromium and chromium-driver (.ci/run installs them); skipped, with the reason,
where they are missing.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from uiharness import chromium, missing_browser, serve_ui

REASON = missing_browser()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
ROOT = Path(__file__).resolve().parents[1]


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "the page") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
            if found:
                return found
        except Exception:  # noqa: BLE001 - the page is still loading; try again until the deadline
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TRACEMEM_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, Any]:
    from stages.demo import run_demo
    from tracemem.store import Store

    path = str(tmp_path_factory.mktemp("browser") / "demo.duckdb")
    run_demo(path, fresh=True, out=io.StringIO())
    with Store(path, read_only=True) as store:
        runs = store.sql("SELECT run_id, json_extract_string(output, '$.answer') FROM runs ORDER BY started_at"
                         ).fetchall()
        memory_id, learned, turn = store.sql(
            "SELECT memory_id, source_run_id, source_ref FROM memories WHERE text LIKE '%365 days%'").fetchall()[0]
    wrong = [r for r, answer in runs if "approved" in answer][0]
    return {"path": path, "wrong": wrong, "rerun": runs[-1][0], "memory": memory_id, "learned": learned, "turn": turn}


def test_the_demo_story_in_a_browser(demo, artifacts):
    from selenium.webdriver.common.by import By

    with serve_ui(demo["path"]) as url, chromium() as browser:
        def shot(name: str) -> None:
            browser.save_screenshot(str(artifacts / f"{name}.png"))

        browser.get(url + "runs")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#runs-body tr[data-run]"), what="the runs table")
        shot("1-runs")
        row = next(tr for tr in browser.find_elements(By.CSS_SELECTOR, "#runs-body tr[data-run]")  # the one marked
                   if "approved" in tr.find_element(By.CSS_SELECTOR, "td.answer").get_attribute("title")  # wrong
                   and "wrong" in tr.text)
        row.find_element(By.CSS_SELECTOR, "a.run-link").click()

        wait_for(lambda: browser.find_element(By.ID, "run-id").text == demo["wrong"], what="the wrong run's page")
        assert browser.find_element(By.CSS_SELECTOR, 'svg.stage-graph g[data-node="call_model"]')
        assert "the ThinkPad refund is approved" in browser.find_element(By.ID, "step-6").text
        shot("2-run")
        browser.find_element(By.ID, "backtrack-link").click()

        table = wait_for(lambda: browser.find_element(By.ID, "trace-memories"), what="the backtrack page")
        assert demo["memory"] in table.text
        assert f"run {demo['learned'][:8]} step 7, turn {demo['turn']}" in table.text
        assert browser.find_element(By.CSS_SELECTOR, f'svg.why-graph g[data-node="m:{demo["memory"]}"]')
        assert browser.find_element(By.CSS_SELECTOR, f'#why tr[data-node="m:{demo["memory"]}"]')
        shot("3-backtrack")
        browser.find_element(By.ID, "full-graph").click()  # the whole graph, one click away
        assert wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "svg.trace-graph g.other-run"),
                        what="the full graph")
        assert "answer = Yes: your refund window is 365 days" in browser.find_element(By.ID, "explain").text
        shot("3b-backtrack-full")
        link = next(a for a in browser.find_elements(By.CSS_SELECTOR, "#trace-memories a.memory-link")
                    if a.text == demo["memory"])
        link.click()

        uses = wait_for(lambda: browser.find_element(By.ID, "uses"), what="the memory page")
        rows = {tr.find_element(By.CSS_SELECTOR, "a.use-run").text: tr.text
                for tr in uses.find_elements(By.CSS_SELECTOR, "tr") if tr.find_elements(By.CSS_SELECTOR, "a.use-run")}
        assert "injected" in rows[demo["wrong"][:8]]
        assert "excluded" in rows[demo["rerun"][:8]] and "contradicted" in rows[demo["rerun"][:8]]
        shot("4-memory")

        browser.get(url + f"runs/{demo['wrong']}/scope/4")
        assert "context.policy" in wait_for(lambda: browser.find_element(By.ID, "scope-diff")).text
        shot("5-scope")

        browser.get(url + "sql")
        box = wait_for(lambda: browser.find_element(By.ID, "sql-query"), what="the SQL page")
        box.send_keys("SELECT stage, count(*) AS n FROM steps GROUP BY stage ORDER BY stage")
        browser.find_element(By.ID, "sql-run").click()
        result = wait_for(lambda: browser.find_element(By.ID, "sql-result"), what="the SQL result")
        assert "extract_memories" in result.text and len(result.find_elements(By.CSS_SELECTOR, "tbody tr")) == 8
        shot("6-sql")
        box = browser.find_element(By.ID, "sql-query")
        box.clear()
        box.send_keys("DELETE FROM memories")
        browser.find_element(By.ID, "sql-run").click()
        error = wait_for(lambda: browser.find_element(By.ID, "sql-error"), what="the read-only refusal")
        assert "read-only" in error.text and "cannot be changed" in error.text
        shot("7-sql-refused")


def test_new_runs_appear_while_an_agent_writes(demo, artifacts, tmp_path):
    """A second process records a run and keeps the file open (a live agent): the open runs page shows it."""
    from selenium.webdriver.common.by import By

    path = str(tmp_path / "live.duckdb")
    for suffix in ("", ".wal"):
        if os.path.exists(demo["path"] + suffix):
            Path(path + suffix).write_bytes(Path(demo["path"] + suffix).read_bytes())
    with serve_ui(path) as url, chromium() as browser:
        browser.get(url + "runs")
        wait_for(lambda: browser.find_element(By.ID, "live").text == "live", what="the live poller")
        agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from pydantic import BaseModel
            from tracemem import Pipeline
            from tracemem.store import Store

            class Live(BaseModel):
                n: int = 0

            def step(s):
                s.n += 1

            store = Store({path!r}, flush_interval=0)
            run = Pipeline("agent-live", Live).then(step).build().run({{}}, store=store, subject="live")
            store.flush()
            print(run.run_id, flush=True)
            sys.stdin.readline()
            store.close()
        """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            run_id = agent.stdout.readline().strip()
            assert run_id, "the agent process did not start"
            row = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, f'#runs-body tr[data-run="{run_id}"]'),
                           timeout=30, what="the new run to appear")
            assert "new" in row.get_attribute("class")
            assert "agent-live" in row.text
            browser.save_screenshot(str(artifacts / "8-runs-live.png"))
        finally:
            agent.stdin.close()
            agent.wait(timeout=30)


@pytest.fixture
def attacker(tmp_path):
    """Another web site: a static server on another port, reached as http://localhost:PORT (another site than
    the viewer's http://127.0.0.1) or as http://127.0.0.1:PORT (same site, another origin)."""
    import functools
    import http.server
    import threading

    folder = tmp_path / "site"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_another_site_cannot_make_the_browser_run_sql_or_change_memory(demo, attacker, tmp_path):
    """A real page on another origin posts to the viewer's SQL console and memory actions, as a hostile page
    the user happens to visit would: the browser marks the requests cross-site and the viewer refuses them,
    and a link that fills the console never runs it."""
    from selenium.webdriver.common.by import By

    from tracemem.store import Store

    folder, port = attacker
    path = str(tmp_path / "edit.duckdb")
    for suffix in ("", ".wal"):
        if os.path.exists(demo["path"] + suffix):
            Path(path + suffix).write_bytes(Path(demo["path"] + suffix).read_bytes())
    with serve_ui(path, "--allow-edit") as url, chromium() as browser:
        query = "SELECT 'STOLEN-' || count(*) AS x FROM runs"
        (folder / "sql.html").write_text(f"""<!doctype html><body>
            <form id="f" method="post" action="{url}sql"><input name="q" value="{query}">
            <input name="token" value="a-guess"></form>
            <script>document.getElementById("f").submit()</script></body>""")
        (folder / "flag.html").write_text(f"""<!doctype html><body>
            <form id="f" method="post" action="{url}memories/{demo['memory']}/forget">
            <input name="reason" value="hostile"><input name="token" value="a-guess"></form>
            <script>document.getElementById("f").submit()</script></body>""")
        for origin, fetch_site in ((f"http://localhost:{port}", "cross-site"), (f"http://127.0.0.1:{port}", "same-site")):
            for page in ("sql.html", "flag.html"):
                browser.get(f"{origin}/{page}")
                message = wait_for(lambda: browser.find_element(By.ID, "error-message"), what="the viewer's refusal")
                assert f"came from another site (Sec-Fetch-Site: {fetch_site})" in message.text, (origin, page)
                assert "STOLEN-" not in browser.page_source
        browser.get(url + "sql?q=" + query.replace(" ", "+").replace("'", "%27").replace("|", "%7C"))
        filled = wait_for(lambda: browser.find_element(By.ID, "sql-filled"), what="the console, filled in")
        assert "press Run" in filled.text and not browser.find_elements(By.ID, "sql-result")
        assert browser.find_element(By.ID, "sql-query").get_attribute("value") == query
        browser.find_element(By.ID, "sql-run").click()  # the user's own click on the viewer's page does run it
        result = wait_for(lambda: browser.find_element(By.ID, "sql-result"), what="the result")
        assert "STOLEN-6" in result.text
    with Store(path, read_only=True) as store:
        assert store.memory.get(demo["memory"]).deleted_at is None  # the hostile page changed nothing
