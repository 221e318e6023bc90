"""load_snapshot: the strict threshold on exact cosines, embedder-id filtering, no question / no past runs,
each projection, the snapshot_uses row, and a backtrack that crosses into the past run's decision."""
from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import BaseModel

from stages import load_snapshot
from tracemem import Pipeline, PipelineError, TracememError, decide
from tracemem.store import Store

QUERY = "Can I get a refund for my order?"
PAST = {0.69: "refund question at 0.69", 0.70: "refund question at 0.70", 0.71: "refund question at 0.71"}


class HandEmbedder:
    """Hand-made 2-d vectors: the query is (1, 0), a past question at cosine c is (c, sqrt(1 - c²))."""

    dim = 2

    def __init__(self, embedder_id="hand-v1"):
        self.embedder_id = embedder_id
        self.vectors = {QUERY: (1.0, 0.0), **{q: (c, math.sqrt(1 - c * c)) for c, q in PAST.items()}}
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return np.asarray([self.vectors.get(t, (0.0, 1.0)) for t in texts], dtype=np.float32)


class Ticket(BaseModel):
    question: str = ""
    messages: list[dict[str, str]] = []
    snapshot: str = ""
    category: str = ""
    answer: str = ""


def route(scope: Ticket) -> str:
    return decide(scope, [("mentions an invoice", lambda s: "invoice" in s.question, "billing"),
                          ("asks about a refund", lambda s: "refund" in s.question, "refunds")], default="general")


def refunds(scope: Ticket) -> None:
    scope.category = "refunds"


def billing(scope: Ticket) -> None:
    scope.category = "billing"


def general(scope: Ticket) -> None:
    scope.category = "general"


def respond(scope: Ticket) -> None:
    seen = "seen before" if scope.snapshot else "new"
    scope.answer = f"{scope.category}: {seen}"


def flow(**options):
    return (Pipeline("triage", Ticket, query="question").then(load_snapshot(**options))
            .branch(route, {"refunds": refunds, "billing": billing, "general": general}).then(respond).build())


@pytest.fixture
def embedder():
    return HandEmbedder()


@pytest.fixture
def store(embedder):
    with Store(":memory:", snapshot_embedder=embedder) as s:
        yield s


def seed(store, questions, **options):
    return {q: flow(**options).run({"question": q}, store=store) for q in questions}


def uses(store, run):
    return store.sql("SELECT step, source_run_id, score, projection, query FROM snapshot_uses WHERE run_id = ? "
                     "ORDER BY score DESC", [run.run_id]).fetchall()


# -- the threshold --------------------------------------------------------------------------------------

def test_the_threshold_is_exact_and_strict(store, embedder):
    past = seed(store, PAST.values(), embedder=embedder)
    run = flow(embedder=embedder, top_k=3, min_score=0.7).run({"question": QUERY}, store=store)
    rows = uses(store, run)
    assert [r[1] for r in rows] == [past[PAST[0.71]].run_id, past[PAST[0.70]].run_id]  # 0.69 is out
    assert [round(r[2], 5) for r in rows] == [0.71, 0.70]
    assert PAST[0.69] not in run.output.snapshot
    assert run.output.snapshot.index(PAST[0.71]) < run.output.snapshot.index(PAST[0.70])  # best first


@pytest.mark.parametrize("min_score, expected", [(0.69, [0.71, 0.70, 0.69]), (0.70, [0.71, 0.70]),
                                                 (0.705, [0.71]), (0.71, [0.71]), (0.7101, [])])
def test_threshold_edges(store, embedder, min_score, expected):
    seed(store, PAST.values(), embedder=embedder)
    run = flow(embedder=embedder, top_k=5, min_score=min_score).run({"question": QUERY}, store=store)
    assert [round(r[2], 5) for r in uses(store, run)] == expected
    assert bool(run.output.snapshot) == bool(expected)


def test_top_k_keeps_the_best(store, embedder):
    past = seed(store, PAST.values(), embedder=embedder)
    run = flow(embedder=embedder, top_k=1, min_score=0.5).run({"question": QUERY}, store=store)
    assert [r[1] for r in uses(store, run)] == [past[PAST[0.71]].run_id]


def test_nothing_above_the_threshold_injects_nothing(store, embedder):
    seed(store, [PAST[0.69]], embedder=embedder)
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.output.snapshot == "" and uses(store, run) == []
    closest = store.runs(pipeline="triage")[-1]["run_id"]
    assert run.step("load_snapshot").logs == (
        f"load_snapshot: no past run at cosine ≥ 0.7 (closest: run {closest} at 0.69); nothing injected",)
    assert run.output.answer == "refunds: new"


# -- which runs are candidates ---------------------------------------------------------------------------

def test_runs_embedded_with_another_embedder_id_are_ignored(tmp_path, embedder):
    path = str(tmp_path / "snap.duckdb")
    other = HandEmbedder("hand-v2")  # same vectors, another vector space
    with Store(path, snapshot_embedder=other) as s:
        theirs = seed(s, [PAST[0.71]], embedder=other)[PAST[0.71]]
    with Store(path, snapshot_embedder=embedder) as s:
        assert s.sql("SELECT DISTINCT embedder_id FROM run_embeddings").fetchall() == [("hand-v2",)]
        run = flow(embedder=embedder).run({"question": QUERY}, store=s)
        assert run.output.snapshot == "" and uses(s, run) == []
        assert s.similar_runs("triage", QUERY, embedder=other)[0][1] == PAST[0.71]  # there, under its own id
        mine = seed(s, [PAST[0.70]], embedder=embedder)[PAST[0.70]]
        again = flow(embedder=embedder, top_k=5).run({"question": QUERY}, store=s)
        assert [r[1] for r in uses(s, again)] == [run.run_id, mine.run_id]  # the earlier QUERY run (1.0), then 0.70
        assert theirs.run_id not in again.output.snapshot


def test_runs_of_another_pipeline_are_ignored(store, embedder):
    other = Pipeline("other", Ticket, query="question").then(respond).build()
    other.run({"question": PAST[0.71]}, store=store)
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.output.snapshot == ""


def test_no_question_no_search(store, embedder):
    seed(store, PAST.values(), embedder=embedder)
    store.flush()  # the store embeds finished runs' queries in the background
    embedder.calls.clear()
    run = flow(embedder=embedder).run({"question": ""}, store=store)
    store.flush()
    assert embedder.calls == []
    assert run.output.snapshot == "" and uses(store, run) == []
    assert run.step("load_snapshot").logs == ("load_snapshot: no question in the scope; no search",)


def test_the_question_defaults_to_the_last_user_message(store, embedder):
    seed(store, [PAST[0.71]], embedder=embedder)
    messages = [{"role": "user", "content": QUERY}, {"role": "assistant", "content": "Which order?"}]
    run = flow(embedder=embedder).run({"messages": messages}, store=store)
    assert [r[4] for r in uses(store, run)] == [QUERY]


def test_no_past_runs_nothing_injected(store, embedder):
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.output.snapshot == "" and uses(store, run) == [] and run.output.answer == "refunds: new"


def test_the_stores_own_snapshot_embedder_is_the_default():
    with Store(":memory:") as s:  # the hashing embedder
        first = flow().run({"question": "Where is invoice 4471?"}, store=s)
        second = flow().run({"question": "Where is invoice 4471?"}, store=s)
        [row] = uses(s, second)
        assert row[1] == first.run_id and row[2] == pytest.approx(1.0, abs=1e-5)


# -- projections ----------------------------------------------------------------------------------------

def past_and_new(store, embedder, projection):
    past = seed(store, [PAST[0.71]], embedder=embedder)[PAST[0.71]]
    run = flow(embedder=embedder, projection=projection).run({"question": QUERY}, store=store)
    return past, run, run.output.snapshot


def header(past):
    return f'Past run {past.run_id} (similarity 0.71) answered a similar question: "{PAST[0.71]}"'


def test_projection_decisions(store, embedder):
    past, run, text = past_and_new(store, embedder, "decisions")
    # the rule that matched, and the value it read (decide() records it)
    assert text == header(past) + f"\n  route chose 'refunds' because 'asks about a refund' (read question = '{PAST[0.71]}')"
    assert run.output.answer == "refunds: seen before"


def test_projection_answer(store, embedder):
    past, _, text = past_and_new(store, embedder, "answer")
    assert text == header(past) + '\n  answer: "refunds: new"'


def test_projection_writes(store, embedder):
    past, _, text = past_and_new(store, embedder, "writes")
    assert text == header(past) + '\n  snapshot set ""\n  category set "refunds"\n  answer set "refunds: new"'


def test_projection_full(store, embedder):
    past, _, text = past_and_new(store, embedder, "full")
    assert text == header(past) + (f"\n  route chose 'refunds' because 'asks about a refund' (read question = '{PAST[0.71]}')"
                                   '\n  answer: "refunds: new"'
                                   '\n  snapshot set ""\n  category set "refunds"\n  answer set "refunds: new"')


def test_an_unknown_projection_fails_when_the_stage_is_built():
    with pytest.raises(TracememError, match="projection must be one of decisions, answer, writes, full"):
        load_snapshot(projection="everything")


def test_a_snapshot_use_row_is_recorded(store, embedder):
    past, run, _ = past_and_new(store, embedder, "answer")
    [row] = uses(store, run)
    assert row[0] == run.step("load_snapshot").step and row[1] == past.run_id
    assert row[2] == pytest.approx(0.71, abs=1e-6) and row[3:] == ("answer", QUERY)


# -- backtracking into the past run -------------------------------------------------------------------

def check_trace(trace, past, run):
    g = trace.graph
    root = trace.root
    assert g.nodes[root]["path"] == "answer" and g.nodes[root]["run_id"] == run.run_id
    [snap] = [n for n in g.successors(root) if g.nodes[n].get("path") == "snapshot"]
    assert g.nodes[snap]["stage"] == "load_snapshot" and g.edges[root, snap]["kind"] == "data"
    [past_node] = [n for n in g.successors(snap) if g.nodes[n]["kind"] == "run"]
    d = g.nodes[past_node]
    assert g.edges[snap, past_node]["kind"] == "source"
    assert (d["run_id"], d["via"], d["projection"], d["query"]) == (past.run_id, "load_snapshot", "decisions", QUERY)
    assert d["score"] == pytest.approx(0.71, abs=1e-6)
    [decision] = [n for n in g.successors(past_node) if g.nodes[n]["kind"] == "decision"]
    assert decision == f"d:{past.run_id}:{past.step('route').step}"
    assert g.nodes[decision]["chosen"] == "refunds" and g.nodes[decision]["stage"] == "route"
    # and on into the past run: the decider read its question
    assert any(g.nodes[n]["kind"] == "input" and g.nodes[n]["run_id"] == past.run_id and
               g.nodes[n]["value"] == PAST[0.71] for n in g.successors(decision))
    assert past.run_id in trace.runs()
    text = trace.explain()
    assert f"past run {past.run_id[:8]} loaded as a snapshot (score 0.71, decisions)" in text
    assert f"decider route chose 'refunds' because 'asks about a refund' (run {past.run_id[:8]}" in text


def test_a_backtrack_from_an_answer_that_used_a_snapshot_reaches_the_past_decision(tmp_path, embedder):
    path = str(tmp_path / "snap.duckdb")
    with Store(path, snapshot_embedder=embedder) as s:
        past = seed(s, [PAST[0.71]], embedder=embedder)[PAST[0.71]]
        run = flow(embedder=embedder).run({"question": QUERY}, store=s)
        check_trace(run.backtrack("answer"), past, run)
    with Store(path, snapshot_embedder=embedder) as s:
        check_trace(s.backtrack(run.run_id, "answer"), past, run)


def test_a_failed_past_run_is_passed_over(store, embedder):
    def boom(scope: Ticket) -> None:
        raise RuntimeError("backend down")

    failing = (Pipeline("triage", Ticket, query="question").then(load_snapshot(embedder=embedder)).then(boom)
               .build())
    failed = failing.run({"question": PAST[0.71]}, store=store, raise_on_error=False)
    assert failed.status == "failed"
    ok = seed(store, [PAST[0.70]], embedder=embedder)[PAST[0.70]]
    run = flow(embedder=embedder, top_k=1).run({"question": QUERY}, store=store)
    assert [r[1] for r in uses(store, run)] == [ok.run_id]  # the best finished run fills top_k
    # a failed run is never embedded as a snapshot candidate, however similar its question
    assert store.sql("SELECT count(*) FROM run_embeddings WHERE run_id = ?", [failed.run_id]).fetchall() == [(0,)]
    only_failed = Store(":memory:", snapshot_embedder=embedder)
    failing.run({"question": PAST[0.71]}, store=only_failed, raise_on_error=False)
    run = flow(embedder=embedder).run({"question": QUERY}, store=only_failed)
    assert run.output.snapshot == "" and uses(only_failed, run) == []


# -- the query load_snapshot needs -------------------------------------------------------------------------

class Plain(BaseModel):
    task: str = ""
    snapshot: str = ""


def test_the_query_defaults_to_the_scope_question_field(store, embedder):
    def build():  # no query= : Ticket has a `question` field, so runs record it
        return Pipeline("triage", Ticket).then(load_snapshot(embedder=embedder, min_score=0.5)).then(respond).build()
    first = build().run({"question": PAST[0.71]}, store=store)
    second = build().run({"question": QUERY}, store=store)
    assert store.sql("SELECT query FROM runs WHERE run_id = ?", [first.run_id]).fetchall() == [(PAST[0.71],)]
    assert [r[1] for r in uses(store, second)] == [first.run_id]


def test_load_snapshot_in_a_pipeline_that_records_no_query_fails_when_built():
    with pytest.raises(PipelineError, match=r"stage 'load_snapshot' finds past runs by the query each run recorded, "
                                            r"but the pipeline records no query: Plain has no `question` field; "
                                            r"name the field holding the question with "
                                            r"Pipeline\('tasks', Plain, query='<field>'\)"):
        Pipeline("tasks", Plain).then(load_snapshot()).build()
    Pipeline("tasks", Plain, query="task").then(load_snapshot()).build()  # named: fine
    with pytest.raises(PipelineError, match=r"query='taks' names no field of Plain \(fields: task, snapshot\)"):
        Pipeline("tasks", Plain, query="taks").then(load_snapshot()).build()


def test_the_log_says_past_runs_recorded_no_query(store, embedder):
    unrecorded = Pipeline("triage", Ticket, query="").then(respond).build()  # query="" records none
    for q in PAST.values():
        unrecorded.run({"question": q}, store=store)
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.output.snapshot == ""
    assert run.step("load_snapshot").logs == (
        "load_snapshot: none of the 3 past runs of 'triage' recorded a query, so none can match; build the pipeline "
        "with Pipeline('triage', ..., query='<field holding the question>'); nothing injected",)


def test_the_log_says_there_is_no_past_run_yet(store, embedder):
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.step("load_snapshot").logs == (
        "load_snapshot: no past run of 'triage' to compare with yet; nothing injected",)


def test_the_log_says_past_queries_were_embedded_by_another_embedder(tmp_path, embedder):
    path = str(tmp_path / "snap.duckdb")
    with Store(path, snapshot_embedder=HandEmbedder("hand-v2")) as s:
        seed(s, [PAST[0.71]], embedder=HandEmbedder("hand-v2"))
    with Store(path, snapshot_embedder=embedder) as s:
        run = flow(embedder=embedder).run({"question": QUERY}, store=s)
        assert run.step("load_snapshot").logs == (
            "load_snapshot: no past run of 'triage' has its query embedded with hand-v1; nothing injected",)


def test_an_injection_is_logged_with_run_score_and_projection(store, embedder):
    past = seed(store, [PAST[0.71]], embedder=embedder)[PAST[0.71]]
    run = flow(embedder=embedder).run({"question": QUERY}, store=store)
    assert run.step("load_snapshot").logs == (
        f"load_snapshot: injected past run {past.run_id} (similarity 0.71, projection 'decisions')",)
