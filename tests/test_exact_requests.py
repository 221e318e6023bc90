"""The exact request of every model call: recorded content-addressed, and the same in the store, the CLI and OTel.

A support agent (recall → assemble_prompt → tool agent) talks to a real OpenAI-compatible HTTP server
(tests/openai_server.py) for two turns of one thread; what the server received is the truth every
other view is checked against.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracemem.otel as otel
from openai_server import Completion, OpenAIServer
from pg_fixtures import pg_server, pg_url, store_factory  # noqa: F401
from stages import AgentScope, assemble_prompt, call_model, recall, tool_agent
from tracemem import Pipeline, RunFailed
from tracemem.genai import message_of
from tracemem.models import OpenAICompatibleModel, ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import tool

API_KEY = "sk-test-0123456789abcdef"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order.

    Args:
        order_id: The order id, e.g. A7.
    """
    return {"order_id": order_id, "ship_to": "Lisbon office"}


def support_agent():
    pipe = Pipeline("support", AgentScope).then(recall()).then(assemble_prompt(instructions="Answer briefly."))
    return tool_agent([lookup_order], model="model", pipeline=pipe).build()


def two_turns(store: Store, server: OpenAIServer, provider=None, listeners=()):
    """Turn 1 asks for a tool then answers; turn 2 (the same thread) answers; the question quotes the API key."""
    server.reply(Completion(text=None, tool_calls=[("call_1", "lookup_order", '{"order_id": "A7"}')],
                            usage={"prompt_tokens": 93, "completion_tokens": 9}))
    server.reply(Completion(text="A7 went to the Lisbon office.", usage={"prompt_tokens": 113, "completion_tokens": 8}))
    server.reply(Completion(text="You are welcome.", usage={"prompt_tokens": 130, "completion_tokens": 4}))
    store.memory.remember("ana", "Ana's orders ship to her Lisbon office", confidence=90)
    model = OpenAICompatibleModel(server.url, "m1", api_key=API_KEY, backoff=0.01)
    agent = support_agent()
    first = agent.run({"question": "Where did order A7 go?"}, store=store, subject="ana", env={"model": model},
                      tracer_provider=provider, listeners=listeners)
    second = agent.run({"question": f"Thanks! My key is {API_KEY}"}, store=store, subject="ana",
                       env={"model": model}, resume=first, tracer_provider=provider, listeners=listeners)
    return first, second


def sent(server: OpenAIServer) -> list[dict]:
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def masked(value):
    return json.loads(json.dumps(value).replace(API_KEY, "<redacted>"))


def test_the_store_holds_exactly_what_the_server_received(tmp_path):
    with OpenAIServer() as server, Store(str(tmp_path / "a.duckdb")) as store:
        first, second = two_turns(store, server)
        bodies = sent(server)
        requests = {**store.requests(first.run_id), **store.requests(second)}
        calls = sorted([c for r in (first, second) for c in r.rows["model_calls"]], key=lambda c: c["started_at"])
        assert len(calls) == len(bodies) == 3
        for call, body in zip(calls, bodies):
            got = requests[call["call_id"]]
            assert got.missing == ()
            assert got.system + got.messages == masked(body["messages"])  # the key the server saw is masked
            assert got.tools == body["tools"]
            assert got.system[0]["role"] == "system" and "Answer briefly." in got.system[0]["content"]
        # the tool loop's input grows with the history: question, tool call, tool result, ...
        roles = [[m["role"] for m in requests[c["call_id"]].messages] for c in calls]
        assert roles == [["user"], ["user", "assistant", "tool"], ["user", "assistant", "tool", "assistant", "user"]]
        assert requests[calls[1]["call_id"]].output == {"role": "assistant", "content": "A7 went to the Lisbon office."}
        assert API_KEY in json.dumps(bodies[2]) and "<redacted>" in json.dumps(requests[calls[2]["call_id"]].messages)
        store.flush()
        dump = json.dumps(store.sql("SELECT * FROM messages").fetchall())
        assert API_KEY not in dump  # masked before it was hashed or stored
        # each message once: the two questions, the tool call, its result, the two answers, and each turn's
        # system prompt (assembled again each turn); a link per message sequence: two system chains of one
        # message and one conversation chain of five, which turn 2 extends rather than copies
        counts = store.sql("SELECT role, count(*) FROM messages GROUP BY role ORDER BY role").fetchall()
        assert dict(counts) == {"assistant": 3, "system": 2, "tool": 1, "user": 2}
        assert store.sql("SELECT count(*), count(DISTINCT chain_id) FROM message_chains").fetchall() == [(7, 7)]
        assert store.sql("SELECT count(*) FROM tool_sets").fetchall() == [(1,)]


def test_show_calls_and_json_print_the_same_messages(tmp_path):
    path = str(tmp_path / "b.duckdb")
    with OpenAIServer() as server, Store(path) as store:
        _, second = two_turns(store, server)
        body = sent(server)[-1]
    cli = [sys.executable, "-m", "stages.cli"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    text = subprocess.run(cli + ["show", second.run_id, "--calls", "--db", path], capture_output=True, text=True,
                          env=env, check=True).stdout
    assert "sent: 1 system, 5 messages, tools lookup_order" in text
    assert "[tool] (result of call_1)" in text and "asks for tool lookup_order" in text
    calls = text[text.index("\nmodel calls"):text.index("\nfinal scope")]
    assert "Thanks! My key is <redacted>" in calls and API_KEY not in calls
    shown = json.loads(subprocess.run(cli + ["show", second.run_id, "--json", "--db", path], capture_output=True,
                                      text=True, env=env, check=True).stdout)
    [call] = shown["model_calls"]
    assert call["request"]["system"] + call["request"]["messages"] == masked(body["messages"])


def test_otel_spans_carry_the_exact_messages_sessions_agents_and_documents():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = otel.OTelListener(provider, capture_content=True, openinference=True)
    with OpenAIServer() as server, Store(":memory:") as store:
        first, second = two_turns(store, server, listeners=[sink])
        bodies = sent(server)
    spans = list(exporter.get_finished_spans())
    chats = sorted([s for s in spans if s.name == "chat m1"], key=lambda s: s.start_time)
    assert len(chats) == 3
    for span, body in zip(chats, bodies):
        messages = masked(body["messages"])
        assert json.loads(span.attributes["gen_ai.system_instructions"]) == \
            [{"type": "text", "content": messages[0]["content"]}]
        assert json.loads(span.attributes["gen_ai.input.messages"]) == [message_of(m) for m in messages[1:]]
        assert json.loads(span.attributes["gen_ai.tool.definitions"])[0]["name"] == "lookup_order"
        assert span.attributes["llm.input_messages.0.message.role"] == "system"
        assert span.attributes["llm.input_messages.1.message.content"] == messages[1]["content"]
    parts = json.loads(chats[1].attributes["gen_ai.input.messages"])
    assert parts[1]["parts"] == [{"type": "tool_call", "id": "call_1", "name": "lookup_order",
                                  "arguments": {"order_id": "A7"}}]
    assert parts[2] == {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1",
                                                   "response": '{"order_id":"A7","ship_to":"Lisbon office"}'}]}
    assert json.loads(chats[0].attributes["gen_ai.output.messages"])[0]["finish_reason"] == "tool_call"
    # one conversation: both turns' runs and calls name the thread's first run
    roots = [s for s in spans if s.parent is None]
    assert [s.name for s in roots] == ["invoke_agent support"] * 2
    assert {s.attributes["gen_ai.conversation.id"] for s in roots + chats} == {first.run_id}
    assert {s.attributes["session.id"] for s in roots} == {first.run_id}
    assert all(s.attributes["openinference.span.kind"] == "AGENT" for s in roots)
    # recall is a retrieval span with its documents
    [retrieval, _] = [s for s in spans if s.name == "retrieval"]
    documents = json.loads(retrieval.attributes["gen_ai.retrieval.documents"])
    memory_id = store_memory_id(first)
    assert documents[0]["id"] == memory_id and documents[0]["content"].startswith("Ana's orders")
    assert retrieval.attributes["openinference.span.kind"] == "RETRIEVER"
    assert retrieval.attributes["retrieval.documents.0.document.id"] == memory_id
    assert retrieval.attributes["input.value"] == "Where did order A7 go?"
    kinds = {s.attributes.get("openinference.span.kind") for s in spans}
    assert kinds == {"AGENT", "CHAIN", "TOOL", "LLM", "RETRIEVER"}
    tool_span = next(s for s in spans if s.name == "execute_tool lookup_order")
    assert tool_span.attributes["tool.name"] == "lookup_order" and tool_span.attributes["output.value"]
    # the key was masked in every call (the run's input and recall's query, recorded before the model that
    # holds the key was called, are not: masking knows a model's key from its first call on)
    assert API_KEY not in json.dumps([dict(s.attributes) for s in chats])
    assert sink._runs == {}


def store_memory_id(run) -> str:
    return run.output.memories[0]["memory_id"]


def test_without_content_capture_documents_keep_ids_and_scores_only():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with OpenAIServer() as server, Store(":memory:") as store:
        first, _ = two_turns(store, server, listeners=[otel.OTelListener(provider, openinference=True)])
    spans = list(exporter.get_finished_spans())
    retrieval = next(s for s in spans if s.name == "retrieval")
    [document] = json.loads(retrieval.attributes["gen_ai.retrieval.documents"])
    assert set(document) == {"id", "score"} and document["id"] == store_memory_id(first)
    assert retrieval.attributes["retrieval.documents.0.document.score"] == document["score"]
    text = json.dumps([dict(s.attributes) for s in spans])
    for content in ("Where did order A7 go?", "Lisbon office", "Answer briefly", "gen_ai.input.messages",
                    "llm.input_messages", "input.value"):
        assert content not in text


def test_a_loop_over_its_limit_is_a_loop_limit_error():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel(replies=[[ToolCall(name="lookup_order", arguments={"order_id": "A7"})]] * 5)
    agent = tool_agent([lookup_order], model=model, max_turns=1).build()
    with pytest.raises(RunFailed):
        agent.run({"question": "x"}, tracer_provider=provider)
    root = next(s for s in exporter.get_finished_spans() if s.parent is None)
    assert root.attributes["error.type"] == "LoopLimitError"
    assert root.status.description == "run failed: LoopLimitError"


def test_a_long_thread_stores_each_message_once_on_both_backends(store_factory):
    store = store_factory()
    flow = Pipeline("chat", AgentScope).then(call_model(system_from=None)).build()
    model = ScriptedModel(default="noted")
    previous = None
    for turn in range(12):
        previous = flow.run({"question": f"fact number {turn}"}, store=store, env={"model": model}, resume=previous)
    store.known_content.forget()  # a process that never saw the thread: the history is sent again, kept once
    last = flow.run({"question": "fact number 12"}, store=store, env={"model": model}, resume=previous)
    store.flush()
    assert store.sql("SELECT count(*), count(DISTINCT message_id) FROM messages").fetchall() == [(14, 14)]
    assert store.sql("SELECT count(*), count(DISTINCT chain_id) FROM message_chains").fetchall() == [(25, 25)]
    [request] = store.requests(last.run_id).values()
    assert [m["content"] for m in request.messages[::2]] == [f"fact number {n}" for n in range(13)]
    assert request.output == {"role": "assistant", "content": "noted"} and request.missing == ()


def test_prune_keeps_the_content_kept_calls_name_and_copy_brings_it(store_factory, tmp_path):
    store = store_factory()
    flow = Pipeline("chat", AgentScope).then(call_model(system_from=None)).build()
    model = ScriptedModel(default="noted")
    lone = flow.run({"question": "a question no other run asks"}, store=store, env={"model": model})
    previous = None
    for turn in range(3):
        previous = flow.run({"question": f"fact number {turn}"}, store=store, env={"model": model}, resume=previous)
    store.flush()
    dry = store.prune(keep_last=3, dry_run=True)
    assert dry.runs == [lone.run_id] and dry.rows["messages"] == 1 and dry.rows["message_chains"] == 1
    report = store.prune(keep_last=3)
    assert report.rows["messages"] == 1 and report.rows["message_chains"] == 1 and report.rows["model_calls"] == 1
    [request] = store.requests(previous.run_id).values()
    assert request.missing == () and len(request.messages) == 5
    with Store(str(tmp_path / "copy.duckdb")) as copy:
        from tracemem.store.copying import copy_history

        copied = copy_history(store, copy)
        assert copied.rows["messages"] == 4 and copied.rows["message_chains"] == 5  # "noted" is one message
        [again] = copy.requests(previous.run_id).values()
        assert again == request
