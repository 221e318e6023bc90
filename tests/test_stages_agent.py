"""recall and call_model as recorded stages, and the two-run scenario: an answer in run 2 traced back through
the model call, the prompt's [Memory] line and the memory to the run-1 step (and question) it was extracted from."""
from __future__ import annotations

import io
from datetime import datetime

import pytest

from stages import AgentScope, assemble_prompt, call_model, extract_memories, recall
from tracemem import Pipeline
from tracemem.cli import main as cli
from tracemem.models import Message, ModelError, Reply, ScriptedModel, Usage
from tracemem.store import Store

SUBJECT = "dana"
Q1 = "I'm vegetarian, by the way. Any lunch ideas?"
Q2 = "What dinner fits my diet?"
FACT = "User's diet is vegetarian"


def agent_reply(messages):
    system = messages[0]["content"]
    if "diet" in messages[-1]["content"] and "vegetarian" in system:
        return "Try a mushroom risotto: it fits your vegetarian diet."
    return "A lentil salad travels well."


def facts_reply(messages):
    turn = messages[-1]["content"].split("\nAssistant:")[0]
    return {"facts": [{"fact": FACT, "score": 0.9, "tags": ["diet"]}]} if "vegetarian" in turn else {"facts": []}


def models():
    return {"model": ScriptedModel(default=agent_reply, name="agent-scripted"),
            "extractor": ScriptedModel(default=facts_reply, name="extractor-scripted")}


def support_flow():
    return (Pipeline("support", AgentScope, query="question")
            .then(recall()).then(assemble_prompt(instructions="You are a cooking assistant."))
            .then(call_model("model")).then(extract_memories("extractor")).build())


# -- recall --------------------------------------------------------------------------------------------

def test_recall_writes_records_receipt_and_memory_uses():
    store = Store(":memory:")
    mem = store.memory
    kept = mem.remember(SUBJECT, "User's diet is vegetarian", confidence=80)
    stale = mem.remember(SUBJECT, "User's diet was pescatarian", confidence=90)
    mem.flag(stale.memory_id, "stale", "changed in 2023")
    low = mem.remember(SUBJECT, "User's diet might be keto", confidence=40)
    old = mem.remember(SUBJECT, "User's diet is vegan for January", confidence=90,
                       valid_from=datetime(2020, 1, 1), valid_until=datetime(2020, 2, 1))
    mem.remember("someone-else", "User's diet is carnivore", confidence=99)
    flow = Pipeline("r", AgentScope).then(recall()).build()
    run = flow.run({"question": "What fits my diet?"}, store=store, subject=SUBJECT)

    assert [m["memory_id"] for m in run.output.memories] == [kept.memory_id]
    record = run.output.memories[0]
    assert record["text"] == kept.text and record["confidence"] == 80 and record["review_state"] == "fresh"
    receipt = run.output.recall_receipt
    assert receipt["returned"] == 1 and receipt["mode"] in ("semantic", "literal")
    assert (receipt["excluded_flagged"], receipt["excluded_below_floor"], receipt["excluded_out_of_window"]) == (1, 1, 1)
    assert receipt["recall_floor"] == 60
    step = run.step("recall").step
    rows = store.sql("SELECT step, memory_id, outcome, reason, rank FROM memory_uses WHERE run_id = ? "
                     "ORDER BY outcome DESC, memory_id", [run.run_id]).fetchall()
    by_id = {r[1]: r for r in rows}
    assert set(by_id) == {kept.memory_id, stale.memory_id, low.memory_id, old.memory_id}  # never another subject's
    assert all(r[0] == step for r in rows)
    assert by_id[kept.memory_id][2:] == ("injected", "recalled", 1)
    assert by_id[stale.memory_id][2] == "excluded" and by_id[stale.memory_id][3].startswith("flagged")
    assert by_id[low.memory_id][2] == "excluded" and by_id[low.memory_id][3].startswith("below_floor")
    assert "< floor 60" in by_id[low.memory_id][3]
    assert by_id[old.memory_id][2] == "excluded" and by_id[old.memory_id][3].startswith("out_of_window")


def test_recall_with_no_question_searches_nothing():
    store = Store(":memory:")
    store.memory.remember(SUBJECT, "User's diet is vegetarian", confidence=80)
    run = Pipeline("r", AgentScope).then(recall()).build().run({"question": "  "}, store=store, subject=SUBJECT)
    assert run.output.memories == [] and run.output.recall_receipt["mode"] == "none"
    assert "memory_uses" not in run.rows


def test_recall_needs_a_store_and_a_subject():
    flow = Pipeline("r", AgentScope).then(recall()).build()
    run = flow.run({"question": "hi"}, raise_on_error=False)
    assert run.status == "failed" and "needs a store" in run.error
    run = flow.run({"question": "hi"}, store=Store(":memory:"), raise_on_error=False)
    assert run.status == "failed" and "subject" in run.error


# -- call_model ---------------------------------------------------------------------------------------

def test_call_model_records_the_call_against_its_prompt():
    store = Store(":memory:")
    model = ScriptedModel(["Hello Dana, noted."], name="scripted-4o")
    flow = Pipeline("c", AgentScope).then(assemble_prompt()).then(call_model(model)).build()
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    run = flow.run({"question": "I'm Dana", "messages": history}, store=store)
    assert run.output.answer == "Hello Dana, noted."
    sent = model.calls[0]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == run.output.prompt and sent[-1]["content"] == "I'm Dana"
    assert run.output.messages[-2:] == [Message(role="user", content="I'm Dana"),
                                        Message(role="assistant", content="Hello Dana, noted.")]
    row = store.sql("SELECT step, model, provider, prompt_id, response, input_tokens, output_tokens, latency_ms, "
                    "error FROM model_calls WHERE run_id = ?", [run.run_id]).fetchall()
    assert len(row) == 1
    step, name, provider, prompt_id, response, tokens_in, tokens_out, latency, error = row[0]
    assert step == run.step("call_model").step and (name, provider) == ("scripted-4o", "scripted")
    assert prompt_id == run.output.prompt_id == f"{run.run_id}:{run.step('assemble_prompt').step}"
    assert response == "Hello Dana, noted." and error is None
    assert tokens_in == sum(len(m["content"].split()) for m in sent) and tokens_out == 3
    assert latency >= 0
    assert store.sql("SELECT count(*) FROM prompts WHERE prompt_id = ?", [prompt_id]).fetchall() == [(1,)]


def test_call_model_takes_usage_from_the_reply_and_the_model_from_env():
    class Fixed:
        name, provider = "fixed", "test"

        def complete(self, messages, *, schema=None):
            return Reply(text="42", usage=Usage(1234, 56), model="fixed-2024-01")

    run = Pipeline("c", AgentScope).then(call_model()).build().run({"question": "?"}, env={"model": Fixed()})
    [row] = run.rows["model_calls"]
    assert (row["model"], row["input_tokens"], row["output_tokens"], row["prompt_id"]) == ("fixed-2024-01", 1234, 56,
                                                                                           None)
    run = Pipeline("c", AgentScope).then(call_model()).build().run({"question": "?"}, raise_on_error=False)
    assert run.status == "failed" and "env['model']" in run.error


@pytest.mark.parametrize("error", [RuntimeError("connection reset by peer"),
                                   ModelError("HTTP 500 from server", kind="status", status=500)])
def test_a_model_error_fails_the_step_and_keeps_earlier_steps(error):
    class Broken:
        name, provider = "broken", "test"

        def complete(self, messages, *, schema=None):
            raise error

    store = Store(":memory:")
    store.memory.remember(SUBJECT, "User's diet is vegetarian", confidence=80)
    flow = (Pipeline("support", AgentScope).then(recall()).then(assemble_prompt()).then(call_model(Broken()))
            .then(extract_memories(ScriptedModel(default={"facts": []}))).build())
    run = flow.run({"question": "What fits my diet?"}, store=store, subject=SUBJECT, raise_on_error=False)
    assert run.status == "failed" and str(error) in run.error
    steps = store.sql("SELECT stage, status, error FROM steps WHERE run_id = ? ORDER BY step", [run.run_id]).fetchall()
    assert [(s, st) for s, st, _ in steps] == [("recall", "ok"), ("assemble_prompt", "ok"), ("call_model", "failed")]
    assert str(error) in steps[-1][2]
    [(status, run_error)] = store.sql("SELECT status, error FROM runs WHERE run_id = ?", [run.run_id]).fetchall()
    assert status == "failed" and str(error) in run_error
    calls = store.sql("SELECT model, prompt_id, response, error FROM model_calls WHERE run_id = ?",
                      [run.run_id]).fetchall()
    assert calls == [("broken", run.output.prompt_id, None, f"{type(error).__name__}: {error}")]
    assert store.sql("SELECT count(*) FROM memory_uses WHERE run_id = ?", [run.run_id]).fetchall() == [(1,)]
    assert store.sql("SELECT count(*) FROM prompt_sections WHERE prompt_id = ?",
                     [run.output.prompt_id]).fetchall()[0][0] > 0
    assert run.output.answer == "" and store.run(run.run_id).value_at("prompt") == run.output.prompt


# -- the two-run scenario -----------------------------------------------------------------------------

def two_runs(store):
    flow, env = support_flow(), models()
    r1 = flow.run({"question": Q1, "turn_id": "t1"}, store=store, subject=SUBJECT, env=env)
    r2 = flow.run({"question": Q2, "turn_id": "t2"}, store=store, subject=SUBJECT, env=env)
    return r1, r2


def only(trace, parent, kind, edge, **attrs):
    """The one successor of `parent` of this node kind, reached by this edge kind, with these attributes."""
    g = trace.graph
    found = [n for n in g.successors(parent) if g.nodes[n].get("kind") == kind and g.edges[parent, n]["kind"] == edge
             and all(g.nodes[n].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (parent, kind, attrs, [(n, g.nodes[n]) for n in g.successors(parent)])
    return found[0]


def check_chain(trace, r1, r2):
    g = trace.graph
    assert trace.missing is None and not trace.truncated
    # answer (run 2, call_model)
    root = trace.root
    assert g.nodes[root]["kind"] == "write" and g.nodes[root]["path"] == "answer"
    assert g.nodes[root]["run_id"] == r2.run_id and g.nodes[root]["stage"] == "call_model"
    # ← the model call, recorded against its prompt
    call = only(trace, root, "model_call", "source", run_id=r2.run_id)
    assert g.nodes[call]["prompt_id"] == r2.output.prompt_id and g.nodes[call]["model"] == "agent-scripted"
    assert g.nodes[call]["response"] == r2.output.answer
    # ← the prompt's [Memory] line 1
    section = only(trace, call, "prompt_section", "source", section="memory")
    memory_id = g.nodes[section]["source_id"]
    assert g.nodes[section]["line"] == 1 and g.nodes[section]["text"] == f'  - "{FACT}"'
    assert r2.output.prompt[g.nodes[section]["start_char"]:g.nodes[section]["end_char"]] == f'  - "{FACT}"'
    kinds = [g.nodes[n]["section"] for n in g.successors(call) if g.edges[call, n]["kind"] == "source"]
    assert sorted(kinds) == sorted(["base", "instructions", "memory_intro", "memory", "directions"])
    # ← and what the call was sent, read by its step (the prompt, the conversation, the question)
    assert {g.nodes[n]["path"] for n in g.successors(call) if g.edges[call, n]["kind"] == "data"} >= {
        "prompt", "messages", "question"}
    # ← the memory record, with its provenance
    memory = only(trace, section, "memory", "source", memory_id=memory_id)
    d = g.nodes[memory]
    assert (d["text"], d["confidence"], d["review_state"]) == (FACT, 90, "fresh")
    assert (d["source_run_id"], d["source_ref"]) == (r1.run_id, "t1")
    # ↞ run 1's extract_memories step
    extract_step = r1.step("extract_memories").step
    step = only(trace, memory, "step", "provenance", run_id=r1.run_id, step=extract_step)
    assert g.nodes[step]["stage"] == "extract_memories" and g.nodes[step]["source_ref"] == "t1"
    # ← run 1's question, the input the fact was distilled from
    question = only(trace, step, "input", "data", run_id=r1.run_id, path="question")
    assert g.nodes[question]["value"] == Q1
    # ← and the extraction model call that distilled it
    extraction = only(trace, step, "model_call", "source", run_id=r1.run_id)
    assert FACT in g.nodes[extraction]["response"] and g.nodes[extraction]["model"] == "extractor-scripted"
    # recall in run 2 injected the same memory node
    recall_write = only(trace, only(trace, root, "write", "data", path="prompt"), "write", "data", path="memories")
    assert only(trace, recall_write, "memory", "source") == memory
    assert trace.runs() == [r2.run_id, r1.run_id]
    assert [m["memory_id"] for m in trace.sources("memory")] == [memory_id]
    return memory_id


def test_an_answer_is_traced_back_to_the_turn_a_memory_came_from(tmp_path):
    path = str(tmp_path / "agent.duckdb")
    with Store(path) as store:
        r1, r2 = two_runs(store)
        assert r2.output.answer.startswith("Try a mushroom risotto")
        live = r2.backtrack("answer")
        memory_id = check_chain(live, r1, r2)
        text = live.explain()
        assert f'memory {memory_id} "{FACT}" (confidence 90, fresh)' in text
        assert f"extracted in run {r1.run_id[:8]}, step {r1.step('extract_memories').step} (extract_memories), " \
               f"turn t1" in text
    with Store(path) as reopened:  # the same chain, read back from the file alone
        loaded = reopened.backtrack(r2.run_id, "answer")
        assert check_chain(loaded, r1, r2) == memory_id
        assert set(loaded.graph.nodes) == set(live.graph.nodes)
        assert set(loaded.graph.edges) == set(live.graph.edges)
        assert {n: d["kind"] for n, d in loaded.graph.nodes(data=True)} == \
               {n: d["kind"] for n, d in live.graph.nodes(data=True)}


def test_influence_ranks_the_culprit_memory_first():
    store = Store(":memory:")
    store.memory.remember(SUBJECT, "User's dog is called Rex", confidence=80)
    store.memory.remember(SUBJECT, "User's diet notes: hates olives", confidence=80)
    r1, r2 = two_runs(store)
    ranking = r2.backtrack("answer").influence()
    memory_id = store.memory.list(SUBJECT, tag="diet")[0].memory_id
    assert ranking[0]["section"] == "memory" and ranking[0]["memory_id"] == memory_id
    assert ranking[0]["score"] > ranking[1]["score"]
    assert {r["section"] for r in ranking} >= {"base", "instructions", "memory", "directions"}
    assert all(r["basis"].startswith("correlational") for r in ranking)


def test_tracemem_backtrack_shows_the_chain(tmp_path):
    path = str(tmp_path / "agent.duckdb")
    with Store(path) as store:
        r1, r2 = two_runs(store)
        memory_id = store.memory.list(SUBJECT)[0].memory_id
    out = io.StringIO()
    assert cli(["backtrack", r2.run_id[:8], "answer", "--db", path], out=out) == 0
    text = out.getvalue()
    lines = [line.strip() for line in text.splitlines()]
    order = [next(i for i, line in enumerate(lines) if line.startswith(prefix)) for prefix in (
        "answer = Try a mushroom risotto", "← model call agent-scripted replied",
        f"← prompt {r2.output.prompt_id} section [Memory] line 1: - \"{FACT}\"", f"← memory {memory_id}",
        f"↞ extracted in run {r1.run_id[:8]}", f"← question = {Q1}")]
    assert order == sorted(order)
    out = io.StringIO()
    assert cli(["backtrack", r2.run_id[:8], "answer", "--db", path, "--only", "memory"], out=out) == 0
    assert f"memory {memory_id}" in out.getvalue() and "turn t1" in out.getvalue()


def test_cross_runs_false_stops_at_the_memory():
    store = Store(":memory:")
    r1, r2 = two_runs(store)
    trace = r2.backtrack("answer", cross_runs=False)
    [memory] = trace.sources("memory")
    assert memory["source_run_id"] == r1.run_id and "missing" not in memory
    assert trace.runs() == [r2.run_id] and trace.sources("run") == []
