"""Backtracking through tools (live and loaded back from the file), execute_tool spans, and stored
conversations of plain dict messages loading into the typed `Message` scope."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from openai_server import Completion, OpenAIServer
from stages import AgentScope, assemble_prompt, recall, tool_agent
import tracemem.otel as otel
from tracemem import Pipeline
from tracemem.models import Message, OpenAICompatibleModel, ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import tool
from tracemem.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
FACT = "Dana's orders ship to the Lisbon office"


@tool(inject=("scope",))
def order_status(order_id: str, scope: Any) -> str:
    """The status of one of this customer's orders.

    Args:
        order_id: The order id.
    """
    return f"{order_id} for {scope.user['name']}: delivered to the Porto office"


def build(model: Any) -> Any:
    pipe = Pipeline("support", AgentScope).then(recall()).then(assemble_prompt(instructions="You help customers."))
    return tool_agent([order_status], model=model, pipeline=pipe).build()


def only(trace: Trace, node: str, kind: str, edge: str, **attrs: Any) -> str:
    g = trace.graph
    found = [c for c in g.successors(node) if g.nodes[c].get("kind") == kind and g.edges[node, c]["kind"] == edge
             and all(g.nodes[c].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (node, kind, edge, attrs, [(c, g.edges[node, c]["kind"]) for c in g.successors(node)])
    return found[0]


def check_chain(trace: Trace, run_id: str) -> None:
    """answer ← final model call ← the tool-result message ← the tool step (arguments, the scope values the
    tool read) ← the model call that asked for it ← that call's prompt sections ← the memory."""
    g = trace.graph
    answer = trace.root
    assert g.nodes[answer]["path"] == "answer" and g.nodes[answer]["stage"] == "final"
    reply = only(trace, answer, "write", "data", path="messages", stage="think")
    final_call = only(trace, reply, "model_call", "source")
    assert g.nodes[final_call]["response"].startswith("Your order A7 was delivered to the Porto office")
    result = only(trace, final_call, "write", "data", path="messages", stage="tools")
    assert json.loads(g.nodes[result]["value"])["role"] == "tool"
    call = only(trace, result, "tool_call", "source", name="order_status")
    assert g.nodes[call]["arguments"] == {"order_id": "A7"} and g.nodes[call]["call_id"] == "call_7"
    assert g.nodes[call]["result"] == "A7 for Dana: delivered to the Porto office" and g.nodes[call]["error"] is None
    user = only(trace, result, "input", "data", path="user")  # what the tool read from the scope
    assert g.nodes[user]["value"] == {"name": "Dana"}
    pending = only(trace, result, "write", "data", path="pending_tool_calls", stage="think")
    asking = only(trace, pending, "model_call", "source")
    assert g.nodes[asking]["tool_calls"] == [{"id": "call_7", "name": "order_status",
                                              "arguments": '{"order_id": "A7"}'}]
    memory_line = only(trace, asking, "prompt_section", "source", section="memory")
    memory = only(trace, memory_line, "memory", "source")
    assert g.nodes[memory]["text"] == FACT
    text = trace.explain(max_lines=80)
    assert "tool call order_status(" in text and "returned 'A7 for Dana: delivered to the Porto office'" in text
    assert "model call agent asked for order_status(" in text and f'"{FACT}"' in text
    lines = text.splitlines()
    at = {key: next(i for i, line in enumerate(lines) if key in line) for key in (
        "answer =", "model call agent replied", '"role": "tool"', "tool call order_status", "asked for order_status")}
    assert at["answer ="] < at["model call agent replied"] < at['"role": "tool"'] < at["tool call order_status"] \
        < at["asked for order_status"]
    assert run_id in trace.runs()


def script(messages: list[dict[str, Any]]) -> Any:
    if not any(m["role"] == "tool" for m in messages):
        return ToolCall(id="call_7", name="order_status", arguments={"order_id": "A7"})
    return "Your order A7 was delivered to the Porto office. " + messages[-1]["content"]


def test_the_answer_is_traced_through_the_tool_result_to_the_call_that_asked_live_and_from_the_file(tmp_path):
    path = str(tmp_path / "agent.duckdb")
    with Store(path) as store:
        store.memory.remember("dana", FACT, confidence=90)
        run = build(ScriptedModel(default=script, name="agent")).run(
            {"question": "Where did order A7 go?", "user": {"name": "Dana"}}, store=store, subject="dana")
        check_chain(run.backtrack("answer"), run.run_id)
        check_chain(store.run(run.run_id).backtrack("answer"), run.run_id)
        run_id = run.run_id
    with Store(path, read_only=True) as reopened:
        check_chain(reopened.backtrack(run_id, "answer"), run_id)


def test_the_same_chain_against_a_real_server():
    with OpenAIServer() as server, Store(":memory:") as store:
        server.reply(Completion(text=None, tool_calls=[("call_7", "order_status", '{"order_id": "A7"}')],
                                model="agent"))
        server.reply(Completion(text="Your order A7 was delivered to the Porto office. A7 for Dana: delivered to "
                                     "the Porto office", model="agent"))
        store.memory.remember("dana", FACT, confidence=90)
        model = OpenAICompatibleModel(server.url, "agent", backoff=0.01)
        run = build(model).run({"question": "Where did order A7 go?", "user": {"name": "Dana"}}, store=store,
                               subject="dana")
        check_chain(store.run(run.run_id).backtrack("answer"), run.run_id)
        assert server.requests[0]["body"]["messages"][0]["role"] == "system"
        assert FACT in server.requests[0]["body"]["messages"][0]["content"]


def test_tool_steps_are_execute_tool_spans_with_content_only_when_captured():
    for capture in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        model = ScriptedModel(replies=[[ToolCall(id="c1", name="order_status", arguments={"order_id": "A7"}),
                                        ToolCall(id="c2", name="nope", arguments={})], "done"], name="agent")
        flow = tool_agent([order_status], model=model).build()
        inputs = {"question": "A7?", "user": {"name": "Dana"}}
        if capture:
            run = flow.run(inputs, listeners=[otel.OTelListener(provider, capture_content=True)])
        else:
            run = flow.run(inputs, tracer_provider=provider)
        spans = {s.attributes.get("gen_ai.tool.call.id"): s for s in exporter.get_finished_spans()
                 if s.name.startswith("execute_tool")}
        ok, bad = spans["c1"], spans["c2"]
        assert ok.name == "execute_tool order_status" and bad.name == "execute_tool nope"
        assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
        assert ok.attributes["gen_ai.tool.name"] == "order_status" and ok.attributes["tracemem.stage_kind"] == "tool"
        assert ok.status.status_code != StatusCode.ERROR
        assert bad.status.status_code == StatusCode.ERROR and bad.attributes["error.type"] == "unknown_tool"
        content = {k for s in (ok, bad) for k in s.attributes if k.startswith("gen_ai.tool.call.")} - {
            "gen_ai.tool.call.id"}
        if capture:
            assert ok.attributes["gen_ai.tool.call.arguments"] == '{"order_id": "A7"}'
            assert ok.attributes["gen_ai.tool.call.result"] == "A7 for Dana: delivered to the Porto office"
        else:
            assert content == set()
        chat = [s for s in exporter.get_finished_spans() if s.name == "chat agent"]
        assert len(chat) == 2
        assert run.status == "ok"


OLD_SCOPE_RUN = textwrap.dedent('''
    import sys
    from typing import Any
    from pydantic import BaseModel
    from tracemem import Pipeline
    from tracemem.store import Store

    class AgentScope(BaseModel):  # the scope as it was before messages were typed
        question: str = ""
        messages: list[dict[str, str]] = []
        answer: str = ""

    def respond(s: AgentScope) -> None:
        s.messages.append({"role": "user", "content": s.question})
        s.answer = "Order A1 shipped on Monday."
        s.messages.append({"role": "assistant", "content": s.answer})

    with Store(sys.argv[1]) as store:
        run = Pipeline("support", AgentScope).then(respond).build().run({"question": "Where is A1?"}, store=store)
        print(run.run_id)
''')


def test_a_store_written_with_dict_messages_loads_into_typed_messages_and_the_thread_goes_on(tmp_path):
    path = str(tmp_path / "old.duckdb")
    done = subprocess.run([sys.executable, "-c", OLD_SCOPE_RUN, path], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    old_id = done.stdout.strip()
    with Store(path) as store:
        stored = store.sql("SELECT value FROM writes WHERE run_id = ? AND path = 'messages' ORDER BY seq LIMIT 1",
                           [old_id]).fetchall()[0][0]
        assert json.loads(stored) == {"role": "user", "content": "Where is A1?"}  # a plain dict, as written then
        old = store.run(old_id, scope=AgentScope)
        state = old.state_at()
        assert state.messages == [Message(role="user", content="Where is A1?"),
                                  Message(role="assistant", content="Order A1 shipped on Monday.")]
        assert old.value_at("messages[1]")["content"] == "Order A1 shipped on Monday."
        model = ScriptedModel(default=lambda messages: f"You asked {len(messages)} things so far.")
        run = tool_agent([order_status], model=model, name="support").build().run(
            {"question": "And B2?", "user": {"name": "Dana"}}, store=store, resume=old)
        assert run.output.answer == "You asked 3 things so far."
        assert [m.role for m in run.output.messages] == ["user", "assistant", "user", "assistant"]
        first = run.backtrack("messages[1]")
        assert first.graph.nodes[first.root]["run_id"] == old_id
        assert model.calls[0][:2] == [{"role": "user", "content": "Where is A1?"},
                                      {"role": "assistant", "content": "Order A1 shipped on Monday."}]


def test_show_calls_lists_the_tool_calls_asked_for_and_run(tmp_path, capsys):
    from tracemem.cli import main as cli

    path = str(tmp_path / "agent.duckdb")
    with Store(path) as store:
        model = ScriptedModel(replies=[[ToolCall(id="c1", name="order_status", arguments={"order_id": "A7"}),
                                        ToolCall(id="c2", name="nope")], "done"], name="agent")
        run = tool_agent([order_status], model=model).build().run({"question": "A7?", "user": {"name": "Dana"}},
                                                                  store=store)
    assert cli(["show", run.run_id[:8], "--calls", "--db", path]) == 0
    out = capsys.readouterr().out
    assert 'asked for tool order_status({"order_id": "A7"}) [c1]' in out
    assert 'tool order_status({"order_id": "A7"}) [c1] returned:' in out and "delivered to the Porto office" in out
    assert "tool nope() [c2] failed (unknown_tool): UnknownToolError" in out
