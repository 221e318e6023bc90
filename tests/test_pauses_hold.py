"""Pauses that hold: a declared answer shape, forks that pause and resume, what waits for a person, prune.

A bad answer (wrong type, missing field, None, a bare word) is refused before anything is committed and the
run stays paused; a fork or a counterfactual that pauses is marked as such and resumes like any run, also in
another process and from the exact command `tracemem fork` prints; prune keeps work in flight.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest

from stages.cli import main
from tracemem import AnswerError, Pipeline, PerTurn, ResumeError
from tracemem.errors import RunNotFoundError
from tracemem.flow.events import RunPaused
from tracemem.store import Store

FLOWS = '''
from typing import Annotated
from pydantic import BaseModel
from tracemem import Pipeline, PerTurn


class Approval(BaseModel):
    approved: bool
    note: str = ""


class Refund(BaseModel):
    order: str = ""
    note: str = ""
    approved: bool = False
    outcome: str = ""
    requests: Annotated[list[str], PerTurn] = []


def new_turn(s):
    s.requests.append(s.order)
    s.note = "turn for " + s.order


def recall(s):
    s.note += " +recalled"


def approve(s, ctx):
    answer = ctx.interrupt({"order": s.order, "note": s.note}, expect=Approval)
    s.approved = answer.approved


def pay(s):
    s.outcome = f"{s.note}: {'refunded' if s.approved else 'declined'} ({len(s.requests)} request(s))"


flow = Pipeline("refund", Refund).then(new_turn).then(recall).then(approve).then(pay).build()
before = Pipeline("gate", Refund).then(recall).then(pay, pause_before=True, expect=Approval).build()
'''


@pytest.fixture
def flows(tmp_path, monkeypatch):
    (tmp_path / "refund_flows.py").write_text(textwrap.dedent(FLOWS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("refund_flows", None)
    import refund_flows

    yield refund_flows, tmp_path
    sys.modules.pop("refund_flows", None)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def in_another_process(tmp_path, code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("bad", ["yes", {"approved": "x"}, {"nope": 1}, None])
def test_a_bad_answer_is_refused_and_the_run_stays_paused_until_a_good_one(flows, bad):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        run = mod.flow.run({"order": "A-1"}, store=store)
        assert run.status == "paused" and run.resume_at["expect"] == "refund_flows:Approval"
        with pytest.raises(AnswerError, match="expects an answer of type Approval.*still paused"):
            mod.flow.resume(run.run_id, bad, store=store)
        again = store.run(run.run_id)
        assert again.status == "paused" and [s.status for s in again.steps] == ["ok", "ok", "paused"]
        assert not again.rows.get("human_inputs")  # nothing was committed for the refused answer
        done = mod.flow.resume(run.run_id[:8], {"approved": True}, store=store, by="maria")  # an id prefix
        assert done.status == "ok" and done.output.outcome == "turn for A-1 +recalled: refunded (1 request(s))"
        assert json.loads(store.run(run.run_id).rows["human_inputs"][0]["answer"]) == {"approved": True}


def test_a_pause_before_point_checks_its_answer_and_hands_the_stage_a_model(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        run = mod.before.run({"order": "B-2"}, store=store)
        assert run.status == "paused" and run.resume_at == {"stage": "pay", "kind": "before", "step": None,
                                                            "pc": 1, "expect": "refund_flows:Approval"}
        with pytest.raises(AnswerError):
            mod.before.resume(run.run_id, {"approved": [1]}, store=store)
        assert mod.before.resume(run.run_id, {"approved": False}, store=store).status == "ok"


def test_expect_must_be_importable_so_another_process_can_check(flows):
    from pydantic import BaseModel

    class Local(BaseModel):
        ok: bool

    from tracemem import PipelineError, TracememError

    with pytest.raises((PipelineError, TracememError), match="module level"):
        Pipeline("x", flows[0].Refund).then(lambda s: None, pause_before=True, expect=Local)
    with pytest.raises(PipelineError, match="pause_before"):
        Pipeline("x", flows[0].Refund).then(lambda s: None, expect=flows[0].Approval)


def test_a_bad_answer_in_another_process_and_from_the_cli_leaves_the_run_paused(flows):
    mod, tmp = flows
    db = str(tmp / "r.duckdb")
    with Store(db) as store:
        rid = mod.flow.run({"order": "C-3"}, store=store).run_id
    code, out = cli("resume", rid[:8], "--flow", "refund_flows:flow", "--answer", '"yes"', "--db", db)
    assert code != 0
    out = in_another_process(tmp, f'''
        import refund_flows
        from tracemem import AnswerError
        from tracemem.store import Store
        with Store({db!r}) as store:
            try:
                refund_flows.flow.resume({rid!r}, {{"approved": "x"}}, store=store)
            except AnswerError as err:
                print("refused", store.run({rid!r}).status)
            print(refund_flows.flow.resume({rid!r}, {{"approved": True}}, store=store).status)
        ''')
    assert out.split() == ["refused", "paused", "ok"]


def test_a_fork_that_pauses_is_marked_and_resumes_in_another_process_and_from_the_printed_command(flows):
    mod, tmp = flows
    db = str(tmp / "r.duckdb")
    with Store(db) as store:
        original = mod.flow.run({"order": "D-4"}, store=store)
        fork = mod.flow.fork(original, "recall", edits={"note": "edited"}, store=store)
        assert fork.status == "paused" and fork.kind == "fork"
        paused = store.runs(status="paused")
        assert {(r["run_id"], r["kind"]) for r in paused} == {(original.run_id, "run"), (fork.run_id, "fork")}
    out = in_another_process(tmp, f'''
        import refund_flows
        from tracemem.store import Store
        with Store({db!r}) as store:
            run = refund_flows.flow.resume({fork.run_id!r}, {{"approved": True}}, store=store)
            print(run.status, "|", run.output.outcome, "|", store.run(run.run_id).kind)
        ''')
    assert out.strip() == "ok | edited: refunded (1 request(s)) | fork"
    # the CLI's fork prints the command that continues it; that exact command works
    code, out = cli("fork", original.run_id[:8], "recall", "--set", 'note="from the cli"', "--flow",
                    "refund_flows:flow", "--db", db)
    assert code == 0, out
    command = next(line.strip() for line in out.splitlines() if line.strip().startswith("answer it: "))
    argv = command.removeprefix("answer it: tracemem ").replace("JSON", '{"approved": false}').split(" ")
    argv = [a.strip("'") for a in argv[:argv.index("--answer") + 1]] + ['{"approved": false}', "--db", db]
    code, out = cli(*argv)
    assert code == 0 and "run " in out and ": ok" in out, out
    with Store(db, read_only=True) as store:
        forks = [r for r in store.runs(limit=10) if r["kind"] == "fork"]
        assert {r["status"] for r in forks} == {"ok"}


def test_counterfactuals_are_marked_and_never_listed_as_waiting_for_a_person(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        original = mod.flow.run({"order": "E-5"}, store=store)
        cf = mod.flow.fork(original, "new_turn", store=store, replay=True, without=["memory:m_x"],
                           counterfactual={"without": ["memory:m_x"], "of_run": original.run_id})
        replay = mod.flow.fork(original, "new_turn", store=store, replay=True)
        assert (cf.kind, cf.status, replay.kind) == ("counterfactual", "paused", "replay")
        waiting = {r["run_id"] for r in store.runs(status="paused")}
        assert cf.run_id not in waiting and {original.run_id, replay.run_id} <= waiting
        assert [r["run_id"] for r in store.runs(status="paused", kind="counterfactual")] == [cf.run_id]
        code, out = cli("runs", "--status", "paused", "--db", store.path)
    assert f"replay of {original.run_id[:8]}@1" in out and cf.run_id not in out


def test_prune_keeps_paused_runs_unless_forced_and_a_pruned_run_says_so(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        paused = mod.flow.run({"order": "F-6"}, store=store)
        done = mod.flow.resume(mod.flow.run({"order": "F-7"}, store=store), {"approved": True}, store=store)
        report = store.prune(keep_last=0)
        assert report.runs == [done.run_id] and "paused" in report.kept_why[paused.run_id]
        assert store.run(paused.run_id).status == "paused"
        store.prune(keep_last=0, force=True)
        with pytest.raises(RunNotFoundError, match="was pruned"):
            mod.flow.resume(paused.run_id, {"approved": True}, store=store)
        with pytest.raises(RunNotFoundError, match="ambiguous|no run"):
            store.run("")


def test_a_streamed_run_that_pauses_ends_with_a_paused_event(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        events = list(mod.flow.stream({"order": "G-8"}, store=store))
    last = events[-1]
    assert isinstance(last, RunPaused) and last.stage == "approve" and last.expect == "refund_flows:Approval"
    assert last.pending == {"order": "G-8", "note": "turn for G-8 +recalled"}


def test_per_turn_fields_start_afresh_in_a_thread_and_replay_agrees(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        first = mod.flow.resume(mod.flow.run({"order": "H-1"}, store=store), {"approved": True}, store=store)
        second = mod.flow.run({"order": "H-2"}, store=store, resume=first)
        second = mod.flow.resume(second, {"approved": True}, store=store)
        assert second.output.requests == ["H-2"] and second.output.outcome.endswith("(1 request(s))")
        assert store.run(second.run_id).state_at().requests == ["H-2"]  # the record says the same
        assert json.loads(store.run(second.run_id).input_json)["requests"] == []  # recorded as the turn's input
    assert mod.Refund.model_fields["requests"].metadata == [PerTurn]


def test_resuming_an_unknown_or_ambiguous_prefix_says_so(flows):
    mod, tmp = flows
    with Store(str(tmp / "r.duckdb")) as store:
        with pytest.raises(RunNotFoundError, match="a full run id or a unique prefix"):
            mod.flow.resume("zzzz", {"approved": True}, store=store)
        with pytest.raises(ResumeError, match="needs store"):
            mod.flow.resume("zzzz", {"approved": True})
