"""Pause for a human (`ctx.interrupt`, `pause_before=True`) and `flow.resume`, in one process.

Cross-process pauses, two resumers at once and SIGKILL recovery are in test_resume_processes.py.
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from tracemem import Pipeline, PipelineError, ResumeError, RunFailed, TracememError
from tracemem.flow.interrupt import PauseSignal
from tracemem.models import ScriptedModel
from tracemem.store import Store


class Order(BaseModel):
    item: str = ""
    qty: int = 0
    size: str = ""
    address: str = ""
    log: list[str] = []
    shipped: str = ""


def pick(s):
    s.qty = 2


def ask(s, ctx):
    """Two questions, one pause each."""
    s.log.append(f"ask entered ({ctx.iteration})")
    size = ctx.interrupt({"question": "size?", "item": s.item})
    s.size = size
    address = ctx.interrupt({"question": "address?"})
    s.address = address["street"]


def ship(s, ctx):
    s.shipped = f"{s.qty} x {s.item} ({s.size}) to {s.address}, ok'd by {ctx.answer}"


orders = Pipeline("orders", Order).then(pick).then(ask).then(ship, pause_before=True).build()


@pytest.fixture
def store(tmp_path):
    with Store(str(tmp_path / "runs.duckdb")) as s:
        yield s


def test_two_sequential_pauses_in_one_stage_then_a_declared_pause_point(store):
    run = orders.run({"item": "boots"}, store=store)
    assert run.status == "paused" and run.pending == {"question": "size?", "item": "boots"}
    assert run.resume_at == {"stage": "ask", "kind": "interrupt", "step": 2, "pc": 1}
    assert run.output.size == ""  # a paused stage's writes are never committed

    run = orders.resume(run.run_id, "42", store=store, by="ana")
    assert run.status == "paused" and run.pending == {"question": "address?"}
    run = orders.resume(run.run_id, {"street": "Rua A 1"}, store=store, by="ana")
    assert run.status == "paused" and run.pending == {"before": "ship"}
    assert run.resume_at == {"stage": "ship", "kind": "before", "step": None, "pc": 2}
    run = orders.resume(run.run_id, "yes", store=store, by="boss")

    assert run.status == "ok" and run.pending is None
    assert run.output.shipped == "2 x boots (42) to Rua A 1, ok'd by yes"
    assert [(s.step, s.stage, s.iteration, s.status) for s in run.steps] == [
        (1, "pick", 0, "ok"), (2, "ask", 0, "paused"), (3, "ask", 0, "paused"), (4, "ask", 0, "ok"),
        (5, "ship", 0, "ok")]
    assert run.output.log == ["ask entered (0)"]  # re-entered three times, committed once
    rows = store.sql("SELECT step, idx, answer, answered_by, asked_step FROM human_inputs WHERE run_id = ? "
                     "ORDER BY step, idx", [run.run_id]).fetchall()
    assert [(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in rows] == [
        (3, 0, "42", "ana", 2), (4, 0, "42", "ana", 2), (4, 1, {"street": "Rua A 1"}, "ana", 3),
        (5, 0, "yes", "boss", None)]
    assert len({r[0] for r in store.sql("SELECT input_id FROM human_inputs WHERE answer = '\"42\"'").fetchall()}) == 1
    trace = store.run(run.run_id).backtrack("shipped")
    assert {(h["by"], json.dumps(h["answer"])) for h in trace.sources("human_input")} == {
        ("boss", '"yes"'), ("ana", '"42"'), ("ana", '{"street": "Rua A 1"}')}
    assert store.runs(status="paused") == []


def test_a_paused_run_is_listed_with_what_it_asks_and_loads_back_the_same(store):
    run = orders.run({"item": "hat"}, store=store)
    listed = store.runs(status="paused")
    assert [(r["run_id"], r["pending"]) for r in listed] == [(run.run_id, {"question": "size?", "item": "hat"})]
    loaded = store.run(run.run_id)
    assert (loaded.status, loaded.pending, loaded.resume_at) == ("paused", run.pending, run.resume_at)
    assert [s.status for s in loaded.steps] == ["ok", "paused"]


def test_resume_without_a_store_continues_the_run_at_hand():
    run = orders.run({"item": "cap"})
    same = orders.resume(run, "M")
    assert same is run and run.pending == {"question": "address?"}
    orders.resume(run, {"street": "B"})
    orders.resume(run, "fine")
    assert run.ok and run.output.shipped == "2 x cap (M) to B, ok'd by fine"
    with pytest.raises(ResumeError, match="not paused or interrupted: it finished"):
        orders.resume(run, "again")


def test_model_calls_before_an_interrupt_are_replayed_on_reentry_never_made_again(store):
    class Q(BaseModel):
        topic: str = ""
        draft: str = ""
        final: str = ""

    model = ScriptedModel(["first draft", "polished"])

    def draft(s, ctx):
        s.draft = ctx.complete(ctx.env["m"], [{"role": "user", "content": f"draft {s.topic}"}]).text
        verdict = ctx.interrupt({"draft": s.draft})
        s.final = ctx.complete(ctx.env["m"], [{"role": "user", "content": f"polish per {verdict}"}]).text

    flow = Pipeline("drafts", Q).then(draft).build()
    run = flow.run({"topic": "tides"}, store=store, env={"m": model})
    run = flow.resume(run.run_id, "shorter", store=store, env={"m": model})
    assert run.output.final == "polished" and run.output.draft == "first draft"
    assert len(model.calls) == 2  # the draft once (replayed on re-entry), the polish once
    rows = store.sql("SELECT step, response, replayed FROM model_calls WHERE run_id = ? ORDER BY step, started_at",
                     [run.run_id]).fetchall()
    assert rows == [(1, "first draft", False), (2, "first draft", True), (2, "polished", False)]


def test_a_pause_inside_a_subflow_pauses_the_parent_and_resuming_the_parent_resumes_the_child(store):
    class Child(BaseModel):
        text: str = ""
        verdict: str = ""

    class Parent(BaseModel):
        ticket: str = ""
        verdict: str = ""
        reply: str = ""

    def judge(s, ctx):
        answer = ctx.interrupt({"judge": s.text})
        s.verdict = f"{answer} ({s.text})"

    child = Pipeline("judge", Child).then(judge).build()

    def prepare(s):
        s.ticket = s.ticket.strip()

    def respond(s):
        s.reply = f"verdict: {s.verdict}"

    parent = (Pipeline("support", Parent).then(prepare)
              .subflow(child, inputs={"text": "ticket"}, outputs={"verdict": "verdict"}, id="judging")
              .then(respond).build())
    run = parent.run({"ticket": " refund? "}, store=store)
    assert run.status == "paused" and run.pending == {"judge": "refund?"}
    assert run.resume_at["kind"] == "subflow" and run.resume_at["stage"] == "judging"
    (kid,) = run.children
    assert kid.status == "paused" and run.resume_at["child_run_id"] == kid.run_id
    assert store.runs(status="paused") == [r for r in store.runs(status="paused") if r["run_id"] == run.run_id]

    with pytest.raises(ResumeError, match=f"is a subflow of run {run.run_id}; resume that run"):
        child.resume(kid.run_id, "no", store=store)
    done = parent.resume(run.run_id, "approved", store=store, by="lead")
    assert done.status == "ok" and done.output.reply == "verdict: approved (refund?)"
    assert [(s.step, s.stage, s.status, s.child_run_id) for s in done.steps] == [
        (1, "prepare", "ok", None), (2, "judging", "paused", kid.run_id), (3, "judging", "ok", kid.run_id),
        (4, "respond", "ok", None)]
    assert [c.run_id for c in done.children] == [kid.run_id]  # the same child run, resumed
    assert store.sql("SELECT status FROM runs WHERE run_id = ?", [kid.run_id]).fetchall() == [("ok",)]
    text = store.run(run.run_id).backtrack("reply").explain()
    assert "human input by lead: approved" in text and "run " + kid.run_id[:8] in text


def test_a_fork_branch_cannot_pause_refused_at_build_time_and_at_run_time():
    class S(BaseModel):
        a: str = ""
        b: str = ""

    def asks(s, ctx):
        s.a = ctx.interrupt("ok?")

    def other(s):
        s.b = "b"

    with pytest.raises(PipelineError, match="branch 'asks' calls ctx.interrupt\\(\\).*ask in a stage before or after"):
        Pipeline("f", S).fork(asks, other).build()

    def helper(ctx):
        return ctx.interrupt("hidden?")

    def indirect(s, ctx):
        s.a = helper(ctx)

    flow = Pipeline("g", S).fork(indirect, other).build()
    with pytest.raises(RunFailed, match="ctx.interrupt\\(\\) in fork branch 'indirect'.*cannot pause alone"):
        flow.run()


def test_a_stage_that_swallows_the_pause_signal_still_pauses_and_a_payload_must_be_json():
    class S(BaseModel):
        out: str = ""

    def sneaky(s, ctx):
        try:
            ctx.interrupt({"q": 1})
        except Exception as err:
            assert isinstance(err, PauseSignal)
            s.out = "carried on"

    run = Pipeline("sneaky", S).then(sneaky).build().run()
    assert run.status == "paused" and run.output.out == ""

    def bad(s, ctx):
        ctx.interrupt({"when": object()})

    with pytest.raises(RunFailed, match="cannot be recorded: pauses and answers must be JSON-able"):
        Pipeline("bad", S).then(bad).build().run()


def test_refusals_say_which_and_what_to_do(store):
    done = orders.run({"item": "x"}, store=store)
    for answer in ("1", {"street": "s"}, "ok"):
        done = orders.resume(done.run_id, answer, store=store)
    with pytest.raises(ResumeError, match="not paused or interrupted: it finished.*flow.fork"):
        orders.resume(done.run_id, "more", store=store)

    class S(BaseModel):
        n: int = 0

    def boom(s):
        raise ValueError("no")

    failing = Pipeline("failing", S).then(pick_n).then(boom).build()
    failed = failing.run(store=store, raise_on_error=False)
    with pytest.raises(ResumeError, match="it failed .*a failed run is not continued.*after_step=1"):
        failing.resume(failed.run_id, store=store)

    paused = orders.run({"item": "y"}, store=store)

    def ask(s, ctx):  # the same stage id, other code: another version of the flow
        s.size = ctx.interrupt("size, please?")

    changed = Pipeline("orders", Order).then(pick).then(ask).then(ship, pause_before=True).build()
    assert changed.hash != orders.hash
    with pytest.raises(ResumeError, match=f"version {orders.hash}, but this flow is version {changed.hash}.*fork it"):
        changed.resume(paused.run_id, "1", store=store)
    with pytest.raises(ResumeError, match="is a run of 'orders', not of 'failing'"):
        failing.resume(paused.run_id, store=store)
    with pytest.raises(TracememError, match="needs store="):
        orders.resume(paused.run_id, "1")
    assert store.sql("SELECT status FROM runs WHERE run_id = ?", [paused.run_id]).fetchall() == [("paused",)]

    interrupted = _interrupted_run(store)
    with pytest.raises(ResumeError, match="was interrupted, not paused: nothing asked for an answer"):
        interrupted[0].resume(interrupted[1], "an answer", store=store)
    assert interrupted[0].resume(interrupted[1], store=store).ok


def pick_n(s):
    s.n = 1


def _interrupted_run(store):
    class S(BaseModel):
        n: int = 0
        seen: list[int] = []

    state = {"stop": True}

    def count(s):
        s.n += 1

    def maybe_stop(s):
        if state["stop"]:
            state["stop"] = False
            raise KeyboardInterrupt("operator pressed ^C")
        s.seen.append(s.n)

    flow = Pipeline("stoppable", S).then(count).then(maybe_stop).build()
    with pytest.raises(KeyboardInterrupt):
        flow.run(store=store)
    (row,) = store.runs(pipeline="stoppable")
    assert row["status"] == "interrupted"
    return flow, row["run_id"]


def test_two_threads_resuming_one_run_at_once_one_wins(store):
    class S(BaseModel):
        out: str = ""

    inside, release = threading.Event(), threading.Event()

    def gate(s, ctx):
        answer = ctx.interrupt("go?")
        inside.set()
        release.wait(10)
        s.out = answer

    flow = Pipeline("gated", S).then(gate).build()
    rid = flow.run(store=store).run_id
    results: list = []
    first = threading.Thread(target=lambda: results.append(flow.resume(rid, "first", store=store)))
    first.start()
    assert inside.wait(10)
    with pytest.raises(ResumeError, match=f"run {rid} cannot be resumed twice at once: process \\d+"):
        flow.resume(rid, "second", store=store)
    release.set()
    first.join(10)
    assert results[0].output.out == "first"
    assert store.sql("SELECT answer FROM human_inputs WHERE run_id = ?", [rid]).fetchall() == [('"first"',)]


@pytest.mark.parametrize("flush_interval,durability", [(0, "run"), (0.05, "stage"), (0.05, "run")])
def test_resumed_runs_reach_the_file_whole_under_every_durability(tmp_path, flush_interval, durability):
    path = str(tmp_path / "d.duckdb")
    with Store(path, flush_interval=flush_interval, durability=durability) as store:
        run = orders.run({"item": "sock"}, store=store)
        run = orders.resume(run.run_id, "S", store=store)
        run = orders.resume(run.run_id, {"street": "C"}, store=store)
    with Store(path) as store:
        loaded = store.run(run.run_id)
        assert loaded.status == "paused" and [s.step for s in loaded.steps] == [1, 2, 3, 4]
        assert store.sql("SELECT count(*) FROM step_journal").fetchall() == [(0,)]
        assert store.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]
        done = orders.resume(run.run_id, "ok", store=store)
    with Store(path) as store:
        loaded = store.run(done.run_id)
        assert loaded.ok and loaded.output.shipped == "2 x sock (S) to C, ok'd by ok"
        assert [s.status for s in loaded.steps] == ["ok", "paused", "paused", "ok", "ok"]


def test_a_pause_inside_a_loop_resumes_the_loop_where_it_was(store):
    class S(BaseModel):
        n: int = 0
        answers: list[str] = []

    def work(s, ctx):
        s.n += 1
        if s.n == 2:
            s.answers.append(ctx.interrupt({"round": s.n}))

    flow = Pipeline("looping", S).then(work).loop_to("work", when=lambda s: s.n < 3, max_iterations=2).build()
    run = flow.run(store=store)
    assert run.status == "paused" and run.pending == {"round": 2}
    run = flow.resume(run.run_id, "go", store=store)
    assert run.ok and run.output.n == 3 and run.output.answers == ["go"]
    assert [(s.stage, s.iteration, s.status) for s in run.steps] == [
        ("work", 0, "ok"), ("loop→work", 0, "ok"), ("work", 1, "paused"), ("work", 1, "ok"), ("loop→work", 1, "ok"),
        ("work", 2, "ok"), ("loop→work", 2, "ok")]
    reference = flow.run({"n": 0}, store=None, raise_on_error=False)  # the same loop guard counts both ways
    assert reference.status == "paused"


def test_async_stages_pause_and_resume():
    class S(BaseModel):
        out: str = ""

    async def gate(s, ctx):
        await asyncio.sleep(0)
        s.out = f"got {ctx.interrupt('ready?')}"

    flow = Pipeline("async-gate", S).then(gate).build()

    async def main():
        run = await flow.arun()
        assert run.status == "paused"
        return await flow.aresume(run, "yes")

    assert asyncio.run(main()).output.out == "got yes"
    run = flow.run()
    assert flow.resume(run, "sync too").output.out == "got sync too"


def test_a_resumed_runs_span_links_to_its_spans_before_the_pause(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    run = orders.run({"item": "tie"}, store=store, tracer_provider=provider)
    (first,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_workflow orders"]
    assert first.attributes["tracemem.status"] == "paused" and first.status.is_ok
    recorded = store.sql("SELECT trace_id, span_id FROM runs WHERE run_id = ?", [run.run_id]).fetchall()[0]
    assert recorded == (format(first.context.trace_id, "032x"), format(first.context.span_id, "016x"))
    exporter.clear()
    orders.resume(run.run_id, "L", store=store, tracer_provider=provider)
    (second,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_workflow orders"]
    assert second.attributes["tracemem.resumed"] is True
    (link,) = second.links
    assert (link.context.trace_id, link.context.span_id) == (first.context.trace_id, first.context.span_id)
    assert link.attributes["tracemem.link"] == "resumed"
    steps = [s for s in exporter.get_finished_spans() if s.attributes.get("tracemem.run_id") == run.run_id
             and s.name == "ask"]
    assert [s.attributes["tracemem.step"] for s in steps] == [3]  # the re-entered step, in the new trace
    assert steps[0].context.trace_id == second.context.trace_id
    new_trace = store.sql("SELECT trace_id FROM runs WHERE run_id = ?", [run.run_id]).fetchall()[0][0]
    assert new_trace == format(second.context.trace_id, "032x")


def test_a_decider_can_ask_a_human_which_way_to_go(store):
    class S(BaseModel):
        ticket: str = ""
        handled_by: str = ""

    def route(s, ctx):
        return ctx.interrupt({"ticket": s.ticket, "choose": ["billing", "tech"]})

    def billing(s):
        s.handled_by = "billing"

    def tech(s):
        s.handled_by = "tech"

    flow = Pipeline("triage", S).branch(route, {"billing": billing, "tech": tech}).build()
    run = flow.run({"ticket": "my invoice is wrong"}, store=store)
    assert run.status == "paused" and run.resume_at["stage"] == "route"
    run = flow.resume(run.run_id, "billing", store=store, by="dispatcher")
    assert run.output.handled_by == "billing"
    assert [(s.stage, s.kind, s.status) for s in run.steps] == [
        ("route", "decider", "paused"), ("route", "decider", "ok"), ("billing", "stage", "ok")]
    text = run.backtrack("handled_by").explain()
    assert "decider route chose 'billing'" in text and "human input by dispatcher: billing" in text


def test_resume_with_replay_answers_requests_the_run_already_made_from_its_record(store):
    class S(BaseModel):
        first: str = ""
        second: str = ""

    def ask(s, ctx):
        s.first = ctx.complete(ctx.env["m"], [{"role": "user", "content": "status?"}]).text

    def wait(s, ctx):
        ctx.interrupt("go on?")

    def ask_again(s, ctx):
        s.second = ctx.complete(ctx.env["m"], [{"role": "user", "content": "status?"}]).text

    flow = Pipeline("asks", S).then(ask).then(wait).then(ask_again).build()
    model = ScriptedModel(["green", "amber"])
    replayed = flow.resume(flow.run(store=store, env={"m": model}).run_id, "yes", store=store, env={"m": model},
                           replay=True)
    assert (replayed.output.first, replayed.output.second, len(model.calls)) == ("green", "green", 1)
    model = ScriptedModel(["green", "amber"])
    live = flow.resume(flow.run(store=store, env={"m": model}).run_id, "yes", store=store, env={"m": model})
    assert live.output.second == "amber" and not live.rows["model_calls"][-1]["replayed"]


def test_resume_without_an_answer_asks_again_and_opens_a_pause_point(store):
    run = orders.run({"item": "scarf"}, store=store)
    run = orders.resume(run.run_id, store=store)  # no answer: the stage asks again
    assert run.status == "paused" and run.pending == {"question": "size?", "item": "scarf"}
    assert [(s.stage, s.status) for s in run.steps] == [("pick", "ok"), ("ask", "paused"), ("ask", "paused")]
    run = orders.resume(run.run_id, "XL", store=store)
    assert run.pending == {"question": "address?"}
    run = orders.resume(run.run_id, {"street": "D"}, store=store)
    run = orders.resume(run.run_id, store=store)  # the pause point opens; nobody said anything
    assert run.ok and run.output.shipped == "2 x scarf (XL) to D, ok'd by None"
    assert store.sql("SELECT count(*) FROM human_inputs WHERE run_id = ? AND step = ?",
                     [run.run_id, run.steps[-1].step]).fetchall() == [(0,)]
