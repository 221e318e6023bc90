"""Feedback, blast radius, suspect runs and blame, on a store built the way an agent fills one.

60 runs over 3 subjects: subject A's bad memory (its plan) is used by 20 runs, which answer
wrong; a decoy memory of A is used by all 30 of A's runs, right and wrong alike; B and C have
their own decoys and answer right. Three more runs (subject B) ask exactly what three of the
wrong runs asked, so `load_snapshot` projects those wrong answers into them.
"""
from __future__ import annotations

import io
import json
import random
import shutil

import pytest

from stages import AgentScope, assemble_prompt, call_model, load_snapshot, recall
from tracemem import Pipeline, UsageError
from tracemem.cli import main
from tracemem.models import ScriptedModel
from tracemem.store import Store

WORDS = ("amber basalt cedar dune ember fjord granite harbor iris juniper kelp lagoon meadow nectar onyx "
         "prairie quartz reef sierra tundra umber valley willow xenon yarrow zephyr").split()


def answer(messages):
    prompt = " ".join(str(m.get("content") or "") for m in messages)
    return "You are on the Free plan." if "Free plan" in prompt else "You are on the Pro plan."


def question(rng: random.Random) -> str:
    return "which plan am I on? " + " ".join(rng.sample(WORDS, 6))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    rng = random.Random(7)
    store = Store(str(tmp_path_factory.mktemp("acc") / "acc.duckdb"))
    flow = (Pipeline("support", AgentScope, query="question")
            .then(load_snapshot(projection="answer", min_score=0.99))
            .then(recall()).then(assemble_prompt()).then(call_model()).build())
    env = {"model": ScriptedModel(rules=[("plan", answer)])}
    mem = store.memory
    decoys = {s: mem.remember(s, f"{s} often asks which plan they are on", confidence=90).memory_id for s in "ABC"}
    runs: dict[str, list] = {"A-right": [], "A-wrong": [], "B": [], "C": [], "snap": []}
    asked: list[str] = []
    for _ in range(10):
        runs["A-right"].append(flow.run({"question": question(rng)}, store=store, subject="A", env=env))
    bad = mem.remember("A", "A is on the Free plan", confidence=90).memory_id
    for _ in range(20):
        asked.append(question(rng))
        runs["A-wrong"].append(flow.run({"question": asked[-1]}, store=store, subject="A", env=env))
    for s in "BC":
        for _ in range(15):
            runs[s].append(flow.run({"question": question(rng)}, store=store, subject=s, env=env))
    for q in asked[:3]:
        runs["snap"].append(flow.run({"question": q}, store=store, subject="B", env=env))
    for group, items in runs.items():
        for run in items:
            store.feedback(run.run_id, "wrong" if "Free" in run.output.answer else "right", by="qa")
    yield store, flow, env, runs, bad, decoys, asked
    store.close()


def test_the_world_is_what_the_docstring_says(world):
    store, _, _, runs, bad, decoys, _ = world
    assert all("Free" in r.output.answer for r in runs["A-wrong"] + runs["snap"])
    assert all("Pro" in r.output.answer for g in ("A-right", "B", "C") for r in runs[g])
    assert all(r.output.snapshot for r in runs["snap"])  # the wrong answers were projected into them
    used = {row[0] for row in store.sql("SELECT run_id FROM memory_uses WHERE memory_id = ? AND outcome = 'injected'",
                                        [bad]).fetchall()}
    assert used == {r.run_id for r in runs["A-wrong"]}


def test_blame_ranks_the_bad_memory_first_and_shows_its_counts(world):
    store, _, _, runs, bad, decoys, _ = world
    report = store.blame()
    assert (report.wrong, report.right) == (23, 40)
    top = report.ranked[0]
    assert (top.kind, top.id) == ("memory", bad)
    assert (top.wrong_with, top.right_with, top.wrong_without) == (20, 0, 3)
    decoy = next(b for b in report.ranked if b.id == decoys["A"])
    assert (decoy.wrong_with, decoy.right_with) == (20, 10) and decoy.score < top.score
    assert "statistical" in str(report) and "Ochiai" in report.basis


def test_counterfactual_without_the_bad_memory_changes_the_answer_and_without_a_decoy_does_not(world):
    store, flow, env, runs, bad, decoys, _ = world
    wrong = runs["A-wrong"][3]
    trace = store.backtrack(wrong.run_id, "answer")
    cf = trace.counterfactual(bad, flow=flow, model=env["model"])
    assert cf.changed and "Free" in cf.before and "Pro" in cf.after and "causal" in cf.basis
    assert cf.live_calls == 1 and cf.from_step == 1  # recall (step 2) was where the memory entered
    fork = store.run(cf.run_id)
    assert fork.forked_from_run_id == wrong.run_id and fork.counterfactual["without"] == [f"memory:{bad}"]
    assert [u["reason"] for u in fork.rows["memory_uses"] if u["memory_id"] == bad] == \
        ["counterfactual: left out of this run"]
    same = trace.counterfactual(f"memory:{decoys['A']}", flow=flow, model=env["model"])
    assert not same.changed and "Free" in same.after
    with pytest.raises(UsageError, match="never entered run"):
        trace.counterfactual(f"memory:{decoys['B']}", flow=flow, model=env["model"])


def test_affected_is_exactly_the_runs_that_used_it_and_those_that_loaded_them(world):
    store, _, _, runs, bad, _, _ = world
    report = store.affected(bad)
    expected = {r.run_id for r in runs["A-wrong"] + runs["snap"]}
    checks = {r[0] for r in store.sql("SELECT run_id FROM runs WHERE counterfactual IS NOT NULL").fetchall()}
    assert set(report.runs) - checks == expected  # (a counterfactual run that kept the memory depends on it too)
    one = report.runs[runs["A-wrong"][0].run_id]
    assert "answer" in one.paths and "memories" in one.paths and "injected" in one.via
    assert "snapshot" in report.runs[runs["snap"][0].run_id].via
    assert "answer" in report.runs[runs["snap"][0].run_id].paths
    decoy_report = store.affected(f"memory:{world[5]['B']}")
    assert set(decoy_report.runs) - checks == {r.run_id for r in runs["B"] + runs["snap"]}


def test_affected_by_model_and_pipeline_and_unknown_sources(world):
    store, flow, _, runs, _, _, _ = world
    everyone = {r.run_id for g in runs.values() for r in g}
    checks = {r[0] for r in store.sql("SELECT run_id FROM runs WHERE counterfactual IS NOT NULL").fetchall()}
    assert set(store.affected("model:scripted").runs) - checks == everyone
    assert set(store.affected(f"pipeline:{flow.hash}").runs) - checks == everyone
    with pytest.raises(UsageError, match="neither a memory id nor a run id"):
        store.affected("nonsense")


def test_flagging_makes_runs_suspect_and_load_snapshot_skips_them(world):
    store, flow, env, runs, bad, _, asked = world
    wrong_ids = [r.run_id for r in runs["A-wrong"]]
    store.memory.flag(bad, "contradicted", "support checked: A is on Pro")
    reasons = store.suspect(wrong_ids + [runs["B"][0].run_id])
    assert set(reasons) == set(wrong_ids) and "flagged contradicted" in reasons[wrong_ids[5]]
    rerun = flow.run({"question": asked[5]}, store=store, subject="A", env=env)
    assert rerun.output.snapshot == "" and "Pro" in rerun.output.answer
    logs = [line for s in rerun.steps for line in s.logs]
    assert any("skipped suspect past run" in line and wrong_ids[5] in line for line in logs)
    assert store.sql("SELECT count(*) FROM suspect_runs").fetchall()[0][0] >= 23
    text = store.backtrack(wrong_ids[5], "answer").explain(only="memory")
    assert "flagged since: this value rests on a flagged source" in text
    projected = store.backtrack(runs["snap"][0].run_id, "answer").explain(only="run")
    assert "suspect since:" in projected


def test_feedback_keeps_every_judgement_and_checks_its_input(world):
    store, _, _, runs, _, _, _ = world
    run_id = runs["C"][0].run_id
    store.feedback(run_id, "score", score=0.25, note="half right", by="ana")
    rows = store.sql('SELECT verdict, score, note, "by" FROM feedback WHERE run_id = ? ORDER BY "at"',
                     [run_id]).fetchall()
    assert rows == [("right", 1.0, None, "qa"), ("score", 0.25, "half right", "ana")]
    with pytest.raises(UsageError, match="verdict must be one of"):
        store.feedback(run_id, "meh")
    with pytest.raises(UsageError, match="needs score"):
        store.feedback(run_id, "score", score=3)
    with pytest.raises(UsageError, match="no run 'nope'"):
        store.feedback("nope", "wrong")


def test_the_command_line_marks_and_answers(world, tmp_path):
    store, _, _, runs, bad, _, _ = world
    path = str(tmp_path / "copy.duckdb")
    store.flush()
    store.con.execute("CHECKPOINT")
    shutil.copyfile(store.path, path)  # the CLI opens the file itself (writable for `mark`)
    target = runs["C"][1].run_id
    out = io.StringIO()
    assert main(["mark", target[:10], "wrong", "--note", "bad tone", "--by", "ana", "--db", path], out=out) == 0
    assert f"marked run {target} answer wrong" in out.getvalue()
    out = io.StringIO()
    assert main(["affected", bad, "--db", path, "--json"], out=out) == 0
    assert len(json.loads(out.getvalue())["runs"]) == 24  # 20 that used it, 3 that loaded them, 1 counterfactual
    out = io.StringIO()
    assert main(["blame", "--db", path], out=out) == 0
    text = out.getvalue()
    assert "statistical" in text and f"memory:{bad}" in text.splitlines()[4]
    with pytest.raises(SystemExit):  # argparse refuses a verdict that is not one of the choices
        main(["mark", target, "meh", "--db", path], out=io.StringIO())


def test_prune_keeps_the_evidence_and_every_kept_run_still_loads(world):
    store, _, _, runs, _, _, _ = world
    judged = {r[0] for r in store.sql("SELECT DISTINCT run_id FROM feedback").fetchall()}
    forks = {r[0] for r in store.sql("SELECT forked_from_run_id FROM runs WHERE forked_from_run_id IS NOT NULL"
                                     ).fetchall()}
    report = store.prune(keep_last=5)
    kept = {r[0] for r in store.sql("SELECT run_id FROM runs").fetchall()}
    assert judged <= kept and forks <= kept  # feedback and fork sources are evidence
    assert report.runs == [] or not (set(report.runs) & (judged | forks))
    for run_id in kept:  # and everything kept still loads, threads and snapshots included
        assert store.run(run_id).run_id == run_id
