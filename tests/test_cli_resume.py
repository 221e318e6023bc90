"""`tracemem runs --status paused`, `tracemem resume` and `tracemem fork` on a real store file."""
from __future__ import annotations

import io
import json
import sys
import textwrap

import pytest

from stages.cli import main
from tracemem.store import Store

FLOWS = '''
import json
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.models import ScriptedModel


class Refund(BaseModel):
    order: str = ""
    amount: float = 0.0
    approved: bool = False
    outcome: str = ""


def propose(s, ctx):
    s.amount = float(ctx.complete(ctx.env["model"], [{"role": "user", "content": f"refund {s.order}?"}]).text)


def approve(s, ctx):
    s.approved = ctx.interrupt({"order": s.order, "amount": s.amount})["approved"]


def pay(s):
    s.outcome = f"refunded {s.amount}" if s.approved else "declined"


flow = Pipeline("refund", Refund).then(propose).then(approve).then(pay)   # a Pipeline: the CLI builds it
MODEL = ScriptedModel(default="12.5")


def env():
    return {"model": MODEL}
'''


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture
def paused(tmp_path, monkeypatch):
    (tmp_path / "refunds.py").write_text(textwrap.dedent(FLOWS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("refunds", None)
    import refunds

    db = str(tmp_path / "r.duckdb")
    with Store(db) as store:
        run = refunds.flow.build().run({"order": "A-9"}, store=store, env=refunds.env())
    assert run.status == "paused"
    yield db, run.run_id, str(tmp_path / "refunds.py")
    sys.modules.pop("refunds", None)


def test_runs_lists_paused_runs_with_what_they_ask_and_show_says_it(paused):
    db, rid, _ = paused
    code, out = cli("runs", "--status", "paused", "--db", db)
    assert code == 0 and rid in out and "pending" in out and '"amount": 12.5' in out
    code, out = cli("runs", "--status", "paused", "--db", db, "--json")
    assert [(r["run_id"], r["pending"]) for r in json.loads(out)] == [(rid, {"order": "A-9", "amount": 12.5})]
    code, out = cli("show", rid[:8], "--db", db)
    assert code == 0 and 'asks: {"order": "A-9", "amount": 12.5}' in out and "paused" in out


def test_resume_answers_from_the_command_line_and_fork_tries_another_value(paused, capsys):
    db, rid, path = paused
    code, out = cli("resume", rid[:8], "--db", db, "--flow", "refunds:flow", "--env", "refunds:env",
                    "--answer", '{"approved": true}', "--by", "cli-user")
    assert code == 0, capsys.readouterr().err
    assert out.splitlines()[0] == f"run {rid}: ok"
    with Store(db) as store:
        assert store.run(rid).output.outcome == "refunded 12.5"
        assert store.sql("SELECT answered_by, answer FROM human_inputs").fetchall() == [("cli-user", '{"approved": true}')]
        assert store.sql("SELECT count(*) FROM model_calls WHERE NOT replayed").fetchall() == [(1,)]

    code, out = cli("fork", rid, "approve", "--db", db, "--flow", f"{path}:flow", "--set", "approved=false", "--json")
    assert code == 0, capsys.readouterr().err
    facts = json.loads(out)
    assert facts["status"] == "ok" and facts["output"]["outcome"] == "declined"
    assert facts["forked from"] == f"run {rid} after step 3"
    assert [c["path"] for c in facts["changes"]] == ["approved", "outcome"]
    with Store(db) as store:
        assert store.sql("SELECT forked_from_run_id, forked_from_step FROM runs WHERE run_id = ?",
                         [facts["run_id"]]).fetchall() == [(rid, 3)]


@pytest.mark.parametrize("argv,message", [
    (["--answer", "yes"], "--answer must be JSON: 'yes' is not (a string needs quotes"),
    (["--flow", "refunds:nothing"], "refunds has no attribute 'nothing'"),
    (["--flow", "no_such_module:flow"], "cannot import no_such_module"),
    (["--flow", "refunds"], "--flow takes MODULE:ATTR or FILE.py:ATTR"),
    (["--env", "refunds:Refund"], "gave a Refund, not a dict"),
])
def test_bad_arguments_fail_with_one_line(paused, capsys, argv, message):
    db, rid, _ = paused
    base = {"--flow": "refunds:flow", "--env": "refunds:env", "--answer": '{"approved": true}'}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    capsys.readouterr()
    code, _ = cli("resume", rid, "--db", db, *[x for kv in base.items() for x in kv])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and message in err, err


def test_resuming_a_finished_run_from_the_command_line_says_what_to_do(paused, capsys):
    db, rid, _ = paused
    assert cli("resume", rid, "--db", db, "--flow", "refunds:flow", "--env", "refunds:env",
               "--answer", '{"approved": false}')[0] == 0
    capsys.readouterr()
    code, _ = cli("resume", rid, "--db", db, "--flow", "refunds:flow", "--answer", '{"approved": true}')
    err = capsys.readouterr().err
    assert code == 1 and "is not paused or interrupted: it finished" in err and "flow.fork(" in err
    code, _ = cli("fork", rid, "x=1", "--db", db, "--flow", "refunds:flow", "--set", "oops")
    assert code == 1 and "--set takes PATH=JSON" in capsys.readouterr().err
