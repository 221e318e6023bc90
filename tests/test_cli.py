"""The `tracemem` command on a real store file: every command, --json, errors as one line."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from tracemem import Pipeline
from stages.cli import main  # the installed command: the engine CLI plus demo
from tracemem.cli import resolve_run
from tracemem.store import Store

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))


class Q(BaseModel):
    question: str = ""
    facts: list[str] = []
    answer: str = ""
    score: int = 0


class Sub(BaseModel):
    text: str = ""
    out: str = ""


def recall(s, ctx):
    ctx.emit("memory_uses", memory_id=ctx.env["memory_id"], outcome="injected", reason="confident")
    s.facts.append("ana likes ducks")


def rate(s):
    s.score = len(s.question)


def route(s):
    return "answer" if s.score < 100 else "refuse"


def answer(s):
    s.answer = f"{s.question} -> {s.facts[0]}"


def refuse(s):
    s.answer = "no"


def explode(s):
    raise ValueError("the model returned nonsense")


def upper(s):
    s.out = s.text.upper()


AGENT = Pipeline("agent", Q).then(recall).then(rate).branch(route, {"answer": answer, "refuse": refuse}).build()
FAILING = Pipeline("broken", Q).then(rate).then(explode).build()
SUBFLOW = (Pipeline("outer", Q).then(rate)
           .subflow(Pipeline("inner", Sub).then(upper).build(), inputs={"text": "question"}, outputs={"answer": "out"})
           .build())


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> dict:
    """A real store file: three agent runs, a failed run, a run with a subflow, two memories."""
    path = str(tmp_path_factory.mktemp("cli") / "agent.duckdb")
    with Store(path) as store:
        seed = store.memory.remember("ana", "ana likes ducks", confidence=90)
        env = {"memory_id": seed.memory_id}
        runs = [AGENT.run({"question": f"question {i}"}, store=store, subject="ana", env=env) for i in range(3)]
        failed = FAILING.run({"question": "q"}, store=store, raise_on_error=False)
        outer = SUBFLOW.run({"question": "quack"}, store=store)
        cited = store.memory.remember("ana", "ana lives by a pond", source_run_id=runs[0].run_id, source_step=1)
    return {"path": path, "runs": [r.run_id for r in runs], "failed": failed.run_id, "outer": outer.run_id,
            "child": outer.children[0].run_id, "seed": seed.memory_id, "cited": cited.memory_id}


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def fails(capsys, *argv: str) -> str:
    """The command exits non-zero with exactly one line on stderr and no traceback."""
    capsys.readouterr()
    code, out = cli(*argv)
    err = capsys.readouterr().err
    assert code == 1, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("tracemem: error: "), err
    assert "Traceback" not in err and out == ""
    return err.strip()


@pytest.fixture
def copy(db, tmp_path) -> str:
    """A private copy of the store for commands that change it."""
    target = str(tmp_path / "copy.duckdb")
    shutil.copyfile(db["path"], target)
    if os.path.exists(db["path"] + ".wal"):
        shutil.copyfile(db["path"] + ".wal", target + ".wal")
    return target


# -- runs ---------------------------------------------------------------------------------------


def test_runs_table_and_json(db):
    code, out = cli("runs", "--db", db["path"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["run_id", "pipeline", "kind", "status", "started_at", "duration_ms", "steps",
                                "subject", "error", "degraded"]
    for run_id in db["runs"] + [db["failed"], db["outer"]]:
        assert run_id in out
    assert db["child"] not in out  # subflow children are listed under their parent
    assert "failed" in out and f"stage 'explode' failed in run {db['failed']}" in out

    code, out = cli("runs", "--db", db["path"], "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 5
    assert rows[0]["run_id"] == db["outer"] and rows[-1]["run_id"] == db["runs"][0]  # newest first
    assert {r["pipeline"] for r in rows} == {"agent", "broken", "outer"}

    _, out = cli("runs", "--db", db["path"], "--json", "--pipeline", "agent", "--limit", "2")
    assert [r["run_id"] for r in json.loads(out)] == db["runs"][::-1][:2]
    _, out = cli("runs", "--json", "--db", db["path"], "--status", "failed")  # --json before or after --db
    assert [r["run_id"] for r in json.loads(out)] == [db["failed"]]
    _, out = cli("--db", db["path"], "runs", "--subject", "nobody")  # global --db before the command
    assert "(no rows)" in out


def test_default_db_from_environment(db, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEMEM_DB", db["path"])
    code, out = cli("runs", "--json")
    assert code == 0 and len(json.loads(out)) == 5
    monkeypatch.delenv("TRACEMEM_DB")
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(db["path"], tmp_path / "tracemem.duckdb")
    code, out = cli("runs", "--json")
    assert code == 0 and len(json.loads(out)) == 5


# -- show ---------------------------------------------------------------------------------------


def test_show_by_prefix_text_and_json(db):
    run_id = db["runs"][1]
    code, out = cli("show", run_id[:8], "--db", db["path"])
    assert code == 0
    assert out.startswith(f"run {run_id}  pipeline agent (")
    assert "status ok" in out and "subject: ana" in out and "duration:" in out
    steps = out.split("\nsteps\n")[1].split("\n\n")[0].splitlines()
    assert steps[0].split()[:6] == ["step", "stage", "kind", "iter", "status", "ms"]
    assert [line.split()[1] for line in steps[2:]] == ["recall", "rate", "route", "answer"]
    assert "decisions" in out and "answer" in out.split("\ndecisions\n")[1]
    final = out.split("\nfinal scope\n")[1]
    assert 'answer: "question 1 -> ana likes ducks"' in final and "score: 10" in final

    code, out = cli("show", run_id, "--db", db["path"], "--json")
    data = json.loads(out)
    assert code == 0 and data["run_id"] == run_id and data["status"] == "ok" and data["subject"] == "ana"
    assert [s["stage"] for s in data["steps"]] == ["recall", "rate", "route", "answer"]
    assert all(s["status"] == "ok" and s["ended_at"] >= s["started_at"] for s in data["steps"])
    assert data["decisions"] == [{"step": 3, "chosen": "answer", "evidence": {"returned": "answer"}}]
    assert data["output"]["answer"] == "question 1 -> ana likes ducks"
    assert data["final_state"]["facts"] == ["ana likes ducks"]


def test_show_failed_run_and_subflow(db):
    code, out = cli("show", db["failed"], "--db", db["path"])
    assert code == 0 and "status failed" in out and "error: stage 'explode'" in out
    assert "failed" in out.split("\nsteps\n")[1]
    code, out = cli("show", db["outer"], "--db", db["path"], "--json")
    data = json.loads(out)
    assert data["steps"][1]["kind"] == "subflow" and data["steps"][1]["child_run_id"] == db["child"]
    code, out = cli("show", db["child"], "--db", db["path"])
    assert code == 0 and f"parent run: {db['outer']}" in out


# -- backtrack ------------------------------------------------------------------------------------


def test_backtrack_text_only_json_mermaid(db):
    run_id = db["runs"][2]
    code, out = cli("backtrack", run_id[:10], "answer", "--db", db["path"])
    assert code == 0
    assert out.startswith('answer = question 2 -> ana likes ducks')
    assert "decider route chose 'answer'" in out and "run input" in out
    assert "memory" in out and "ana likes ducks" in out

    code, only = cli("backtrack", run_id, "answer", "--only", "memory", "--db", db["path"])
    assert code == 0 and "ana likes ducks" in only and len(only.splitlines()) < len(out.splitlines())
    assert "decider route" not in only
    code, none = cli("backtrack", run_id, "answer", "--only", "model_call", "--db", db["path"])
    assert code == 0 and "no model_call node on this trace" in none

    code, out = cli("backtrack", run_id, "answer", "--db", db["path"], "--json")
    data = json.loads(out)
    assert code == 0 and data["run_id"] == run_id and data["path"] == "answer" and data["missing"] is None
    kinds = {n["kind"] for n in data["nodes"]}
    assert {"write", "input", "decision", "memory"} <= kinds
    code, out = cli("backtrack", run_id, "answer", "--db", db["path"], "--json", "--only", "memory")
    only = json.loads(out)
    assert code == 0 and "memory" in {n["kind"] for n in only["nodes"]}
    assert "decision" not in {n["kind"] for n in only["nodes"]}
    assert {e["to"] for e in only["edges"]} <= {n["id"] for n in only["nodes"]}

    code, out = cli("backtrack", run_id, "answer", "--db", db["path"], "--mermaid")
    assert code == 0 and out.startswith("flowchart BT")

    code, out = cli("backtrack", run_id, "question", "--db", db["path"])  # a field no stage wrote: the input
    assert code == 0 and "never written" in out


# -- sql --------------------------------------------------------------------------------------------


def test_sql_read_only_table_and_json(db, capsys):
    code, out = cli("sql", "SELECT stage, count(*) AS n FROM steps GROUP BY stage ORDER BY stage", "--db", db["path"])
    assert code == 0 and out.splitlines()[0].split() == ["stage", "n"] and "recall" in out
    code, out = cli("sql", "SELECT pipeline, status FROM runs WHERE run_id = ?".replace("?", f"'{db['failed']}'"),
                    "--db", db["path"], "--json")
    assert json.loads(out) == [{"pipeline": "broken", "status": "failed"}]
    err = fails(capsys, "sql", "DELETE FROM runs", "--db", db["path"])
    assert "read-only" in err and "--write" in err
    code, out = cli("sql", "SELECT count(*) AS n FROM runs", "--db", db["path"], "--json")
    assert json.loads(out) == [{"n": 6}]  # nothing deleted


def test_sql_write_changes_the_store(copy):
    code, out = cli("sql", "DELETE FROM memories WHERE text LIKE '%pond%'", "--db", copy, "--write")
    assert code == 0
    code, out = cli("sql", "SELECT count(*) AS n FROM memories", "--db", copy, "--json")
    assert json.loads(out) == [{"n": 1}]


# -- memories -----------------------------------------------------------------------------------------


def test_memories_table_and_json(db):
    code, out = cli("memories", "--db", db["path"])
    assert code == 0 and "ana likes ducks" in out and "ana lives by a pond" in out
    code, out = cli("memories", "--db", db["path"], "--json", "--subject", "ana")
    rows = json.loads(out)
    assert [r["memory_id"] for r in rows] == [db["seed"], db["cited"]]
    assert rows[1]["source_run_id"] == db["runs"][0] and rows[0]["confidence"] == 90
    code, out = cli("memories", "--db", db["path"], "--json", "--subject", "bo")
    assert json.loads(out) == []


# -- prune -------------------------------------------------------------------------------------------


def test_prune_dry_run_then_for_real(copy, db, capsys):
    code, out = cli("prune", "--keep-last", "1", "--dry-run", "--db", copy, "--json")
    report = json.loads(out)
    assert code == 0 and report["dry_run"] is True
    expected = {db["runs"][1], db["runs"][2], db["failed"]}
    assert set(report["runs"]) == expected and report["kept_cited"] == [db["runs"][0]]
    assert report["rows"]["runs"] == 3 and report["rows"]["steps"] == 4 + 4 + 2
    _, listing = cli("runs", "--db", copy, "--json")
    assert len(json.loads(listing)) == 5  # nothing removed

    code, out = cli("prune", "--keep-last", "1", "--db", copy)
    assert code == 0 and out.startswith("removed 3 run(s) (") and "kept 1 run(s) that memories cite" in out
    _, listing = cli("runs", "--db", copy, "--json")
    assert {r["run_id"] for r in json.loads(listing)} == {db["outer"], db["runs"][0]}
    _, mems = cli("memories", "--db", copy, "--json")
    assert len(json.loads(mems)) == 2

    code, out = cli("prune", "--older-than", "0", "--db", copy, "--json")  # older than now: all but the cited
    assert code == 0 and set(json.loads(out)["runs"]) == {db["outer"], db["child"]}
    code, out = cli("prune", "--older-than", "2000-01-01", "--db", copy)
    assert code == 0 and out.strip() == "removed 0 run(s)"
    assert "needs --older-than" in fails(capsys, "prune", "--db", copy)
    assert "--older-than takes days" in fails(capsys, "prune", "--older-than", "last tuesday", "--db", copy)


def test_prune_older_than_uses_utc_like_the_store(db, tmp_path):
    """Run times are stored in UTC; --older-than DAYS must not depend on the local time zone."""
    path = str(tmp_path / "tz.duckdb")
    shutil.copyfile(db["path"], path)
    for tz, days, expect_all in (("Asia/Tokyo", "0.01", False), ("America/New_York", "0", True)):
        proc = subprocess.run([TRACEMEM, "prune", "--older-than", days, "--dry-run", "--json", "--db", path],
                              capture_output=True, text=True, env={**os.environ, "TZ": tz}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        runs = json.loads(proc.stdout)["runs"]
        assert (len(runs) == 6 - 1) if expect_all else runs == [], (tz, runs)


# -- export ---------------------------------------------------------------------------------------------


def test_export_parquet(db, tmp_path):
    target = tmp_path / "parquet"
    code, out = cli("export", str(target), "--db", db["path"])
    assert code == 0 and f"Parquet files to {target}" in out
    files = {p.stem for p in target.glob("*.parquet")}
    assert {"runs", "steps", "writes", "reads", "decisions", "model_calls", "prompt_sections", "memories",
            "memory_events", "memory_uses"} <= files
    assert pq.read_table(target / "runs.parquet").num_rows == 6
    assert pq.read_table(target / "memory_uses.parquet").num_rows == 3
    code, out = cli("export", str(tmp_path / "again"), "--db", db["path"], "--json")
    counts = json.loads(out)
    assert counts["runs"] == 6 and counts["memories"] == 2 and set(counts) == files


# -- graph ----------------------------------------------------------------------------------------------


def test_graph_of_a_module_flow(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_graph_demo_mod.py").write_text(textwrap.dedent("""
        from pydantic import BaseModel
        from tracemem import Pipeline

        class S(BaseModel):
            x: int = 0

        def think(s):
            s.x = 1

        def act(s):
            s.x = 2

        def route(s):
            return "act" if s.x else "stop"

        def stop(s):
            pass

        builder = Pipeline("demo", S).then(think).branch(route, {"act": act, "stop": stop})
        flow = builder.build()
        number = 42
    """))
    monkeypatch.chdir(tmp_path)
    code, out = cli("graph", "cli_graph_demo_mod:flow")
    assert code == 0 and out.startswith(("flowchart", "graph"))
    for name in ("think", "route", "act", "stop"):
        assert name in out
    code, built = cli("graph", "cli_graph_demo_mod:builder")  # an unbuilt Pipeline works too
    assert code == 0 and built == out
    code, out = cli("graph", "cli_graph_demo_mod:flow", "--json")
    spec = json.loads(out)
    assert code == 0 and spec["hash"] and "think" in json.dumps(spec)
    assert "MODULE:ATTR" in fails(capsys, "graph", "cli_graph_demo_mod")
    assert "cannot import no_such_module_xyz" in fails(capsys, "graph", "no_such_module_xyz:flow")
    assert "has no attribute 'nope'" in fails(capsys, "graph", "cli_graph_demo_mod:nope")
    assert "not a flow" in fails(capsys, "graph", "cli_graph_demo_mod:number")
    (tmp_path / "cli_graph_broken_mod.py").write_text("def oops(:\n")
    assert "cannot import cli_graph_broken_mod" in fails(capsys, "graph", "cli_graph_broken_mod:flow")
    (tmp_path / "cli_graph_raising_mod.py").write_text("raise RuntimeError('no config')\n")
    assert "no config" in fails(capsys, "graph", "cli_graph_raising_mod:flow")


# -- errors ----------------------------------------------------------------------------------------------


def test_errors_are_one_line_and_exit_nonzero(db, capsys, tmp_path):
    assert "no run 'zzzz'" in fails(capsys, "show", "zzzz", "--db", db["path"])
    assert "no run 'zzzz'" in fails(capsys, "backtrack", "zzzz", "answer", "--db", db["path"])
    err = fails(capsys, "sql", "SELEKT * FROM runs", "--db", db["path"])
    assert "SQL error" in err and "SELEKT" in err
    assert "SQL error" in fails(capsys, "sql", "SELECT * FROM no_such_table", "--db", db["path"])
    missing = str(tmp_path / "missing.duckdb")
    for argv in (["runs"], ["show", "abc"], ["sql", "SELECT 1"], ["memories"], ["export", str(tmp_path / "x")],
                 ["prune", "--keep-last", "1"], ["sql", "SELECT 1", "--write"]):
        assert "no tracemem store at" in fails(capsys, *argv, "--db", missing), argv
    assert not os.path.exists(missing)  # a typo'd path is never created
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("hello\n" * 1000)
    assert "cannot open" in fails(capsys, "runs", "--db", str(foreign))


def test_ambiguous_prefix(db):
    with Store(db["path"], read_only=True) as store:
        with pytest.raises(Exception, match="ambiguous"):
            resolve_run(store, "")
        assert resolve_run(store, db["failed"]) == db["failed"]


# -- the installed command --------------------------------------------------------------------------------


def test_installed_command(db, tmp_path):
    proc = subprocess.run([TRACEMEM, "runs", "--db", db["path"], "--json"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) == 5
    proc = subprocess.run([TRACEMEM, "show", db["runs"][0][:8], "--db", db["path"]], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and f"run {db['runs'][0]}" in proc.stdout
    proc = subprocess.run([TRACEMEM, "runs", "--db", str(tmp_path / "nope.duckdb")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tracemem: error: no tracemem store at")
    proc = subprocess.run([TRACEMEM, "sql", "SELECT nonsense(", "--db", db["path"]], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_cli_reads_a_snapshot_of_a_file_another_process_writes(db, tmp_path):
    path, ready = str(tmp_path / "held.duckdb"), str(tmp_path / "ready")
    shutil.copyfile(db["path"], path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from tracemem.store import Store
        store = Store({path!r})
        open({ready!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ready) or not open(ready).read():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc = subprocess.run([TRACEMEM, "runs", "--db", path, "--json"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and len(json.loads(proc.stdout)) == 5
        assert f"locked by process {holder.pid}; reading a copy" in proc.stderr
        proc = subprocess.run([TRACEMEM, "sql", "DELETE FROM runs", "--write", "--db", path], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1 and f"process {holder.pid}" in proc.stderr and proc.stderr.count("\n") == 1
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_demo_then_influence_ranks_the_planted_memory_first(tmp_path):
    """`tracemem demo` leaves a file whose wrong answer `backtrack --influence` pins on the bad memory."""
    path = str(tmp_path / "demo.duckdb")
    code, out = cli("demo", "--db", path, "--fresh")
    assert code == 0 and "answer now: I'm sorry: refunds are possible within 30 days" in out
    runs = json.loads(cli("runs", "--db", path, "--json")[1])
    wrong = runs[1]["run_id"]  # newest first: the rerun, then the wrong answer
    code, out = cli("backtrack", wrong, "answer", "--influence", "--db", path)
    assert code == 0 and "correlational" in out
    assert "refund window is 365 days" in out.splitlines()[3]
    code, out = cli("backtrack", wrong, "answer", "--influence", "--json", "--db", path)
    ranked = json.loads(out)
    assert ranked[0]["section"] == "memory" and "365 days" in ranked[0]["text"]
    assert ranked == sorted(ranked, key=lambda r: -r["score"])
