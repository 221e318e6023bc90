"""Every SQL recipe the project shows runs against the demo's file: the SQL blocks of the README and of
docs/*.md, the commands the demo prints at its end, and examples/sql_recipes.py. Durations are stored
columns (`duration_ms`), because DuckDB 2 cannot take `epoch_ms` of a TIMESTAMP_NS."""
from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
from pathlib import Path

import duckdb
import pytest
from pydantic import BaseModel

from stages.cli import main
from stages.demo import run_demo
from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.store import Store
from tracemem.store import tables as store_schema

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, str]:
    path = str(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    out = io.StringIO()
    run_demo(path, fresh=True, out=out)
    return path, out.getvalue()


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def readme_sql() -> list[str]:
    """The SQL blocks of the README, then of each page in docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in pages for b in re.findall(r"```sql\n(.*?)```", page.read_text(), flags=re.S)]
    return [s.query.strip() for block in blocks for s in duckdb.extract_statements(block)]


def test_every_readme_sql_recipe_runs_against_the_demo_file(demo, capsys):
    path, _ = demo
    recipes = readme_sql()
    assert len(recipes) >= 5 and any("duration_ms" in r for r in recipes)
    for recipe in recipes:
        code, out, err = cli(capsys, "sql", recipe, "--db", path)
        assert code == 0 and not err, f"{recipe}\n{err}"
    # the slowest-stages recipe gives real figures: every stage the demo ran, with a duration
    code, out, _ = cli(capsys, "sql", next(r for r in recipes if "slowest" in r or "avg(duration_ms)" in r),
                       "--db", path, "--json")
    rows = json.loads(out)
    assert {r["stage"] for r in rows} >= {"recall", "load_snapshot", "call_model", "extract_memories"}
    assert all(r["avg_ms"] is not None and r["avg_ms"] >= 0 for r in rows)


def test_every_command_the_demo_prints_at_its_end_runs(demo, capsys):
    path, printed = demo
    tail = printed.split("== Explore it yourself", 1)[1].strip().splitlines()
    assert len(tail) >= 5 and any(" sql " in line for line in tail)
    for line in tail:
        argv = shlex.split(line)[1:]  # drop the program name (`tracemem` or .venv/bin/tracemem)
        assert argv[argv.index("--db") + 1] == path
        code, out, err = cli(capsys, *argv)
        assert code == 0 and out.strip() and "error" not in err, f"{line}\n{err}"


def test_examples_sql_recipes_run_against_the_demo_file(demo, capsys):
    path, _ = demo
    spec = importlib.util.spec_from_file_location("sql_recipes", ROOT / "examples" / "sql_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for title, recipe in module.RECIPES:
        code, _, err = cli(capsys, "sql", recipe, "--db", path)
        assert code == 0 and not err, f"{title}\n{err}"


def test_an_error_while_fetching_has_the_sql_error_prefix(demo, capsys):
    path, _ = demo
    # DuckDB 2 raises this one lazily, when rows are fetched, not when the query is planned
    code, _, err = cli(capsys, "sql", "SELECT epoch_ms(ended_at) FROM steps", "--db", path)
    assert code == 1 and err.startswith("tracemem: error: SQL error: Conversion Error")
    code, _, err = cli(capsys, "sql", "SELECT nosuch FROM steps", "--db", path)
    assert code == 1 and err.startswith("tracemem: error: SQL error: ")


# -- duration_ms, written and migrated -------------------------------------------------------------------

class Q(BaseModel):
    question: str = ""
    answer: str = ""


def ask(s: Q, ctx) -> None:
    s.answer = ctx.complete(ctx.env["model"], [{"role": "user", "content": s.question}]).text


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_duration_ms_is_the_recorded_span_of_runs_steps_and_model_calls(tmp_path, durability):
    flow = Pipeline("timed", Q).then(ask).build()
    with Store(str(tmp_path / "t.duckdb"), durability=durability) as store:
        run = flow.run({"question": "hi"}, store=store, env={"model": ScriptedModel(default="hello")})
        [(run_ms, ended, started)] = store.sql(
            "SELECT duration_ms, epoch_ns(ended_at), epoch_ns(started_at) FROM runs").fetchall()
        assert run_ms == pytest.approx((ended - started) / 1e6) and run_ms == (run.ended_at - run.started_at) / 1e6
        [(step_ms,)] = store.sql("SELECT duration_ms FROM steps").fetchall()
        step = run.steps[0]
        assert step_ms == pytest.approx((step.ended_at - step.started_at) / 1e6) and 0 < step_ms <= run_ms
        [(call_ms, latency)] = store.sql("SELECT duration_ms, latency_ms FROM model_calls").fetchall()
        assert call_ms == latency and call_ms is not None and call_ms <= step_ms
        assert store.runs()[0]["duration_ms"] == round(run_ms, 3)


def test_a_v3_file_migrates_with_durations_for_its_old_rows(tmp_path):
    path = str(tmp_path / "v3.duckdb")
    con = duckdb.connect(path)
    store_schema.create(con, version=3)
    con.execute("INSERT INTO runs (run_id, pipeline, pipeline_hash, status, started_at, ended_at, input, output) "
                "VALUES ('old', 'legacy', 'h', 'ok', TIMESTAMP '2024-01-01 10:00:00', "
                "TIMESTAMP '2024-01-01 10:00:02.5', '{}', '{}')")
    con.execute("INSERT INTO steps (run_id, step, stage, name, kind, iteration, status, started_at, ended_at) "
                "VALUES ('old', 1, 'a', 'a', 'stage', 0, 'ok', TIMESTAMP '2024-01-01 10:00:00', "
                "TIMESTAMP '2024-01-01 10:00:00.25')")
    con.execute("INSERT INTO model_calls (run_id, step, call_id, model, latency_ms) VALUES ('old', 1, 'c', 'm', 12.5)")
    con.close()
    with Store(path) as store:
        assert store.sql("SELECT duration_ms, degraded FROM runs").fetchall() == [(2500.0, None)]
        assert store.sql("SELECT duration_ms FROM steps").fetchall() == [(250.0,)]
        assert store.sql("SELECT duration_ms FROM model_calls").fetchall() == [(12.5,)]
        assert store.run("old").degraded is None


def test_a_run_journaled_by_an_older_version_is_replayed_after_migrating(tmp_path):
    """A v3 process journaled a whole run (17 runs columns) and died; v4 opens the file, migrates, replays."""
    path = str(tmp_path / "j.duckdb")
    con = duckdb.connect(path)
    store_schema.create(con, version=3)
    started, ended = 1_700_000_000_000_000_000, 1_700_000_000_040_000_000
    old_row = ["jr", "legacy", "h", "ok", None, started, ended, '{"n": 0}', '{"n": 1}', None, None, None,
               "elsewhere", None, None, None, None]
    payload = {"run": old_row, "steps": [[1, "one", "one", "stage", 0, "ok", None, started, ended, None, None, []]],
               "reads": [], "writes": [[1, 1, "n", "set", "1"]], "decisions": [], "rows": []}
    con.execute("INSERT INTO step_journal VALUES ('jr', 0, 'run', ?)", [json.dumps(payload)])
    con.close()
    with Store(path) as store:
        [(status, ms, degraded)] = store.sql("SELECT status, duration_ms, degraded FROM runs").fetchall()
        assert (status, ms, degraded) == ("ok", 40.0, None)
        assert store.sql("SELECT duration_ms FROM steps").fetchall() == [(40.0,)]
        assert store.sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]
