"""The tool agent (stages.tool_agent) against a real local OpenAI-compatible server: tool calls with
content null, parallel calls run at once, tool errors back to the model, the max-turns guard,
recorded rows, and the graph a user sees."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from openai_server import Completion, OpenAIServer
from stages import AgentScope, assemble_prompt, tool_agent
from tracemem import LoopLimitError, Pipeline, PipelineError, RunFailed
from tracemem.models import Message, OpenAICompatibleModel, ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import ToolSet, tool

ORDERS = {"A1": "shipped", "B2": "lost"}


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order.

    Args:
        order_id: The order id, e.g. A1.
    """
    return {"order_id": order_id, "status": ORDERS.get(order_id, "unknown")}


@tool
def refund_days() -> int:
    """How many days a customer has to ask for a refund."""
    return 30


@tool
def broken(order_id: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"the order database is down (asked for {order_id})")


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def chat(server: OpenAIServer, **kw: Any) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.url, "m1", backoff=0.01, **kw)


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


def test_a_tool_call_with_content_null_runs_the_tool_and_the_model_answers(server):
    server.reply(Completion(text=None, tool_calls=[("call_a", "lookup_order", '{"order_id": "A1"}')],
                            usage={"prompt_tokens": 20, "completion_tokens": 5}))
    server.reply(Completion(text="Order A1 has shipped.", usage={"prompt_tokens": 40, "completion_tokens": 6}))
    flow = tool_agent([lookup_order, refund_days], model=chat(server), name="support").build()
    with Store(":memory:") as store:
        run = flow.run({"question": "Where is order A1?"}, store=store)
        assert run.output.answer == "Order A1 has shipped."
        assert [(s.stage, s.kind) for s in run.steps] == [
            ("think", "stage"), ("route", "decider"), ("tools", "tool"), ("think", "stage"), ("route", "decider"),
            ("final", "stage")]
        first, second = server.requests[0]["body"], server.requests[1]["body"]
        assert [t["function"]["name"] for t in first["tools"]] == ["lookup_order", "refund_days"]
        assert first["messages"] == [{"role": "user", "content": "Where is order A1?"}]
        assistant = second["messages"][1]
        assert assistant["content"] is None and assistant["tool_calls"] == [
            {"id": "call_a", "type": "function",
             "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}]
        assert tool_messages(server.requests[1]) == [
            {"role": "tool", "content": '{"order_id":"A1","status":"shipped"}', "tool_call_id": "call_a"}]
        assert run.output.messages[-1] == Message(role="assistant", content="Order A1 has shipped.")
        assert run.output.pending_tool_calls == []
        rows = store.sql("SELECT step, call_id, name, arguments, arguments_text, result, error, error_kind, truncated, "
                         "original_chars, duration_ms FROM tool_calls WHERE run_id = ?", [run.run_id]).fetchall()
        assert len(rows) == 1
        step, call_id, name, arguments, text, result, error, kind, truncated, chars, duration = rows[0]
        assert (step, call_id, name) == (run.steps[2].step, "call_a", "lookup_order")
        assert json.loads(arguments) == {"order_id": "A1"} and text == '{"order_id": "A1"}'
        assert (result, error, kind, truncated, chars) == ('{"order_id":"A1","status":"shipped"}', None, None,
                                                          False, 36)
        assert duration >= 0
        calls = store.sql("SELECT step, response, tool_calls, input_tokens, output_tokens FROM model_calls "
                          "WHERE run_id = ? ORDER BY step", [run.run_id]).fetchall()
        assert [(c[0], c[1], c[3], c[4]) for c in calls] == [(1, "", 20, 5), (4, "Order A1 has shipped.", 40, 6)]
        assert json.loads(calls[0][2]) == [{"id": "call_a", "name": "lookup_order", "arguments": '{"order_id": "A1"}'}]
        assert calls[1][2] is None


def test_two_parallel_tool_calls_from_one_reply_run_at_once_and_reply_in_order(server):
    both_running = threading.Barrier(2, timeout=10)  # neither call can finish unless both run at the same time
    threads: dict[str, str] = {}

    @tool
    def slow_lookup(order_id: str) -> str:
        """Look up an order slowly."""
        both_running.wait()
        time.sleep(0.05)  # finishes after the other one, yet its result must come first
        threads["slow"] = threading.current_thread().name
        return f"{order_id}: shipped"

    @tool
    def fast_policy() -> str:
        """The refund policy."""
        both_running.wait()
        threads["fast"] = threading.current_thread().name
        return "refunds within 30 days"

    server.reply(Completion(text=None, tool_calls=[("c1", "slow_lookup", '{"order_id": "A1"}'),
                                                   ("c2", "fast_policy", "{}")]))
    server.reply(Completion(text="A1 shipped; refunds within 30 days."))
    run = tool_agent([slow_lookup, fast_policy], model=chat(server)).build().run({"question": "status and policy?"})
    assert run.output.answer == "A1 shipped; refunds within 30 days."
    assert threads["slow"] != threads["fast"]
    tool_steps = [s for s in run.steps if s.kind == "tool"]
    assert len(tool_steps) == 2 and tool_steps[0].started_at < tool_steps[1].ended_at \
        and tool_steps[1].started_at < tool_steps[0].ended_at  # they overlapped
    assert [m["tool_call_id"] for m in tool_messages(server.requests[1])] == ["c1", "c2"]
    assert [r["name"] for r in run.rows["tool_calls"]] == ["slow_lookup", "fast_policy"]


def test_async_tools_run_at_once_under_gather(server):
    started: list[str] = []

    @tool
    async def a_lookup(order_id: str) -> str:
        """Look up an order (async)."""
        started.append("lookup")
        for _ in range(200):  # wait until the other call has started too: only gather gets here
            if len(started) == 2:
                return f"{order_id}: shipped"
            await asyncio.sleep(0.005)
        raise AssertionError("the other tool call never started")

    @tool
    async def a_policy() -> str:
        """The refund policy (async)."""
        started.append("policy")
        for _ in range(200):
            if len(started) == 2:
                return "30 days"
            await asyncio.sleep(0.005)
        raise AssertionError("the other tool call never started")

    server.reply(Completion(text=None, tool_calls=[("c1", "a_lookup", '{"order_id": "A1"}'), ("c2", "a_policy", "")]))
    server.reply(Completion(text="done"))
    flow = tool_agent([a_lookup, a_policy], model=chat(server)).build()
    assert flow.has_async
    run = flow.run({"question": "?"})
    assert [r["result"] for r in run.rows["tool_calls"]] == ["A1: shipped", "30 days"]
    assert all(r["error"] is None for r in run.rows["tool_calls"])


@pytest.mark.parametrize("call, kind, said", [
    (("c1", "broken", '{"order_id": "A1"}'), "raised",
     "Error: tool 'broken' failed: RuntimeError: the order database is down (asked for A1)"),
    (("c1", "lookup_order", '{"order_id": "A1"'), "bad_arguments", "the arguments are not valid JSON"),
    (("c1", "cancel_order", '{"order_id": "A1"}'), "unknown_tool",
     "there is no tool named 'cancel_order' (available: lookup_order, broken)"),
], ids=["tool-raises", "malformed-json-arguments", "unknown-tool"])
def test_a_tool_error_goes_back_to_the_model_and_the_run_goes_on(server, call, kind, said):
    server.reply(Completion(text=None, tool_calls=[call]))
    server.reply(Completion(text="Sorry, I could not check that."))
    with Store(":memory:") as store:
        run = tool_agent([lookup_order, broken], model=chat(server)).build().run({"question": "A1?"}, store=store)
        assert run.status == "ok" and run.output.answer == "Sorry, I could not check that."
        sent = tool_messages(server.requests[1])
        assert len(sent) == 1 and sent[0]["tool_call_id"] == "c1" and said in sent[0]["content"]
        row = store.sql("SELECT name, error_kind, error, result FROM tool_calls WHERE run_id = ?",
                        [run.run_id]).fetchall()
        assert row[0][:2] == (call[1], kind) and row[0][2] and said in row[0][3]
        step = [s for s in run.steps if s.kind == "tool"][0]
        assert step.status == "ok" and any(kind in line for line in step.logs)


def test_the_max_turns_guard_fails_clearly_and_keeps_every_step(server):
    server.reply(Completion(text=None, tool_calls=[("c1", "lookup_order", '{"order_id": "A1"}')]))  # forever
    flow = tool_agent([lookup_order], model=chat(server), max_turns=2, name="looper").build()
    with Store(":memory:") as store:
        with pytest.raises(RunFailed) as failed:
            flow.run({"question": "A1?"}, store=store)
        assert isinstance(failed.value.__cause__, LoopLimitError)
        message = str(failed.value)
        assert "loop 'max_turns' back to 'think'" in message and "max_iterations=2" in message
        run = store.run(failed.value.run.run_id)
        assert run.status == "failed"
        assert [s.stage for s in run.steps].count("tools") == 3 and run.steps[-1].status == "failed"
        assert run.steps[-1].stage == "max_turns"
        assert store.sql("SELECT count(*) FROM tool_calls WHERE run_id = ?", [run.run_id]).fetchall() == [(3,)]


def test_the_agent_is_a_graph_a_user_can_see():
    flow = tool_agent([lookup_order], model=ScriptedModel(default="hi")).build()
    assert set(flow.graph.edges) >= {("think", "route"), ("route", "tools"), ("tools", "max_turns"),
                                     ("max_turns", "think"), ("route", "final")}
    assert flow.graph.edges["route", "tools"]["label"] == "tools"
    assert flow.graph.nodes["tools"]["kind"] == "map" and flow.graph.nodes["tools"]["tool"] is True
    mermaid = flow.to_mermaid()
    assert '[/"tools (each of pending_tool_calls)"/]' in mermaid and '{"route"}' in mermaid


def test_own_stages_before_and_after_and_an_own_scope():
    class Desk(BaseModel):
        ticket: str = ""
        system: str = ""
        chat: list[Message] = []
        calls: list[ToolCall] = []
        reply: str = ""
        shouted: str = ""

    def brief(scope: Desk) -> None:
        scope.system = "You are a support desk."

    def shout(scope: Desk) -> None:
        scope.shouted = scope.reply.upper()

    model = ScriptedModel(replies=[ToolCall(name="lookup_order", arguments={"order_id": "B2"}), "B2 is lost."])
    pipe = Pipeline("desk", Desk).then(brief)
    flow = tool_agent([lookup_order], model=model, pipeline=pipe, system_from="system", messages_from="chat",
                      question_from="ticket", pending_from="calls", into="reply").then(shout).build()
    run = flow.run({"ticket": "Where is B2?"})
    assert run.output.reply == "B2 is lost." and run.output.shouted == "B2 IS LOST."
    assert [s.stage for s in run.steps][0] == "brief" and run.steps[-1].stage == "shout"
    assert model.calls[0][0] == {"role": "system", "content": "You are a support desk."}
    with pytest.raises(PipelineError, match="pending_from='pending_tool_calls' but the scope Desk has no such field"):
        tool_agent([lookup_order], pipeline=Pipeline("desk", Desk), messages_from="chat")


def test_tools_get_the_scope_and_env_they_ask_for_and_their_reads_are_recorded():
    @tool(inject=("scope", "orders"))
    def my_order(scope: Any, orders: dict) -> str:
        """The status of this customer's order."""
        return orders[scope.user["order"]]

    model = ScriptedModel(replies=[ToolCall(name="my_order"), "It is on its way."])
    flow = tool_agent([my_order], model=model).build()
    run = flow.run({"question": "my order?", "user": {"order": "A1"}}, env={"orders": {"A1": "on its way"}})
    assert run.rows["tool_calls"][0]["result"] == "on its way"
    step = run.step("tools").step
    assert {r.path for r in run.reads if r.step == step} >= {"pending_tool_calls", "user"}
    assert my_order.spec.parameters["properties"] == {}  # injected values are never shown to the model


def test_a_toolset_with_a_size_cap_records_the_cut(server):
    @tool
    def big() -> str:
        """A large result."""
        return "x" * 500

    server.reply(Completion(text=None, tool_calls=[("c1", "big", "{}")]))
    server.reply(Completion(text="ok"))
    run = tool_agent(ToolSet([big], max_result_chars=100), model=chat(server)).build().run({"question": "?"})
    row = run.rows["tool_calls"][0]
    assert row["truncated"] is True and row["original_chars"] == 500 and len(row["result"]) <= 100
    assert "[truncated: showing the first" in tool_messages(server.requests[1])[0]["content"]


def test_a_forked_tool_agent_replays_its_recorded_tool_calls_without_the_model():
    model = ScriptedModel(replies=[ToolCall(name="lookup_order", arguments={"order_id": "A1"}), "A1 has shipped."])
    flow = tool_agent([lookup_order], model="model").build()
    with Store(":memory:") as store:
        run = flow.run({"question": "Where is A1?"}, store=store, env={"model": model})
        silent = ScriptedModel(name=model.name)  # no replies: any call that reaches it fails
        again = flow.fork(run, 0, store=store, env={"model": silent}, replay=True)
        assert again.output.answer == "A1 has shipped." and silent.calls == []
        assert [r["replayed"] for r in again.rows["model_calls"]] == [True, True]
        assert again.rows["model_calls"][0]["tool_calls"] == run.rows["model_calls"][0]["tool_calls"]
        assert [r["result"] for r in again.rows["tool_calls"]] == ['{"order_id":"A1","status":"shipped"}']


def test_a_map_step_that_asks_pauses_the_whole_map_and_a_resume_enters_it_again():
    class Items(BaseModel):
        items: list[int] = []
        done: list[int] = []

    calls: list[int] = []

    def ask(scope: Items, ctx: Any) -> None:
        made = ctx.effect("touch", lambda key: calls.append(ctx.item) or ctx.item, input=ctx.item)
        if ctx.item == 2 and not ctx.interrupt({"approve": ctx.item}):
            return
        scope.done.append(made)

    flow = Pipeline("p", Items).map(ask, over="items").build()
    with Store(":memory:") as store:
        run = flow.run({"items": [1, 2, 3]}, store=store)
        assert run.status == "paused" and run.pending == {"approve": 2} and run.resume_at["item"] == 1
        assert [s.status for s in run.steps] == ["paused"] * 3 and run.output.done == [] and sorted(calls) == [1, 2, 3]
        done = flow.resume(run.run_id, True, store=store)
        assert done.output.done == [1, 2, 3] and sorted(calls) == [1, 2, 3]  # the effects were replayed, not repeated
        assert [r["mode"] for r in done.rows["effects"]] == ["live"] * 3 + ["replayed"] * 3
    with pytest.raises(PipelineError, match="over='nope': the scope Items has no field 'nope'"):
        Pipeline("p", Items).map(ask, over="nope")
    with pytest.raises(PipelineError, match="must take \\(scope, ctx\\)"):
        Pipeline("p", Items).map(lambda s: None, over="items")


class Things(BaseModel):
    things: list[Any] = []
    seen: list[str] = []


class Point(BaseModel):
    x: int = 0


def test_a_map_steps_item_is_its_own_copy_and_each_step_records_its_read_of_the_list():
    """`ctx.item` is a private shallow copy of the element (a model, a dict, a list, a tuple of containers):
    changing it changes nothing in the scope; and each element's step records one read of the mapped field."""
    def poke(scope: Things, ctx) -> None:
        item = ctx.item
        if isinstance(item, Point):
            item.x = 99
        elif isinstance(item, dict):
            item["k"] = "changed"
        elif isinstance(item, list):
            item.append("more")
        elif isinstance(item, tuple):
            item[0].append("more")
        scope.seen.append(type(item).__name__)

    flow = Pipeline("items", Things).map(poke, over="things").build()
    things = [Point(x=1), {"k": "v"}, ["a"], (["t"], 1), "text"]
    run = flow.run({"things": things})
    assert sorted(run.output.seen) == sorted(["Point", "dict", "list", "tuple", "str"])
    assert run.output.things == [Point(x=1), {"k": "v"}, ["a"], (["t"], 1), "text"]
    assert things[0].x == 1 and things[2] == ["a"]  # the caller's objects too
    map_steps = [s.step for s in run.steps if s.kind == "map-item"]
    assert len(map_steps) == 5
    for step in map_steps:
        assert [r.path for r in run.reads if r.step == step and r.path == "things"] == ["things"]
