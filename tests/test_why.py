"""`why`: a tool agent's wrong answer, a planted memory among four decoys recalled in the same prompts, tool
results and a person's approval on the same path (tests/why_scenario.py) — the answer names the planted memory
with where it was learned, in a few lines; `verify=k` re-asks the answering call exactly k times and tells the
planted memory from the decoys; the memory's provenance stops at the user's words; the CLI says the same."""
from __future__ import annotations

import json
import os

import pytest

import why_scenario as ws
from tracemem.cli import main as cli
from tracemem.errors import UsageError
from tracemem.store import Store
from tracemem.trace import why

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("why") / "agent.duckdb")
    with Store(path) as store:
        scenario = ws.play(store)
    scenario["path"] = path
    return scenario


def memory_causes(answer, memory_id):
    return [i for i, c in enumerate(answer.causes) if c.kind == "memory" and c.cut["memory_id"] == memory_id]


def test_the_default_answer_is_short_and_names_the_planted_memory_with_where_it_was_learned(played):
    with Store(played["path"], read_only=True) as store:  # read back from the file
        answer = why(store.run(played["wrong"].run_id), "answer")
    text = str(answer)
    lines = text.splitlines()
    assert len(lines) <= 12, text
    assert answer.value.startswith("Yes: your refund window is 365 days")
    top3 = answer.causes[:3]
    assert any(c.kind == "memory" and c.cut["memory_id"] == played["planted"] for c in top3), text
    planted = answer.causes[memory_causes(answer, played["planted"])[0]]
    learned_in = played["runs"][1]  # turn t2
    assert planted.learned["run_id"] == learned_in.run_id and planted.learned["turn"] == "t2"
    assert planted.learned["words"] == ws.TURNS[1][1]  # the user's words, not the assistant's reply
    line = next(line for line in lines if played["planted"] in line)
    assert f"learned in run {learned_in.run_id[:8]} turn t2" in line and "[Memory] line" in line
    kinds = {c.kind for c in answer.causes}
    assert {"memory", "tool", "human_input", "input", "turn"} <= kinds, kinds
    assert all(len(memory_causes(answer, d)) == 1 for d in played["decoys"])  # recalled in the same prompt
    assert "not verified" in lines[-1]


def test_verify_k_makes_k_model_calls_and_marks_the_planted_memory_decisive_and_the_decoys_not(played):
    with Store(played["path"]) as store:
        ranked = why(store.run(played["wrong"].run_id), "answer").causes
        testable = [c for c in ranked if c.kind not in ("input", "human_input")]
        k = max(i for i, c in enumerate(testable) if c.kind == "memory") + 1  # through the last decoy
        env = ws.env()
        before = len(store.runs(pipeline="tracemem.why", limit=1000))
        answer = why(store.run(played["wrong"].run_id), "answer", verify=k, env=env, store=store)
        assert len(env["model"].calls) == k == answer.calls
        assert len(store.runs(pipeline="tracemem.why", limit=1000)) == before + k  # each re-ask recorded
        first = answer.causes[0]
        assert first.kind == "memory" and first.cut["memory_id"] == played["planted"], str(answer)
        assert first.decisive is True and first.changed_to.startswith("Sorry: refunds close 30 days")
        for decoy in played["decoys"]:
            cause = answer.causes[memory_causes(answer, decoy)[0]]
            assert cause.decisive is False, (decoy, str(answer))
        human = next(c for c in answer.causes if c.kind == "human_input")
        assert human.decisive is None and "not in the answering call's request" in human.note
        check = store.run(first.check_run_id)  # the evidence: the request sent without the memory
        sent = check.rows["model_calls"][0]
        assert check.pipeline == "tracemem.why" and not sent["replayed"]
        assert ws.PLANTED not in json.dumps(store.requests(check)[sent["call_id"]].system)
        text = str(answer)
        assert len(text.splitlines()) <= 12 and "DECISIVE" in text.splitlines()[1]


def test_a_memorys_provenance_stops_at_the_users_words_and_the_extractors_reply(played):
    with Store(played["path"], read_only=True) as store:
        trace = store.backtrack(played["wrong"].run_id, "answer")
    earlier = played["runs"][1].run_id
    g = trace.graph
    step = next(n for n in g.successors(f"m:{played['planted']}"))
    behind = {n for n in g.successors(step)}
    kinds = sorted((g.nodes[n]["kind"], g.nodes[n].get("path")) for n in behind)
    assert kinds == [("input", "question"), ("input", "turn_id"), ("model_call", None)], kinds
    reply = next(n for n in behind if g.nodes[n]["kind"] == "model_call")
    assert [g.nodes[n]["kind"] for n in g.successors(reply)] in ([], ["input"], ["input", "input"])
    assert not any(d.get("run_id") == earlier and d.get("kind") == "write" and d.get("path") == "answer"
                   for _, d in g.nodes(data=True)), "the assistant's reply of the earlier turn is not provenance"


def test_the_cli_answers_in_a_few_lines_and_verifies_with_the_env_it_is_given(played, capsys):
    run_id = played["wrong"].run_id
    assert cli(["why", run_id[:8], "--db", played["path"]]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) <= 12 and played["planted"] in out and "turn t2" in out
    assert f"tracemem backtrack {run_id[:8]} answer" in out
    env = os.path.join(HERE, "why_scenario.py") + ":env"
    assert cli(["why", run_id[:8], "answer", "--verify", "1", "--env", env, "--db", played["path"], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calls"] == 1 and data["causes"][0]["decisive"] is True
    assert cli(["why", run_id[:8], "--verify", "1", "--db", played["path"]]) == 1
    assert "needs a model" in capsys.readouterr().err


def test_bad_input_is_refused_saying_what_to_do(played):
    with Store(played["path"], read_only=True) as store:
        run = store.run(played["wrong"].run_id)
        with pytest.raises(UsageError, match="verify=k re-asks the answering model call, so it needs a model"):
            why(run, "answer", verify=1)
        with pytest.raises(UsageError, match="limit"):
            why(run, "answer", limit=0)
        assert "never written" in str(why(run, "snapshot"))


def test_blame_verified_ranks_the_memory_that_decided_the_wrong_answer_above_what_rode_along(tmp_path, capsys):
    path = str(tmp_path / "blame.duckdb")
    with Store(path) as store:
        scenario = ws.play(store)
        for right in scenario["runs"][:-1]:
            store.feedback(right.run_id, "right", by="qa")
        store.feedback(scenario["wrong"].run_id, "wrong", by="qa")
        plain = store.blame()
        assert all(not (b.kind == "section" and b.id.startswith("recall:")) for b in plain.ranked)  # carries recall
        top = plain.ranked[0]
        assert top.kind == "memory" and top.score == 1.0  # the statistics cannot tell the planted one from a decoy
        env = ws.env()
        report = store.blame(verify=6, env=env)
        assert len(env["model"].calls) == 6 and report.verified == 1 and "verified" in report.basis
        first = report.ranked[0]
        assert (first.kind, first.id, first.decided) == ("memory", scenario["planted"], 1)
        decoy = next(b for b in report.ranked if b.id == ws_memory(scenario, ws.DECOYS[3]))  # shares words, same score
        assert decoy.decided == 0 and decoy.score == first.score
        assert "decided 1 of 1 verified wrong answers" in str(report).splitlines()[1]
    env_file = os.path.join(HERE, "why_scenario.py") + ":env"
    assert cli(["blame", "--verify", "2", "--env", env_file, "--db", path]) == 0
    out = capsys.readouterr().out
    assert "decided" in out and f"memory:{scenario['planted']}" in out.splitlines()[4]  # basis, counts, head, rule


def ws_memory(scenario, text):
    return scenario["memories"][text]


def test_asked_for_more_a_memorys_provenance_follows_all_the_extracting_step_read(played):
    with Store(played["path"], read_only=True) as store:
        run = store.run(played["wrong"].run_id)
        whole = run.backtrack("answer", provenance="step")
        with pytest.raises(UsageError, match="provenance"):
            run.backtrack("answer", provenance="everything")
    earlier = played["runs"][1].run_id
    assert any(d.get("run_id") == earlier and d.get("kind") == "write" and d.get("path") == "answer"
               for _, d in whole.graph.nodes(data=True)), "the assistant's reply of the turn it was learned in"
