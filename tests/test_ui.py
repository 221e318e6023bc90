"""`tracemem ui` route by route (Starlette's TestClient, in process) on real store files: the demo's,
one with forks, loops, subflows and a failed run, and copies the tests change. The browser walk of
the demo's story is tests/test_ui_browser.py."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("starlette", reason="the viewer needs the ui extra: pip install -e '.[ui]'")
from starlette.testclient import TestClient  # noqa: E402

from stages.demo import run_demo  # noqa: E402
from tracemem import Pipeline  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.ui import create_app  # noqa: E402
from tracemem.ui.app import local_hosts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACEMEM = str(Path(sys.executable).with_name("tracemem"))
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only, whatever the environment


def copy_store(path: str, target: str) -> str:
    shutil.copyfile(path, target)
    if os.path.exists(path + ".wal"):
        shutil.copyfile(path + ".wal", target + ".wal")
    return target


def facts(path: str) -> dict[str, Any]:
    """What the demo left in its file: the wrong run, the run it learned the bad memory in, the rerun."""
    with Store(path, read_only=True) as store:
        rows = store.sql("SELECT run_id, json_extract_string(output, '$.answer') FROM runs ORDER BY started_at").fetchall()
        bad = store.sql("SELECT memory_id, source_run_id, source_ref FROM memories WHERE text LIKE '%365 days%'"
                        ).fetchall()[0]
    wrong = [r for r, answer in rows if "approved" in answer]
    return {"runs": [r for r, _ in rows], "wrong": wrong[0], "rerun": rows[-1][0], "memory": bad[0],
            "learned_run": bad[1], "turn": bad[2]}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("ui") / "demo.duckdb")
    run_demo(path, fresh=True, out=io.StringIO())
    return {"path": path, **facts(path)}


def client(path: str, **kwargs: Any) -> TestClient:
    return TestClient(create_app(path, **kwargs), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def web(demo) -> TestClient:
    return client(demo["path"])


class Shape(BaseModel):
    n: int = 0
    left: str = ""
    right: str = ""
    text: str = ""
    out: str = ""
    answer: str = ""


def a(s):
    s.n += 1


def b(s):
    s.left = f"left {s.n}"


def c(s):
    s.right = "right"


def again(s):
    return s.n < 3


def finish(s):
    s.answer = f"{s.left}/{s.right}/{s.out}"


def upper(s):
    s.out = s.text.upper()


def explode(s):
    raise ValueError("the model returned nonsense")


def more(s):
    return s.n < 150


LONG = (Pipeline("long", Shape, max_iterations=200).then(a).then(b).loop_to("a", when=more, max_iterations=200)
        .then(finish).build())
SHAPES = (Pipeline("shapes", Shape, max_iterations=5).then(a).fork(b, c).loop_to("a", when=again, max_iterations=5)
          .subflow(Pipeline("inner", Shape).then(upper).build(), inputs={"text": "left"}, outputs={"out": "out"})
          .then(finish).build())


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("shapes") / "shapes.duckdb")
    with Store(path) as store:
        run = SHAPES.run({}, store=store, subject="ana")
        failed = Pipeline("broken", Shape).then(a).then(explode).build().run({}, store=store, raise_on_error=False)
        xss = Pipeline("<script>alert(1)</script>", Shape).then(a).build().run({}, store=store)
        long = LONG.run({}, store=store)
    return {"path": path, "run": run, "failed": failed.run_id, "xss": xss.run_id, "long": long}


# -- runs ----------------------------------------------------------------------------------------------

def test_runs_page_lists_every_run_with_its_question_and_answer(web, demo):
    r = web.get("/runs")
    assert r.status_code == 200
    for run_id in demo["runs"]:
        assert f'data-run="{run_id}"' in r.text
    assert "Can I get a refund for the ThinkPad" in r.text and "the ThinkPad refund is approved" in r.text
    assert ">6</span> runs" in r.text  # three sessions, two counterfactual checks, the rerun
    assert web.get("/", follow_redirects=False).headers["location"] == "/runs"


def test_runs_filters_pagination_and_prefix(web, demo):
    assert web.get("/runs?status=ok").text.count("data-run=") == 6
    assert "no runs match" in web.get("/runs?status=paused").text
    page = web.get("/runs?status=any-thing").text  # an unknown status is a filter like any other
    assert "no runs match" in page
    statuses = re.findall(r"<option[^>]*>(\w+)</option>", web.get("/runs").text)
    assert {"paused", "interrupted", "running", "failed", "ok"} <= set(statuses)
    assert web.get("/runs?pipeline=support&subject=customer-dana").text.count("data-run=") == 6
    assert web.get("/runs?subject=someone-else").text.count("data-run=") == 0
    assert web.get(f"/runs?id={demo['wrong'][:6]}").text.count("data-run=") == 1
    assert web.get("/runs?since=2999-01-01").text.count("data-run=") == 0
    assert web.get("/runs?until=2999-01-01T00:00").text.count("data-run=") == 6
    first = web.get("/runs?per_page=3")
    assert first.text.count("data-run=") == 3 and "page 1 of 2" in first.text and 'id="next-page"' in first.text
    second = web.get("/runs?per_page=3&page=2")
    assert second.text.count("data-run=") == 3 and f'data-run="{demo["runs"][0]}"' in second.text
    bad = web.get("/runs?since=yesterday")
    assert bad.status_code == 400 and "since must be a date" in bad.text


def test_feedback_filter_shows_the_demos_judgements(demo):
    web = client(demo["path"])  # the demo marks its wrong answer wrong and the two before it right
    page = web.get("/runs").text
    assert 'name="feedback"' in page and "<th>feedback</th>" in page
    wrong = web.get("/runs?feedback=wrong").text
    assert wrong.count("data-run=") == 1 and f'data-run="{demo["wrong"]}"' in wrong
    assert web.get("/runs?feedback=none").text.count("data-run=") == 3  # the counterfactual checks and the rerun
    assert web.get("/runs?feedback=right").text.count("data-run=") == 2
    assert web.get("/runs?feedback=maybe").status_code == 400
    assert "policy is 30 days" in web.get(f"/runs/{demo['wrong']}").text


def test_new_runs_appear_through_the_change_api(demo, tmp_path):
    path = copy_store(demo["path"], str(tmp_path / "live.duckdb"))
    web = client(path, refresh=0)
    page = web.get("/runs").text
    version = re.search(r'data-version="([^"]+)"', page).group(1)
    assert web.get(f"/api/runs/changes?v={version}").json() == {"changed": False}  # a stat(), no DuckDB
    with Store(path) as store:
        added = Pipeline("late", Shape).then(a).build().run({}, store=store)
    answer = web.get(f"/api/runs/changes?v={version}").json()
    assert answer["changed"] and answer["runs"].startswith("7|")
    assert f'data-run="{added.run_id}"' in web.get("/runs/rows").text


def test_a_running_agent_is_read_through_a_snapshot_and_new_runs_show(demo, tmp_path):
    """Another process holds the file (as a live agent does): pages read a copy, refreshed as it writes."""
    path = copy_store(demo["path"], str(tmp_path / "held.duckdb"))
    web = client(path, refresh=0)
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from tracemem import Pipeline
        from tracemem.store import Store
        from pydantic import BaseModel

        class Live(BaseModel):
            n: int = 0

        def step(s):
            s.n += 1

        store = Store({path!r}, flush_interval=0)
        run = Pipeline("agent-live", Live).then(step).build().run({{}}, store=store)
        store.flush()
        print(run.run_id, flush=True)
        sys.stdin.readline()
        store.close()
    """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        run_id = agent.stdout.readline().strip()
        assert run_id, "the agent process did not start"
        page = web.get("/runs")
        assert page.status_code == 200 and "is locked by" in page.text and f'data-run="{run_id}"' in page.text
        busy = client(path, allow_edit=True)
        form = busy.get(f"/memories/{demo['memory']}").text
        token = re.search(r'name="token" value="([^"]+)"', form).group(1)
        refused = busy.post(f"/memories/{demo['memory']}/forget", data={"token": token, "reason": "test"})
        assert refused.status_code == 409 and "was not changed" in refused.text and "open for writing" in refused.text
    finally:
        agent.stdin.close()
        agent.wait(timeout=30)
    with Store(path, read_only=True) as store:
        assert store.memory.get(demo["memory"]).deleted_at is None  # the refused action changed nothing


# -- a run -------------------------------------------------------------------------------------------

def test_run_page_shows_graph_timeline_and_every_step(web, demo):
    r = web.get(f"/runs/{demo['wrong']}")
    assert r.status_code == 200
    page = r.text
    for stage in ("recall", "load_snapshot", "route", "refund_policy", "assemble_prompt", "call_model",
                  "extract_memories"):
        assert f'data-node="{stage}"' in page  # the stage graph
    assert 'class="graph stage-graph"' in page and ">refunds</text>" in page  # the decider's branch on its arrow
    assert page.count('class="bar ') == 7  # timeline
    assert 'id="step-6"' in page and 'id="w-5-5"' in page
    assert 'href="#w-5-5" class="read-source"' in page  # call_model read the prompt assemble_prompt wrote
    assert 'href="#input" class="read-source"' in page
    assert "asks about a refund" in page and "chose <strong>refunds</strong>" in page  # decision evidence
    assert "extract_memories: stored 0" in page  # logs
    assert f'href="/memories/{demo["memory"]}"' in page and "injected" in page  # memory uses
    assert 'class="section kind-memory"' in page and 'class="memory-line"' in page  # prompt by section
    assert "[Memory]" in page and "base rules" in page and "[Directions]" in page
    assert "the ThinkPad refund is approved" in page  # the model's reply


def test_run_by_prefix_redirects_and_unknown_run_is_404(web, demo):
    r = web.get(f"/runs/{demo['wrong'][:6]}/backtrack?path=answer", follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == f"/runs/{demo['wrong']}/backtrack?path=answer"
    missing = web.get("/runs/ffffffffff")
    assert missing.status_code == 404 and "no run" in missing.text and "Traceback" not in missing.text


def test_scope_at_a_step_with_its_diff(web, demo):
    page = web.get(f"/runs/{demo['wrong']}/scope/4").text
    assert "What changed since step 3 (route)" in page
    assert re.search(r'<tr class="added"><td><code>context.policy</code>.*30 days', page)
    first = web.get(f"/runs/{demo['wrong']}/scope/1").text
    assert "since the run input" in first and "<code>memories[0].memory_id</code>" in first
    assert web.get(f"/runs/{demo['wrong']}/scope/99").status_code == 400


def test_a_writes_full_value(web, demo):
    r = web.get(f"/runs/{demo['wrong']}/value/5/5")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "[Memory]" in json.loads(r.text)
    assert web.get(f"/runs/{demo['wrong']}/value/5/99").status_code == 400


def test_fork_loop_subflow_and_failure(shapes):
    web = client(shapes["path"])
    run = shapes["run"]
    page = web.get(f"/runs/{run.run_id}").text
    part = page[page.index('id="waterfall"'):page.index('id="steps"')]
    assert len(re.findall(r'\d+ [bc]</a> <span class="tag">fork</span>', part)) == 6  # 3 forks, 2 branches each
    spans = re.findall(r'class="bar [^"]*"><title>step (\d+) [bc]:', part)  # each branch its own row
    assert len(spans) == 6
    assert '<g class="node kind-fork-branch" data-node="b">' in page and "×3" in page
    assert f'href="/runs/{run.children[0].run_id}"' in page  # the subflow's child run
    failed = web.get(f"/runs/{shapes['failed']}").text
    assert "the model returned nonsense" in failed and 'class="step status-failed"' in failed
    children = web.get("/runs?children=1").text
    assert f'data-run="{run.children[0].run_id}"' in children
    assert f'data-run="{run.children[0].run_id}"' not in web.get("/runs").text


def test_a_long_run_is_shown_a_page_of_steps_at_a_time(shapes):
    web = client(shapes["path"])
    run = shapes["long"]
    assert len(run.steps) > 400
    first = web.get(f"/runs/{run.run_id}").text
    assert 'id="step-1"' in first and 'id="step-200"' in first and 'id="step-201"' not in first
    assert f'href="?at=201#steps"' in first and first.count('class="bar ') == 200
    assert first.count('data-node="a"') == 1  # the stage graph is the whole run's
    middle = web.get(f"/runs/{run.run_id}?at=300").text
    assert 'id="step-201"' in middle and 'id="step-300"' in middle and 'id="step-1"' not in middle
    # step 201 reads what step 200 wrote, which is on the first page: the link goes there
    assert re.search(r'href="\?at=(19\d|200)#w-(19\d|200)-\d+" class="read-source"', middle)
    assert web.get(f"/runs/{run.run_id}?at=x").status_code == 400
    trace = web.get(f"/runs/{run.run_id}/backtrack?path=answer").text
    assert 'id="truncated"' in trace and "Walk deeper" in trace
    deep = web.get(f"/runs/{run.run_id}/backtrack?path=answer&depth=100000&nodes=20000").text
    assert 'id="truncated"' not in deep
    assert web.get(f"/runs/{run.run_id}/backtrack?depth=0").status_code == 400


def test_stored_text_is_escaped(shapes):
    web = client(shapes["path"])
    page = web.get("/runs").text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in web.get(f"/runs/{shapes['xss']}").text


def test_tool_calls_show_when_the_table_exists(demo, tmp_path):
    path = copy_store(demo["path"], str(tmp_path / "tools.duckdb"))
    with Store(path) as store:
        store.sql("INSERT INTO tool_calls (run_id, step, call_id, name, arguments, result) "
                  "VALUES (?, 6, 'tc1', 'lookup_order', '{\"id\": 7}', 'bought 60 days ago')", [demo["wrong"]])
    page = client(path).get(f"/runs/{demo['wrong']}").text
    assert "tool calls" in page and "lookup_order" in page and "bought 60 days ago" in page


# -- backtrack ----------------------------------------------------------------------------------------

def test_backtrack_names_the_bad_memory_and_where_it_was_learned(web, demo):
    r = web.get(f"/runs/{demo['wrong']}/backtrack")
    assert r.status_code == 200
    page = r.text
    causes = page[page.index('id="why"'):page.index('id="trace-graph"')]  # the "why" list comes first
    assert f'data-node="m:{demo["memory"]}"' in causes and f'turn <strong class="turn">{demo["turn"]}</strong>' in causes
    assert 'class="graph trace-graph why-graph"' in page and 'id="full-graph"' in page
    assert f'data-node="m:{demo["memory"]}"' in page and "flagged" in page
    memories = page[page.index('id="trace-memories"'):]
    assert demo["memory"] in memories and f"run {demo['learned_run'][:8]} step 7" in memories
    assert f'turn <strong class="turn">{demo["turn"]}</strong>' in memories
    page = web.get(f"/runs/{demo['wrong']}/backtrack?path=answer&full=1").text  # the whole graph, one click away
    assert 'class="graph trace-graph"' in page and 'id="folded-graph"' in page
    assert "other-run" in page  # nodes recorded in the run the memory was learned in
    assert f'href="/runs/{demo["learned_run"]}?at=7#step-7"' in page  # the extracting step, linked
    assert 'id="explain"' in page and "answer = Yes: your refund window is 365 days" in page
    assert 'class="label correlational"' in page and "not a causal attribution" in page


def test_backtrack_only_focus_any_path_and_missing(web, demo):
    base = f"/runs/{demo['wrong']}/backtrack"
    full = web.get(f"{base}?full=1").text
    folded = web.get(base).text
    assert folded.count("<g class=") < full.count("<g class=")
    narrowed = web.get(f"{base}?only=memory").text
    assert narrowed.count("<g class=") < full.count("<g class=") and f"m:{demo['memory']}" in narrowed
    focus = web.get(f"{base}?path=answer&focus=m:{demo['memory']}").text
    assert "focus m:" in focus and f"m:{demo['memory']}" in focus
    assert web.get(f"{base}?only=everything").status_code == 400
    typed = web.get(f"{base}?path=answer&path=context.policy").text  # the typed path wins over the list
    assert "Why is <code>context.policy</code>" in typed and "refund_policy" in typed
    missing = web.get(f"{base}?path=user").text
    assert 'id="missing"' in missing and "never written" in missing
    data = web.get(f"{base}.json?path=answer").json()
    assert data["root"] and any(n["kind"] == "memory" and n["memory_id"] == demo["memory"] for n in data["nodes"])


# -- memory ------------------------------------------------------------------------------------------

def test_memories_by_subject(web, demo):
    page = web.get("/memories").text
    assert "customer-dana" in page and demo["memory"] in page  # the only subject is opened
    assert "contradicted" in page and "turn t2" in page
    assert "2 injected, 2 excluded" in page  # the wrong run and a counterfactual check; the rerun and the check without it
    assert "no records" in web.get("/memories?subject=nobody").text


def test_memory_page_shows_every_use_and_its_history(web, demo):
    page = web.get(f"/memories/{demo['memory']}").text
    uses = page[page.index('id="uses"'):page.index('id="history"')]
    assert demo["wrong"][:8] in uses and "injected" in uses and "recalled" in uses
    assert demo["rerun"][:8] in uses and "excluded" in uses and "flagged: review_state=contradicted" in uses
    history = page[page.index('id="history"'):]
    assert "remember" in history and "flag" in history and "an account rep cannot change it" in history
    assert "fresh → contradicted" in history
    assert 'id="flag-form"' not in page  # read-only viewer: no actions
    assert web.get("/memories/m_nope").status_code == 404


def test_flag_and_forget_only_with_allow_edit(demo, tmp_path):
    path = copy_store(demo["path"], str(tmp_path / "edit.duckdb"))
    with Store(path, read_only=True) as store:
        memory_id = [r.memory_id for r in store.memory.list("customer-dana") if "ThinkPad" in r.text][0]
    refused = client(path).post(f"/memories/{memory_id}/flag", data={"state": "stale", "reason": "x"})
    assert refused.status_code == 403 and "--allow-edit" in refused.text
    web = client(path, allow_edit=True)
    page = web.get(f"/memories/{memory_id}").text
    token = re.search(r'name="token" value="([^"]+)"', page).group(1)
    assert 'id="flag-form"' in page and 'id="forget-form"' in page
    assert web.post(f"/memories/{memory_id}/flag", data={"state": "stale", "reason": "x"}).status_code == 403
    assert web.post(f"/memories/{memory_id}/flag", data={"token": token, "state": "stale"}).status_code == 400
    done = web.post(f"/memories/{memory_id}/flag", data={"token": token, "state": "stale", "reason": "sold it"},
                    follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/memories/{memory_id}?done=flagged"
    after = web.get(done.headers["location"]).text
    assert "Memory flagged" in after and "sold it" in after and "fresh → stale" in after
    gone = web.post(f"/memories/{memory_id}/forget", data={"token": token, "reason": "asked to"})
    assert gone.status_code == 200 and "forgotten" in gone.text
    with Store(path, read_only=True) as store:
        events = [(e.event, e.reason) for e in store.memory.history(memory_id)]
        assert events[-2:] == [("flag", "sold it"), ("forget", "asked to")]
        assert store.memory.get(memory_id).deleted_at is not None
    assert web.post(f"/memories/{memory_id}/purge", data={"token": token}).status_code == 404


# -- SQL ---------------------------------------------------------------------------------------------

def token_of(web: TestClient) -> str:
    return re.search(r'name="token" value="([^"]+)"', web.get("/sql").text).group(1)


def run_sql(web: TestClient, query: str, page: int = 1, where: str = "/sql") -> Any:
    """What the console's own form posts (ui/sql_page.py: a query runs only by POST with the page's token)."""
    return web.post(where, data={"q": query, "page": str(page), "token": token_of(web)})


def test_sql_select_table_and_pages(web):
    r = run_sql(web, "SELECT run_id, status FROM runs ORDER BY started_at")
    assert r.status_code == 200 and r.text.count("<tr><td") == 6 and "6 rows" in r.text
    many = run_sql(web, "SELECT range AS n FROM range(250)", page=3).text
    assert "page 3 of 3" in many and ">200</td>" in many and ">249</td>" in many and ">199</td>" not in many
    capped = run_sql(web, "SELECT range AS n FROM range(20000)").text
    assert "the first 10000; there are more" in capped
    nulls = run_sql(web, "SELECT NULL AS x, [1, 2] AS l").text
    assert '<td class="null">NULL</td>' in nulls and "[1, 2]" in nulls


def test_sql_refuses_writes_and_files_in_words(web):
    for query, words in [("DELETE FROM runs", "the store cannot be changed"),
                         ("CREATE TABLE x (a INT)", "the store cannot be changed"),
                         ("SELECT * FROM read_csv('/etc/passwd')", "file and network access is disabled"),
                         ("SET threads = 1", "changing settings is disabled")]:
        r = run_sql(web, query)
        assert r.status_code == 400 and 'class="error readonly"' in r.text and words in r.text, query
    bad = run_sql(web, "SELECT 'a'::INT")
    assert bad.status_code == 400 and "Conversion Error" in bad.text and "readonly" not in bad.text
    assert run_sql(web, "SELECT count(*) FROM runs").status_code == 200  # nothing was changed


def test_sql_csv_download(web):
    r = run_sql(web, "SELECT run_id, status, started_at FROM runs ORDER BY started_at", where="/sql.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert "attachment" in r.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["run_id", "status", "started_at"] and len(rows) == 7 and rows[1][1] == "ok"
    refused = run_sql(web, "DROP TABLE runs", where="/sql.csv")
    assert refused.status_code == 400 and "read-only" in refused.text


# -- the app as a whole --------------------------------------------------------------------------------

def test_headers_host_check_and_static_assets(demo):
    web = TestClient(create_app(demo["path"], hosts=local_hosts("127.0.0.1")), base_url="http://127.0.0.1")
    r = web.get("/runs")
    assert "script-src 'self'" in r.headers["content-security-policy"] and r.headers["server-timing"].startswith("app;dur=")
    assert web.get("/static/viewer.js").status_code == 200 and web.get("/static/style.css").status_code == 200
    evil = TestClient(create_app(demo["path"], hosts=local_hosts("127.0.0.1")), base_url="http://evil.example")
    assert evil.get("/runs").status_code == 400  # DNS rebinding: another site's name for 127.0.0.1
    assert local_hosts("0.0.0.0") == ["*"]


def test_everything_ships_in_the_package_nothing_from_a_cdn():
    ui = ROOT / "tracemem" / "ui"
    for path in [*ui.glob("templates/*.html"), *ui.glob("static/*")]:
        text = path.read_text()
        links = [u for u in re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"')]*", text) if "www.w3.org/2000/svg" not in u]
        assert not links, f"{path.name} loads {links}: the viewer must work offline"


def test_cli_ui_serves_over_http_and_errors_are_one_line(demo, tmp_path):
    missing = subprocess.run([TRACEMEM, "ui", "--db", str(tmp_path / "nope.duckdb")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.startswith("tracemem: error: no tracemem store")
    path = copy_store(demo["path"], str(tmp_path / "served.duckdb"))
    proc = subprocess.Popen([TRACEMEM, "ui", "--db", path, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        assert "read-only" in line
        with NO_PROXY.open(url + "runs", timeout=30) as r:
            assert r.status == 200 and demo["wrong"] in r.read().decode()
        # between requests the viewer holds no lock: an agent can open the file for writing beside it
        with Store(path) as store:
            added = Pipeline("beside", Shape).then(a).build().run({}, store=store)
        with NO_PROXY.open(url + "runs", timeout=30) as r:
            assert added.run_id in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_scope_diff_names_elements_not_containers():
    from tracemem.ui.scope_diff import diff

    rows = diff({"context": {}, "notes": ["a"], "n": 1}, {"context": {"policy": "30 days"}, "notes": [], "n": 2})
    assert [(r["path"], r["change"]) for r in rows] == [("context.policy", "added"), ("n", "changed"),
                                                        ("notes[0]", "removed")]


def test_runs_show_feedback_as_a_badge_forks_with_their_parent_and_tokens(web, demo):
    page = web.get("/runs").text
    row = page[page.index(f'data-run="{demo["wrong"]}"'):]
    row = row[:row.index("</tr>")]
    assert '<span class="badge verdict-wrong"' in row and "by support-lead" in row
    assert re.search(r'class="num tokens" title="2 model call\(s\)">\d+ → \d+<', row), row  # answer, extraction
    with Store(demo["path"], read_only=True) as store:
        checks = store.runs(kind="counterfactual", limit=10)
    assert checks
    check = page[page.index(f'data-run="{checks[0]["run_id"]}"'):]
    check = check[:check.index("</tr>")]
    assert 'class="tag kind-counterfactual"' in check
    assert f'class="forked-from" href="/runs/{demo["wrong"]}"' in check
