"""flow.stream() / flow.astream(): typed events as a run happens, tokens from a real local server,
the recorded rows the same as without streaming, and leaving early ends the run `interrupted`."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from openai_server import Completion, OpenAIServer
from stages import tool_agent
from tracemem import Pipeline, RunFailed, StageContext, decide
from tracemem.flow.events import (DecisionEvent, RunFailedEvent, RunFinished, RunStarted, StepFinished, StepStarted,
                                  TokenDelta, ToolCallEvent)
from tracemem.models import ModelError, OpenAICompatibleModel, ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import tool

COLUMNS = "model, provider, prompt_id, response, input_tokens, output_tokens, error, tool_calls"


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return f"{order_id}: shipped"


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def chat(server: OpenAIServer, **kw: Any) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.url, "m1", backoff=0.01, **kw)


def brief(event: Any) -> tuple:
    """An event as (kind, what) for comparing orders."""
    if isinstance(event, (StepStarted, StepFinished)):
        return (event.kind, event.stage)
    if isinstance(event, TokenDelta):
        return (event.kind, event.text)
    if isinstance(event, ToolCallEvent):
        return (event.kind, event.name, event.status)
    if isinstance(event, DecisionEvent):
        return (event.kind, event.stage, event.chosen)
    return (event.kind,)


def test_flow_stream_yields_the_events_of_a_tool_agent_in_order():
    model = ScriptedModel(replies=[ToolCall(name="lookup_order", arguments={"order_id": "A1"}), "A1 has shipped."])
    flow = tool_agent([lookup_order], model=model).build()
    events = list(flow.stream({"question": "A1?"}))
    assert [brief(e) for e in events] == [
        ("run_started",),
        ("step_started", "think"), ("tool_call", "lookup_order", "requested"), ("step_finished", "think"),
        ("step_started", "route"), ("step_finished", "route"), ("decision", "route", "tools"),
        ("step_started", "tools"), ("tool_call", "lookup_order", "finished"), ("step_finished", "tools"),
        ("step_started", "think"), ("token", "A1 "), ("token", "has "), ("token", "shipped."),
        ("step_finished", "think"),
        ("step_started", "route"), ("step_finished", "route"), ("decision", "route", "final"),
        ("step_started", "final"), ("step_finished", "final"),
        ("run_finished",)]
    done = events[-1]
    assert isinstance(done, RunFinished) and done.run.output.answer == "A1 has shipped."
    finished = [e for e in events if isinstance(e, ToolCallEvent) and e.status == "finished"][0]
    assert (finished.call_id, finished.arguments, finished.result, finished.error) == (
        "call_1_0", {"order_id": "A1"}, "A1: shipped", None)
    final = [e for e in events if isinstance(e, StepFinished) and e.stage == "final"][0]
    assert final.written("answer") == ["A1 has shipped."] and final.status == "ok"


class Loan(BaseModel):
    score: int
    verdict: str = ""


def test_events_of_a_plain_flow_carry_writes_and_decisions():
    def route(s: Loan) -> str:
        return decide(s, [("score below 600", lambda s: s.score < 600, "reject")], default="approve")

    def approve(s: Loan) -> None:
        s.verdict = "approved"

    def reject(s: Loan) -> None:
        s.verdict = "rejected"

    flow = Pipeline("loan", Loan).branch(route, {"approve": approve, "reject": reject}).build()
    events = list(flow.stream({"score": 550}))
    assert [brief(e) for e in events] == [("run_started",), ("step_started", "route"), ("step_finished", "route"),
                                         ("decision", "route", "reject"), ("step_started", "reject"),
                                         ("step_finished", "reject"), ("run_finished",)]
    started = events[0]
    assert isinstance(started, RunStarted) and started.pipeline == "loan" and started.run_id == events[-1].run_id
    decision = events[3]
    assert decision.evidence["rules"][0]["matched"] is True
    assert events[5].writes[0].path == "verdict" and events[5].written("verdict") == ["rejected"]


def test_a_subflow_streams_its_steps_under_its_own_run_id_and_the_run_events_are_the_parents():
    class Inner(BaseModel):
        x: int = 0
        y: int = 0

    def double(s: Inner) -> None:
        s.y = s.x * 2

    class Outer(BaseModel):
        score: int = 0
        doubled: int = 0

    inner = Pipeline("inner", Inner).then(double).build()
    flow = Pipeline("outer", Outer).subflow(inner, inputs={"x": "score"}, outputs={"doubled": "y"}, id="sub").build()
    events = list(flow.stream({"score": 21}))
    assert [brief(e) for e in events] == [("run_started",), ("step_started", "sub"), ("step_started", "double"),
                                         ("step_finished", "double"), ("step_finished", "sub"), ("run_finished",)]
    top, child = events[0].run_id, events[2].run_id
    assert child != top and events[-1].run_id == top and events[-1].run.output.doubled == 42
    assert events[-1].run.children[0].run_id == child


def test_a_failed_run_ends_the_stream_with_run_failed_and_bad_inputs_raise():
    def boom(s: Loan) -> None:
        raise ValueError("no verdict today")

    flow = Pipeline("loan", Loan).then(boom).build()
    events = list(flow.stream({"score": 1}))
    assert isinstance(events[-1], RunFailedEvent) and events[-1].status == "failed"
    assert "no verdict today" in events[-1].error and events[-1].run.steps[0].status == "failed"
    assert [e.status for e in events if isinstance(e, StepFinished)] == ["failed"]
    with pytest.raises(Exception, match="score"):
        list(flow.stream({"score": "not a number"}))


def test_text_deltas_stream_from_the_server_and_the_row_matches_a_run_without_streaming(server):
    reply = Completion(text="Order A1 has shipped today.", usage={"prompt_tokens": 9, "completion_tokens": 6},
                       text_piece=5, event_delay=0.05)
    server.reply(reply)
    flow = tool_agent([lookup_order], model=chat(server)).build()
    with Store(":memory:") as store:
        arrived: list[tuple[float, str]] = []
        for event in flow.stream({"question": "A1?"}, store=store):
            if isinstance(event, TokenDelta):
                arrived.append((time.monotonic(), event.text))
            if isinstance(event, RunFinished):
                streamed = event.run
        assert "".join(t for _, t in arrived) == "Order A1 has shipped today." == streamed.output.answer
        assert len(arrived) == 6 and arrived[-1][0] - arrived[0][0] > 0.15  # they came as the server sent them
        assert server.requests[0]["body"]["stream"] is True
        whole = flow.run({"question": "A1?"}, store=store)
        assert "stream" not in server.requests[1]["body"]
        rows = [store.sql(f"SELECT {COLUMNS} FROM model_calls WHERE run_id = ?", [r.run_id]).fetchall()
                for r in (streamed, whole)]
        assert rows[0] == rows[1] and rows[0][0][3] == "Order A1 has shipped today."


def test_tool_call_deltas_stream_and_the_rows_match_a_run_without_streaming(server):
    calls = [("c1", "lookup_order", '{"order_id": "A1"}'), ("c2", "lookup_order", '{"order_id": "B2"}')]
    server.reply(Completion(text=None, tool_calls=calls, interleave=True, args_piece=3,
                            usage={"prompt_tokens": 12, "completion_tokens": 8}))
    server.reply(Completion(text="Both shipped.", usage={"prompt_tokens": 30, "completion_tokens": 3}))
    server.reply(Completion(text=None, tool_calls=calls, usage={"prompt_tokens": 12, "completion_tokens": 8}))
    server.reply(Completion(text="Both shipped.", usage={"prompt_tokens": 30, "completion_tokens": 3}))
    flow = tool_agent([lookup_order], model=chat(server)).build()
    with Store(":memory:") as store:
        events = list(flow.stream({"question": "A1 and B2?"}, store=store))
        tools = [e for e in events if isinstance(e, ToolCallEvent)]
        assert [(e.call_id, e.status) for e in tools] == [("c1", "requested"), ("c2", "requested"),
                                                         ("c1", "finished"), ("c2", "finished")]
        assert tools[1].arguments == {"order_id": "B2"} and tools[3].result == "B2: shipped"
        streamed = events[-1].run
        whole = flow.run({"question": "A1 and B2?"}, store=store)
        assert server.requests[0]["body"]["stream"] is True and "stream" not in server.requests[2]["body"]
        for table, columns in (("model_calls", COLUMNS), ("tool_calls", "step, call_id, name, arguments, result")):
            rows = [store.sql(f"SELECT {columns} FROM {table} WHERE run_id = ? ORDER BY step", [r.run_id]).fetchall()
                    for r in (streamed, whole)]
            assert rows[0] == rows[1] and len(rows[0]) == 2


def test_a_stream_cut_off_mid_reply_fails_clearly_and_records_the_partial_reply(server):
    server.reply(Completion(text="Your order A1 left our warehouse on Monday.", text_piece=6, cut_after=4,
                            usage={"prompt_tokens": 9, "completion_tokens": 9}))
    flow = tool_agent([lookup_order], model=chat(server, max_retries=0)).build()
    with Store(":memory:") as store:
        events = list(flow.stream({"question": "A1?"}, store=store))
        failed = events[-1]
        assert isinstance(failed, RunFailedEvent) and failed.status == "failed"
        assert "broke mid-reply" in failed.error and "retry the call" in failed.error
        tokens = "".join(e.text for e in events if isinstance(e, TokenDelta))
        assert tokens == "Your order A1 left"  # the 3 text events sent before the cut (after the role event)
        row = store.sql("SELECT response, error, tool_calls FROM model_calls WHERE run_id = ?",
                        [failed.run_id]).fetchall()
        assert row == [(tokens, row[0][1], None)] and "ModelError" in row[0][1] and ".partial" in row[0][1]
        assert store.run(failed.run_id).steps[0].status == "failed"
    # the same error through flow.run, as a ModelError with the partial reply on it
    server.script[:] = [Completion(text="Your order A1 left.", text_piece=6, cut_after=2)]

    def ask(scope: Loan, ctx: StageContext) -> None:
        ctx.complete(chat(server, max_retries=0, stream=True), [{"role": "user", "content": "hi"}])

    with pytest.raises(RunFailed) as raised:
        Pipeline("cut", Loan).then(ask).build().run({"score": 1})
    error = raised.value.__cause__
    assert isinstance(error, ModelError) and error.kind == "cut_off" and error.partial.text == "Your o"
    assert raised.value.run.rows["model_calls"][0]["response"] == "Your o"


def test_leaving_the_stream_early_ends_the_run_interrupted_with_every_finished_step_kept(tmp_path):
    started = threading.Event()

    class Slow(BaseModel):
        n: int = 0

    def step(s: Slow) -> None:
        s.n += 1
        started.set()
        time.sleep(0.02)

    pipe = Pipeline("slow", Slow)
    for i in range(20):
        pipe.then(step, id=f"s{i}")
    flow = pipe.build()
    path = str(tmp_path / "s.duckdb")
    with Store(path) as store:
        stream = flow.stream({}, store=store)
        for event in stream:
            if isinstance(event, StepFinished) and event.stage == "s2":
                break
        stream.close()
        run_id = event.run_id
        run = store.run(run_id)
        assert run.status == "interrupted" and "stopped before its next step" in run.error
        assert 3 <= len(run.steps) < 20 and all(s.status == "ok" for s in run.steps)
        assert run.output_json is not None
    with Store(path) as again:
        assert again.run(run_id).status == "interrupted"


def test_astream_gives_the_same_events_and_leaving_early_cancels_an_async_flow(server):
    class Slow(BaseModel):
        n: int = 0

    async def tick(s: Slow) -> None:
        s.n += 1
        await asyncio.sleep(0.02)

    async def forever(s: Slow) -> None:
        await asyncio.sleep(30)

    flow = Pipeline("ticks", Slow).then(tick).then(tick, id="tick2").then(forever).build()
    model = ScriptedModel(replies=[ToolCall(name="lookup_order", arguments={"order_id": "A1"}), "A1 has shipped."])
    agent = tool_agent([lookup_order], model=model).build()

    async def go() -> tuple[list[Any], list[Any], float]:
        agent_events = [e async for e in agent.astream({"question": "A1?"})]
        seen = []
        async with contextlib.aclosing(flow.astream({})) as stream:
            async for event in stream:
                seen.append(event)
                if isinstance(event, StepStarted) and event.stage == "forever":
                    break
            start = time.monotonic()
        return agent_events, seen, time.monotonic() - start

    agent_events, seen, took = asyncio.run(go())
    model2 = ScriptedModel(replies=[ToolCall(name="lookup_order", arguments={"order_id": "A1"}), "A1 has shipped."])
    sync_events = list(tool_agent([lookup_order], model=model2).build().stream({"question": "A1?"}))
    assert [brief(e) for e in agent_events] == [brief(e) for e in sync_events]
    assert took < 5  # the sleeping stage was cancelled, not waited for
    assert [brief(e) for e in seen][-1] == ("step_started", "forever")
    assert seen[0].run_id and isinstance(seen[0], RunStarted)


def test_a_model_error_without_streaming_is_recorded_and_raised(server):
    server.respond(500, {"error": "down"})

    def ask(scope: Loan, ctx: StageContext) -> None:
        ctx.complete(chat(server, max_retries=0), [{"role": "user", "content": "hi"}])

    run = Pipeline("down", Loan).then(ask).build().run({"score": 1}, raise_on_error=False)
    row = run.rows["model_calls"][0]
    assert run.status == "failed" and row["response"] is None and "HTTP 500" in row["error"]
    with pytest.raises(ModelError):
        chat(server, max_retries=0).complete([{"role": "user", "content": "hi"}])


def test_a_listener_with_steps_false_hears_only_its_runs_start_and_end_and_the_others_every_step(tmp_path):
    class Scope(BaseModel):
        n: int = 0

    def bump(s: Scope) -> None:
        s.n += 1

    class RunsOnly:
        steps = False

        def __init__(self) -> None:
            self.heard: list[Any] = []

        def __call__(self, event: Any) -> None:
            self.heard.append(event)

    runs_only, every = RunsOnly(), []  # type: ignore[var-annotated]
    flow = Pipeline("two", Scope).then(bump, id="one").then(bump, id="two").build()
    with Store(str(tmp_path / "l.duckdb")) as store:  # the store's own listener (durability "run") hears runs only
        run = flow.run({}, store=store, listeners=[runs_only, every.append])
        assert store.run(run.run_id).output.n == 2
    assert [type(e) for e in runs_only.heard] == [RunStarted, RunFinished]
    assert [type(e) for e in every] == [RunStarted, StepStarted, StepFinished, StepStarted, StepFinished, RunFinished]
