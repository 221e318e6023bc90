"""The command line's gaps: `show` prints calls, prompts and logs in full on request; one
time format in every --json; `| head` exits quietly; `tracemem memory flag|forget|supersede` keeps the
memory_events trail; `sql --write` warns when it changes memories; `graph` takes a factory and writes a
picture; every option has help text. All against real store files and real subprocesses."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stages import AgentScope, assemble_prompt, call_model, recall
from stages.cli import main
from tracemem import Pipeline
from tracemem.cli import build_parser
from tracemem.models import ScriptedModel
from tracemem.store import Store

TRACEMEM = str(Path(sys.executable).with_name("tracemem"))
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
LONG_REPLY = "Here is a long answer. " * 20  # 460 characters: more than any cut
SUBJECT = "dana"


def note(scope: AgentScope, ctx) -> None:
    ctx.log("looked at the order history")
    ctx.log("second line " + "x" * 250)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> dict:
    path = str(tmp_path_factory.mktemp("gaps") / "agent.duckdb")
    flow = (Pipeline("support", AgentScope).then(recall()).then(note)
            .then(assemble_prompt(instructions="You are Acme's support agent.")).then(call_model()).build())
    with Store(path) as store:
        first = store.memory.remember(SUBJECT, "Dana is on the Pro plan", confidence=90)
        second = store.memory.remember(SUBJECT, "Dana's plan is Team", confidence=90)
        run = flow.run({"question": "Which plan am I on?"}, store=store, subject=SUBJECT,
                       env={"model": ScriptedModel(default=LONG_REPLY, name="long-talker")})
        for i in range(30):  # enough output for a pipe to fill
            flow.run({"question": f"question {i}"}, store=store, subject=SUBJECT,
                     env={"model": ScriptedModel(default="short", name="long-talker")})
    return {"path": path, "run": run.run_id, "prompt_id": run.output.prompt_id, "first": first.memory_id,
            "second": second.memory_id}


@pytest.fixture
def copy(db, tmp_path) -> str:
    target = str(tmp_path / "copy.duckdb")
    shutil.copyfile(db["path"], target)
    return target


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue(), capsys.readouterr().err


# -- show ----------------------------------------------------------------------------------------------

def test_show_hides_calls_prompts_and_logs_by_default_and_says_how_to_see_them(capsys, db):
    code, out, _ = cli(capsys, "show", db["run"][:8], "--db", db["path"])
    assert code == 0 and LONG_REPLY.strip() not in out and "looked at the order history" not in out
    assert "1 model call, 1 prompt (" in out and "2 log lines: see them with --calls, --prompts, --logs (or --full)" in out
    assert "(--full shows all" in out  # the long answer is cut, and says how to see it whole


def test_show_calls_prints_each_reply_whole(capsys, db):
    code, out, _ = cli(capsys, "show", db["run"][:8], "--db", db["path"], "--calls")
    calls = out.split("\nmodel calls\n")[1].split("\nfinal scope\n")[0]
    assert re.match(r"step 4 call_model: long-talker \(scripted\), \d+ → \d+ tokens, [\d.]+ ms, prompt ", calls)
    assert f"    {LONG_REPLY.strip()}" in calls and "\nprompts\n" not in out and "\nstep logs\n" not in out


def test_show_prompts_prints_every_section_with_its_source(capsys, db):
    code, out, _ = cli(capsys, "show", db["run"][:8], "--db", db["path"], "--prompts")
    prompts = out.split("\nprompts\n")[1].split("\nfinal scope\n")[0]
    assert prompts.startswith(f"prompt {db['prompt_id']} (step 3 assemble_prompt, ")
    assert "] instructions:\n    You are Acme's support agent." in prompts
    with Store(db["path"], read_only=True) as store:
        sections = store.sql("SELECT idx, kind, text, source_kind, source_id FROM prompt_sections WHERE prompt_id = ? "
                             "ORDER BY idx", [db["prompt_id"]]).fetchall()
    for idx, kind, text, source_kind, source_id in sections:
        assert f"  [{idx}] {kind}" in prompts  # every section, in full
        assert all(f"    {line}" in prompts for line in text.splitlines())
    memory_lines = [(idx, source_id) for idx, kind, _, source_kind, source_id in sections if kind == "memory"]
    assert {source_id for _, source_id in memory_lines} == {db["first"], db["second"]}
    for idx, memory_id in memory_lines:  # each memory line names the record it came from
        assert f"  [{idx}] memory ← memory {memory_id}:\n" in prompts


def test_show_logs_and_full(capsys, db):
    code, out, _ = cli(capsys, "show", db["run"][:8], "--db", db["path"], "--logs")
    assert "step 2 note:\n  looked at the order history\n  second line " + "x" * 250 in out
    code, full, _ = cli(capsys, "show", db["run"][:8], "--db", db["path"], "--full")
    for title in ("\nmodel calls\n", "\nprompts\n", "\nstep logs\n"):
        assert title in full
    assert f'answer: {json.dumps(LONG_REPLY)}' in full and "--full shows all" not in full
    assert "see them with --calls" not in full


# -- one time format in --json -------------------------------------------------------------------------

def test_runs_json_and_show_json_use_one_time_format(capsys, db):
    _, out, _ = cli(capsys, "runs", "--db", db["path"], "--json", "--limit", "100")
    listed = next(r for r in json.loads(out) if r["run_id"] == db["run"])
    _, out, _ = cli(capsys, "show", db["run"], "--db", db["path"], "--json")
    shown = json.loads(out)
    for when in (listed["started_at"], listed["ended_at"], shown["started_at"], shown["ended_at"]):
        assert isinstance(when, str) and ISO.fullmatch(when), when
    assert (listed["started_at"], listed["ended_at"]) == (shown["started_at"], shown["ended_at"])
    assert all(ISO.fullmatch(s["started_at"]) and ISO.fullmatch(s["ended_at"]) for s in shown["steps"])
    assert all(ISO.fullmatch(c["started_at"]) for c in shown["model_calls"])
    assert shown["model_calls"][0]["response"] == LONG_REPLY and shown["prompts"][0]["sections"]
    assert shown["duration_ms"] == pytest.approx(listed["duration_ms"], abs=1e-3) and shown["degraded"] is None
    _, out, _ = cli(capsys, "memories", "--db", db["path"], "--json")
    assert all(ISO.fullmatch(m["valid_from"]) for m in json.loads(out) if m["valid_from"])
    _, out, _ = cli(capsys, "sql", "SELECT started_at FROM runs LIMIT 1", "--db", db["path"], "--json")
    assert ISO.fullmatch(json.loads(out)[0]["started_at"])


# -- a reader that goes away ---------------------------------------------------------------------------

def test_a_closed_pipe_exits_quietly(db):
    for argv in (["runs", "--limit", "100"], ["show", db["run"], "--full"]):
        proc = subprocess.Popen([TRACEMEM, *argv, "--db", db["path"]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.close()  # the reader is gone before the first line is written
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0 and err == "", (argv, err)
    done = subprocess.run(f"'{TRACEMEM}' sql 'SELECT * FROM range(200000)' --db '{db['path']}' | head -1",
                          shell=True, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["range"] and done.stderr == ""


# -- memory flag | forget | supersede ------------------------------------------------------------------

def events(path: str, memory_id: str) -> list[tuple]:
    with Store(path, read_only=True) as store:
        return store.sql("SELECT event, reason, new FROM memory_events WHERE memory_id = ? ORDER BY event_id",
                         [memory_id]).fetchall()


def test_memory_flag_forget_and_supersede_keep_the_trail(capsys, db, copy):
    code, out, _ = cli(capsys, "memory", "flag", db["first"], "stale", "--reason", "moved to Team", "--db", copy)
    assert code == 0 and out.splitlines() == [
        f"memory {db['first']} ({SUBJECT}) 'Dana is on the Pro plan': stale",
        out.splitlines()[1]] and out.splitlines()[1].startswith("logged in memory_events as 'flag' (event ")
    assert events(copy, db["first"])[-1][:2] == ("flag", "moved to Team")
    code, out, _ = cli(capsys, "memory", "supersede", db["first"], db["second"], "--reason", "plan changed",
                       "--db", copy, "--json")
    data = json.loads(out)
    assert data["record"]["review_state"] == "contradicted" and data["record"]["superseded_by"] == db["second"]
    assert data["event"]["event"] == "supersede" and ISO.fullmatch(data["event"]["at"])
    assert events(copy, db["second"])[-1][0] == "supersedes"
    code, out, _ = cli(capsys, "memory", "forget", db["second"], "--reason", "asked to forget", "--db", copy)
    assert code == 0 and f"memory {db['second']} ({SUBJECT}) \"Dana's plan is Team\": forgotten" in out
    assert events(copy, db["second"])[-1][:2] == ("forget", "asked to forget")
    code, out, _ = cli(capsys, "memory", "history", db["first"], "--db", copy)
    assert [line.split()[1] for line in out.splitlines()[2:]] == ["remember", "flag", "supersede"]
    with Store(copy, read_only=True) as store:  # the records changed too, through the API
        assert store.memory.get(db["first"]).review_state == "contradicted"
        assert store.memory.get(db["second"]).forgotten


def test_memory_commands_refuse_bad_input_with_one_line(capsys, db, copy):
    code, _, err = cli(capsys, "memory", "flag", "m_nosuch", "stale", "--reason", "x", "--db", copy)
    assert code == 1 and err.startswith("tracemem: error: no memory 'm_nosuch'") and err.count("\n") == 1
    code, _, err = cli(capsys, "memory", "flag", db["first"], "wrong", "--reason", "x", "--db", copy)
    assert code == 1 and "state 'wrong' is not one of fresh, reviewed, stale, contradicted" in err
    with pytest.raises(SystemExit):  # a flag without a reason
        main(["memory", "flag", db["first"], "stale", "--db", copy])
    code, _, err = cli(capsys, "memory", "supersede", db["first"], db["first"], "--db", copy)
    assert code == 1 and "cannot supersede itself" in err


# -- sql --write on memories ---------------------------------------------------------------------------

def test_sql_write_warns_when_it_changes_memories(capsys, db, copy):
    code, _, err = cli(capsys, "sql", f"UPDATE memories SET confidence = 10 WHERE memory_id = '{db['first']}'",
                       "--write", "--db", copy)
    assert code == 0 and err.startswith("tracemem: warning: this SQL changed the memories table directly")
    assert "memory_events has no record" in err and "tracemem memory flag|forget|supersede" in err
    for quiet in ("UPDATE runs SET error = NULL WHERE false", "SELECT count(*) FROM memories",
                  "UPDATE memories SET confidence = 10 WHERE false"):
        code, _, err = cli(capsys, "sql", quiet, "--write", "--db", copy)
        assert code == 0 and err == "", (quiet, err)


# -- graph ---------------------------------------------------------------------------------------------

@pytest.fixture
def factory_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "gaps_flows.py").write_text(textwrap.dedent("""
        from pydantic import BaseModel
        from tracemem import Pipeline

        class S(BaseModel):
            n: int = 0

        def step(s): s.n += 1
        def route(s): return "again" if s.n < 3 else "done"
        def done(s): pass

        def make():
            return (Pipeline("counter", S).then(step).branch(route, {"again": "step", "done": done}).build())

        def make_pipeline():
            return Pipeline("plain", S).then(step)

        def needs(x):
            return make()

        flow = make()
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "gaps_flows"


def test_graph_takes_a_factory(capsys, factory_module):
    code, by_factory, _ = cli(capsys, "graph", f"{factory_module}:make")
    _, by_flow, _ = cli(capsys, "graph", f"{factory_module}:flow")
    assert code == 0 and by_factory == by_flow and by_factory.startswith("flowchart TD")
    code, out, _ = cli(capsys, "graph", f"{factory_module}:make_pipeline", "--json")
    assert code == 0 and json.loads(out)["hash"]
    code, _, err = cli(capsys, "graph", f"{factory_module}:needs")
    assert code == 1 and "takes arguments (x)" in err


def test_graph_out_writes_svg_html_and_mermaid_without_a_renderer(capsys, factory_module, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no mmdc anywhere
    code, out, _ = cli(capsys, "graph", f"{factory_module}:make", "--out", "g.svg")
    assert code == 0 and out.strip() == "wrote g.svg: drawn by tracemem (mmdc is not on PATH)"
    drawing = (tmp_path / "g.svg").read_text()
    assert drawing.startswith("<svg xmlns=") and drawing.rstrip().endswith("</svg>")
    for stage in ("step", "route", "done", "__start__", "__end__"):
        assert f">{stage}</text>" in drawing
    assert ">again</text>" in drawing and drawing.count("<path d=") >= 6  # edges, the jump back labelled
    code, out, _ = cli(capsys, "graph", f"{factory_module}:make", "--out", "g.html")
    page = (tmp_path / "g.html").read_text()
    assert code == 0 and page.startswith("<!DOCTYPE html>") and "<svg" in page and "flowchart TD" in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    code, _, _ = cli(capsys, "graph", f"{factory_module}:make", "--out", "g.mmd")
    assert (tmp_path / "g.mmd").read_text().startswith("flowchart TD")
    code, _, err = cli(capsys, "graph", f"{factory_module}:make", "--out", "g.png")
    assert code == 1 and "needs the Mermaid CLI (mmdc) on PATH" in err and not (tmp_path / "g.png").exists()
    code, _, err = cli(capsys, "graph", f"{factory_module}:make", "--out", "g.gif")
    assert code == 1 and "must end in .svg, .png, .html or .mmd" in err


def test_graph_out_hands_svg_and_png_to_mmdc_when_it_is_on_path(capsys, factory_module, tmp_path, monkeypatch):
    """Only our side of the contract: mmdc is called as `mmdc -i SOURCE.mmd -o FILE` with the flow's Mermaid.
    The stand-in copies its input, so the test can see what it was given; real rendering is mmdc's job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "mmdc"
    script.write_text(f"#!{sys.executable}\nimport shutil, sys\nargs = sys.argv[1:]\n"
                      "shutil.copyfile(args[args.index('-i') + 1], args[args.index('-o') + 1])\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    _, mermaid, _ = cli(capsys, "graph", f"{factory_module}:make")
    for name in ("m.svg", "m.png"):
        code, out, _ = cli(capsys, "graph", f"{factory_module}:make", "--out", name)
        assert code == 0 and out.strip() == f"wrote {name}: drawn by the Mermaid CLI (mmdc)"
        assert (tmp_path / name).read_text() == mermaid.rstrip("\n")


# -- help text -----------------------------------------------------------------------------------------

def parsers(parser, name="tracemem"):
    yield name, parser
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def test_every_option_and_argument_has_help_text():
    from stages.cli import main as _  # noqa: F401  (demo is added by the installed command)
    from tracemem.cli.app import ENGINE_COMMANDS

    seen = 0
    for name, parser in parsers(build_parser()):
        for action in parser._actions:
            if action.__class__.__name__ in ("_HelpAction", "_SubParsersAction"):
                continue
            seen += 1
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest} has no help"
    assert seen > 40 and {"memory", "graph", "show", "backtrack"} <= set(ENGINE_COMMANDS)
