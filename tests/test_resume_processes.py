"""Pause in one process, resume in another; two resumers at once; SIGKILL mid-run, then resume.

Real subprocesses, a real DuckDB file and a real chat server on 127.0.0.1 that counts every
model call, whichever process makes it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracemem import ResumeError
from tracemem.store import Store
from tracemem.store.opening import StoreLockedError

from local_chat import serve

FLOWDEF = '''
import json, os, sys, time
from pydantic import BaseModel
from tracemem import Pipeline
from tracemem.models import OpenAICompatibleModel


def model():
    return OpenAICompatibleModel(os.environ["CHAT_URL"], "m1", max_retries=0)


def log(name):  # a side effect every process appends to: what ran, across processes
    with open(os.environ["CALL_LOG"], "a") as f:
        f.write(name + "\\n")


def hold(marker_env, text):  # stop here (for a SIGKILL or a second resumer) the first time only
    marker = os.environ.get(marker_env)
    if marker and not os.path.exists(marker):
        with open(marker + ".tmp", "w") as f:
            f.write(text)
        os.replace(marker + ".tmp", marker)
        time.sleep(120)


class Refund(BaseModel):
    order: str = ""
    amount: float = 0
    summary: str = ""
    approved: bool = False
    note: str = ""
    result: str = ""


def propose(s):
    log("propose")
    s.amount = 20.0


def review(s, ctx):
    log(f"review:{ctx.iteration}")
    s.summary = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"summarise a refund of {s.amount} "
                                                                           f"for {s.order}"}]).text
    answer = ctx.interrupt({"order": s.order, "amount": s.amount, "summary": s.summary})
    hold("HOLD_MARKER", ctx.run_id)
    s.approved = bool(answer["approved"])
    s.note = answer.get("note", "")


def execute(s):
    log("execute")
    s.result = f"refunded {s.amount}" if s.approved else "declined"


refund = Pipeline("refund", Refund).then(propose).then(review).then(execute).build()


class Job(BaseModel):
    topic: str = ""
    notes: list[str] = []
    rounds: int = 0
    draft: str = ""
    final: str = ""


def gather(s, ctx):
    log("gather")
    s.notes.append(ctx.complete(ctx.env["model"], [{"role": "user", "content": f"facts about {s.topic}"}]).text)


def think(s, ctx):
    log(f"think:{ctx.iteration}")
    if s.rounds == 2:
        hold("KILL_MARKER", ctx.run_id)
    s.rounds += 1
    s.notes.append(ctx.complete(ctx.env["model"], [{"role": "user", "content": f"round {s.rounds} on {s.topic}"}]).text)


def route(s):
    return "again" if s.rounds < 4 else "done"


def write(s, ctx):
    log("write")
    s.draft = " / ".join(s.notes)


def publish(s):
    log("publish")
    s.final = s.draft.upper()


research = (Pipeline("research", Job).then(gather).then(think)
            .branch(route, {"again": "think", "done": write}).then(publish).build())
'''

PAUSE = '''
import json, sys
sys.path.insert(0, sys.argv[2])
from flowdef import refund, model
from tracemem.store import Store
with Store(sys.argv[1]) as store:
    run = refund.run({"order": "A-17"}, store=store, env={"model": model()})
print(json.dumps({"run_id": run.run_id, "status": run.status, "pending": run.pending}))
'''

RESUME = '''
import json, sys
sys.path.insert(0, sys.argv[2])
from flowdef import refund, model
from tracemem.store import Store
with Store(sys.argv[1]) as store:
    run = refund.resume(sys.argv[3], json.loads(sys.argv[4]), store=store, by=sys.argv[5], env={"model": model()})
print(json.dumps({"status": run.status, "result": run.output.result, "steps": [s.step for s in run.steps]}))
'''

RESEARCH = '''
import sys
sys.path.insert(0, sys.argv[2])
from flowdef import research, model
from tracemem.store import Store
store = Store(sys.argv[1], durability="stage")
research.run({"topic": "tides"}, store=store, env={"model": model()})
'''


@pytest.fixture
def chat():
    yield from serve()


@pytest.fixture
def world(tmp_path, chat, monkeypatch):
    """The flow module and scripts in tmp_path, and the environment both processes share."""
    (tmp_path / "flowdef.py").write_text(FLOWDEF)
    for name, body in (("pause.py", PAUSE), ("resume.py", RESUME), ("research.py", RESEARCH)):
        (tmp_path / name).write_text(textwrap.dedent(body))
    env = {"CHAT_URL": chat.url, "CALL_LOG": str(tmp_path / "calls.log")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("flowdef", None)
    yield tmp_path
    sys.modules.pop("flowdef", None)


def script(world: Path, name: str, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(world / name), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def wait_for(proc: subprocess.Popen, marker: str) -> str:
    deadline = time.monotonic() + 30
    while not os.path.exists(marker):
        if proc.poll() is not None:
            raise AssertionError(f"the child exited early ({proc.returncode}): {proc.stderr.read()}")
        assert time.monotonic() < deadline, "the child never reached the marker"
        time.sleep(0.02)
    return Path(marker).read_text()


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def calls(world: Path) -> list[str]:
    return (world / "calls.log").read_text().split()


def test_pause_then_resume_in_a_new_process_calls_the_model_once(world, chat):
    db = str(world / "agent.duckdb")
    paused = finish(script(world, "pause.py", db, str(world)))
    assert paused["status"] == "paused"
    assert paused["pending"] == {"order": "A-17", "amount": 20.0, "summary": "re: summarise a refund of 20.0 for A-17"}
    assert len(chat.requests) == 1

    done = finish(script(world, "resume.py", db, str(world), paused["run_id"], '{"approved": true, "note": "ok"}',
                         "alice"))
    assert done == {"status": "ok", "result": "refunded 20.0", "steps": [1, 2, 3, 4]}
    assert len(chat.requests) == 1  # the call before the pause was answered from the record, not made again
    assert calls(world) == ["propose", "review:0", "review:0", "execute"]  # re-entered as the same iteration

    with Store(db) as store:
        rid = paused["run_id"]
        assert store.sql("SELECT step, stage, iteration, status FROM steps WHERE run_id = ? ORDER BY step",
                         [rid]).fetchall() == [(1, "propose", 0, "ok"), (2, "review", 0, "paused"),
                                               (3, "review", 0, "ok"), (4, "execute", 0, "ok")]
        assert store.sql("SELECT step, replayed FROM model_calls WHERE run_id = ? ORDER BY step",
                         [rid]).fetchall() == [(2, False), (3, True)]
        hashes = store.sql("SELECT DISTINCT request_hash FROM model_calls WHERE run_id = ?", [rid]).fetchall()
        assert len(hashes) == 1  # the same exact request, hashed alike in both processes
        assert store.sql("SELECT status, pending, resume_at FROM runs WHERE run_id = ?",
                         [rid]).fetchall() == [("ok", None, None)]
        (step, answer, by, asked_step), = store.sql(
            "SELECT step, answer, answered_by, asked_step FROM human_inputs WHERE run_id = ?", [rid]).fetchall()
        assert (step, json.loads(answer), by, asked_step) == (3, {"approved": True, "note": "ok"}, "alice", 2)
        trace = store.run(rid).backtrack("result")
        humans = trace.sources("human_input")
        assert [(h["by"], h["answer"]) for h in humans] == [("alice", {"approved": True, "note": "ok"})]
        assert 'human input by alice: {"approved": true, "note": "ok"}' in trace.explain()


def test_two_processes_cannot_resume_one_run_at_once_and_a_dead_claim_resumes_again(world, chat):
    db = str(world / "agent.duckdb")
    rid = finish(script(world, "pause.py", db, str(world)))["run_id"]
    marker = str(world / "holding")
    first = script(world, "resume.py", db, str(world), rid, '{"approved": true}', "alice", HOLD_MARKER=marker)
    assert wait_for(first, marker) == rid  # the first resumer is inside the re-entered stage, holding the run

    with pytest.raises(StoreLockedError, match=f"process {first.pid}"):
        Store(db)
    cli = subprocess.run([str(Path(sys.executable).with_name("tracemem")), "resume", rid[:8], "--db", db,
                          "--flow", f"{world / 'flowdef.py'}:refund", "--answer", '{"approved": false}'],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert cli.returncode == 1
    assert f"run {rid} cannot be resumed twice at once: process {first.pid}" in cli.stderr
    assert "wait until it pauses or ends" in cli.stderr

    kill(first)  # the claim's process dies: reopening marks the run interrupted, and it resumes again
    from flowdef import model, refund

    with Store(db) as store:
        assert store.interrupted == [rid]
        assert store.sql("SELECT status FROM runs WHERE run_id = ?", [rid]).fetchall() == [("interrupted",)]
        run = refund.resume(rid, {"approved": False}, store=store, by="bob", env={"model": model()})
        assert run.status == "ok" and run.output.result == "declined"
        assert [(s.step, s.stage, s.status) for s in run.steps] == [
            (1, "propose", "ok"), (2, "review", "paused"), (3, "review", "ok"), (4, "execute", "ok")]
        assert store.sql("SELECT answered_by FROM human_inputs WHERE run_id = ?", [rid]).fetchall() == [("bob",)]
    assert len(chat.requests) == 1  # three processes, one model call


def test_sigkill_mid_run_then_resume_runs_no_finished_stage_twice(world, chat):
    db, marker = str(world / "research.duckdb"), str(world / "in-think")
    proc = script(world, "research.py", db, str(world), KILL_MARKER=marker)
    rid = wait_for(proc, marker)
    kill(proc)
    assert len(chat.requests) == 3  # gather, think (round 1), think (round 2); round 3 was killed before asking

    from flowdef import model, research

    with Store(db) as store:
        assert store.interrupted == [rid]
        before = store.run(rid)
        assert before.status == "interrupted"
        assert [(s.step, s.stage, s.iteration) for s in before.steps] == [
            (1, "gather", 0), (2, "think", 0), (3, "route", 0), (4, "think", 1), (5, "route", 1)]
        run = research.resume(rid, store=store, env={"model": model()}, durability="stage")
        assert run.status == "ok" and run.run_id == rid
        assert [(s.step, s.stage, s.iteration) for s in run.steps][5:] == [
            (6, "think", 2), (7, "route", 2), (8, "think", 3), (9, "route", 3), (10, "write", 0), (11, "publish", 0)]
        assert run.output.rounds == 4
    # every stage that finished before the kill ran once; only the one in flight ran again
    assert calls(world) == ["gather", "think:0", "think:1", "think:2", "think:2", "think:3", "write", "publish"]
    asked = chat.asked()
    assert asked == ["facts about tides", "round 1 on tides", "round 2 on tides", "round 3 on tides",
                     "round 4 on tides"]  # each model call made once
    with Store(db) as store:  # and the file holds the whole run, as one
        loaded = store.run(rid)
        assert loaded.status == "ok" and len(loaded.steps) == 11
        assert loaded.output.final == run.output.final
        assert store.sql("SELECT count(*) FROM model_calls WHERE run_id = ?", [rid]).fetchall() == [(5,)]
        assert store.sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]
        with pytest.raises(ResumeError, match="not paused or interrupted: it finished"):
            research.resume(rid, store=store, env={"model": model()})
