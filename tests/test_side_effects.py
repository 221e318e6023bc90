"""Side effects happen once: a counting sink (a file every effect appends a line to) shows that a counterfactual,
a `replay=True` fork and a resume after a pause repeat no effect unless asked (`live_effects=True`: exactly one
more), that a crash between an effect and its record hands the resume the same idempotency key, and that a tool
approval runs only the approved call.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import effect_flows as fx
from tracemem.store import Store

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def sink(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFECTS_FILE", str(tmp_path / "effects.txt"))
    monkeypatch.delenv("CRASH_AFTER_EFFECT", raising=False)
    return tmp_path


def remembered(store: Store) -> tuple[str, str]:
    """Dana's memories: one that decides the mail's text, one decoy."""
    planted = store.memory.remember("dana", "Dana's refund window is 365 days", confidence=80).memory_id
    decoy = store.memory.remember("dana", "Dana likes the color teal", confidence=80).memory_id
    return planted, decoy


def second_process(tmp, *argv: str, crash: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE] + sys.path)}
    if crash:
        env["CRASH_AFTER_EFFECT"] = "1"
    return subprocess.run([sys.executable, os.path.join(HERE, "effect_flows.py"), *argv], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_replaying_fork_repeats_no_effect_unless_asked_and_then_exactly_one(sink):
    with Store(str(sink / "s.duckdb")) as store:
        remembered(store)
        run = fx.mail_flow.run({"question": "refund?"}, store=store, subject="dana", env=fx.env("mail"))
        assert run.status == "ok" and len(fx.effects()) == 1
        again = fx.mail_flow.fork(run, 0, store=store, env=fx.env("mail"), replay=True)
        assert again.status == "ok" and again.output.answer == run.output.answer and len(fx.effects()) == 1
        assert [(e["name"], e["mode"], e["source_run_id"]) for e in again.rows["effects"]] == \
            [("send_mail", "replayed", run.run_id)]
        live = fx.mail_flow.fork(run, 0, store=store, env=fx.env("mail"), replay=True, live_effects=True)
        assert live.status == "ok" and len(fx.effects()) == 2 and live.rows["effects"][0]["mode"] == "live"
        keys = [key for _, key in fx.effects()]
        assert keys[0] != keys[1] and keys[1].startswith(live.run_id)  # a new run, a new key


def test_a_counterfactual_repeats_no_effect_and_stops_where_it_would_make_a_new_one(sink):
    with Store(str(sink / "s.duckdb")) as store:
        planted, decoy = remembered(store)
        run = fx.mail_flow.run({"question": "Dana: refund window? favourite color?"}, store=store, subject="dana",
                               env=fx.env("mail"))
        assert {m["memory_id"] for m in run.output.memories} == {planted, decoy}
        assert fx.effects()[0][0] == "mail dana: your window is 365 days"
        same = run.backtrack("answer").counterfactual(decoy, flow=fx.mail_flow, env=fx.env("mail"), store=store)
        assert same.outcome == "ok" and not same.changed and len(fx.effects()) == 1  # the mail was replayed
        changed = run.backtrack("answer").counterfactual(planted, flow=fx.mail_flow, env=fx.env("mail"), store=store)
        assert changed.outcome == "paused" and changed.paused_at == "tools" and len(fx.effects()) == 1
        assert "stopped at stage 'tools'" in str(changed)
        stopped = store.run(changed.run_id)
        assert stopped.kind == "counterfactual" and stopped.pending["effect"] == "send_mail"
        assert changed.run_id not in {r["run_id"] for r in store.runs(status="paused")}
        made = fx.mail_flow.resume(changed.run_id, store=store, env=fx.env("mail"), live_effects=True)
        assert made.status == "ok" and fx.effects()[1][0] == "mail dana: your window is 30 days"
        assert len(fx.effects()) == 2


def test_an_effect_stage_is_replayed_when_it_reads_the_same_and_withheld_when_not(sink):
    with Store(str(sink / "s.duckdb")) as store:
        run = fx.pay_flow.run({"question": "pay", "order": "A-1"}, store=store, subject="dana", env=fx.env("mail"))
        assert run.output.receipt == "paid A-1" and [w for w, _ in fx.effects()] == ["pay A-1"]
        again = fx.pay_flow.fork(run, 0, store=store, env=fx.env("mail"), replay=True)
        assert again.output.receipt == "paid A-1" and len(fx.effects()) == 1
        assert [e["mode"] for e in again.rows["effects"] if e["kind"] == "stage"] == ["replayed"]
        assert any("not run again" in line for s in again.steps for line in s.logs)
        other = fx.pay_flow.fork(run, 0, edits={"order": "B-2"}, store=store, env=fx.env("mail"), replay=True)
        assert other.status == "paused" and other.resume_at["kind"] == "effect" and len(fx.effects()) == 1
        paid = fx.pay_flow.resume(other.run_id, store=store, env=fx.env("mail"), live_effects=True)
        assert paid.output.receipt == "paid B-2" and [w for w, _ in fx.effects()] == ["pay A-1", "pay B-2"]


def test_a_resume_replays_what_the_paused_tool_step_made_and_makes_only_what_is_new(sink):
    with Store(str(sink / "s.duckdb")) as store:
        run = fx.asking_flow.run({"question": "mail them"}, store=store, subject="dana", env=fx.env("asking"))
        assert run.status == "paused" and run.pending == {"send to": "sam"}
        assert [w for w, _ in fx.effects()] == ["mail dana: hello"]  # made before the pause
        done = fx.asking_flow.resume(run.run_id, True, store=store, env=fx.env("asking"))
        assert done.status == "ok" and [w for w, _ in fx.effects()] == ["mail dana: hello", "asked mail sam"]
        modes = [(e["name"], e["mode"]) for e in done.rows["effects"]]
        assert modes == [("send_mail", "live"), ("send_mail", "replayed"), ("ask_and_mail", "live")]
        assert "sent" in done.output.answer


def test_a_crash_after_the_tool_ran_hands_the_resume_the_same_idempotency_key(sink):
    db = str(sink / "s.duckdb")
    with Store(db) as store:
        run = fx.refund_flow.run({"question": "refund both"}, store=store, subject="dana", env=fx.env("refund"),
                                 durability="stage")
        assert run.status == "paused"
    crashed = second_process(sink, "refund", db, run.run_id, json.dumps({"r1": True, "r2": False}), crash=True)
    assert crashed.returncode == -9  # SIGKILL right after the refund, before its step was recorded
    assert len(fx.effects()) == 1
    with Store(db) as store:
        assert store.run(run.run_id).status in ("running", "interrupted")
        done = fx.refund_flow.resume(run.run_id, store=store, env=fx.env("refund"))
        assert done.status == "ok"
    (first, key1), (again, key2) = fx.effects()
    assert first == again == "refund A-1 30.0" and key1 == key2  # at-least-once, with the key an API can refuse


def test_an_approval_runs_only_the_approved_call_in_a_second_process_and_backtrack_names_the_decision(sink):
    db = str(sink / "s.duckdb")
    with Store(db) as store:
        run = fx.refund_flow.run({"question": "refund both"}, store=store, subject="dana", env=fx.env("refund"))
        assert run.status == "paused" and [c["id"] for c in run.pending["tool_calls"]] == ["r1", "r2"]
        assert run.resume_at["expect"] == "tracemem.tools.approval:ToolApprovals" and fx.effects() == []
    answer = {"r1": True, "r2": {"approved": False, "message": "over 50 EUR needs a manager"}}
    done = second_process(sink, "refund", db, run.run_id, json.dumps(answer))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "ok" and report["model_calls"] == 1  # only the next turn of the loop
    assert [w for w, _ in fx.effects()] == ["refund A-1 30.0"]
    assert "over 50 EUR needs a manager" in report["answer"] and "refunded 30.0" in report["answer"]
    with Store(db, read_only=True) as store:
        final = store.run(run.run_id)
        trace = final.backtrack("answer")
        human = trace.sources("human_input")
        assert human and human[0]["by"] == "maria" and human[0]["answer"]["r2"]["approved"] is False
        assert {r["call_id"]: r.get("error_kind") for r in final.rows["tool_calls"]} == {"r2": "rejected", "r1": None}


def test_a_bad_approval_leaves_the_run_paused(sink):
    from tracemem import AnswerError

    with Store(str(sink / "s.duckdb")) as store:
        run = fx.refund_flow.run({"question": "refund both"}, store=store, subject="dana", env=fx.env("refund"))
        for bad in ({"r1": True}, {"r1": True, "r2": True, "r9": False}, {"r1": "maybe", "r2": True},
                    {"r1": {"approved": True, "arguments": {"amount": 5}}, "r2": True}, None):
            with pytest.raises(AnswerError):
                fx.refund_flow.resume(run.run_id, bad, store=store, env=fx.env("refund"))
            assert store.run(run.run_id).status == "paused"
        edited = {"r1": {"approved": True, "arguments": {"order": "A-1", "amount": 12.5}}, "r2": True}
        done = fx.refund_flow.resume(run.run_id, edited, store=store, env=fx.env("refund"))
        # (one reply's tool calls run side by side: their effects land in either order)
        assert done.status == "ok" and sorted(w for w, _ in fx.effects()) == ["refund A-1 12.5", "refund A-2 99.0"]
