"""Tool calls through the model layer: the OpenAI adapter against a real local server, typed messages, ScriptedModel."""
from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from openai_server import OpenAIServer
from tracemem.errors import TracememError
from tracemem.models import (ChatModel, Message, ModelConfigError, OpenAICompatibleModel, Reply, ScriptedModel,
                             TextDelta, ToolCall, ToolCallDelta, ToolSpec, Usage, stream_reply, wire_messages)
from tracemem.tools import ToolSet, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
def lookup(city: str) -> dict:
    """Weather for a city."""
    return {"city": city, "sky": "rain"}


QUESTION = [{"role": "user", "content": "what is 2 + 3, and the weather in Oslo?"}]


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def model(server: OpenAIServer, **kw: Any) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.url, "m1", backoff=0.01, **kw)


def test_a_tool_call_with_content_null_is_a_reply_not_an_error(server):
    server.reply(text=None, tool_calls=[("call_a", "add", '{"a": 2, "b": 3}')], usage={"prompt_tokens": 9,
                                                                                       "completion_tokens": 4})
    reply = model(server).complete(QUESTION, tools=[add, lookup], tool_choice="auto")
    assert reply.text == "" and reply.finish_reason == "tool_calls" and reply.usage == Usage(9, 4)
    assert reply.tool_calls == (ToolCall(id="call_a", name="add", arguments={"a": 2, "b": 3},
                                         arguments_text='{"a": 2, "b": 3}'),)
    sent = server.requests[0]["body"]
    assert sent["tools"] == [add.openai_schema(), lookup.openai_schema()]
    assert sent["tools"][0]["function"]["parameters"]["properties"]["a"] == {"description": "The first addend.",
                                                                             "type": "integer"}
    assert sent["tool_choice"] == "auto" and "stream" not in sent


def test_two_parallel_tool_calls_and_the_follow_up_request_is_valid_openai(server):
    server.reply(text=None, tool_calls=[("call_1", "add", '{"a": 2, "b": 3}'), ("call_2", "lookup", '{"city": "Oslo"}')])
    server.reply(text="5, and rain in Oslo.")
    chat, tools = model(server), ToolSet([add, lookup])
    messages: list[Any] = list(QUESTION)
    first = chat.complete(messages, tools=tools)
    assert [c.name for c in first.tool_calls] == ["add", "lookup"]
    messages.append(first.message)
    messages += [tools.run(call).message() for call in first.tool_calls]
    final = chat.complete(messages, tools=tools)
    assert final.text == "5, and rain in Oslo." and final.tool_calls == ()
    wire = server.requests[1]["body"]["messages"]
    assert wire[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Oslo"}'}}]}
    assert wire[2] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    assert wire[3] == {"role": "tool", "content": '{"city":"Oslo","sky":"rain"}', "tool_call_id": "call_2"}


def test_malformed_json_arguments_are_kept_raw_and_reported_back_to_the_model(server):
    server.reply(text=None, tool_calls=[("call_x", "add", '{"a": 2, "b": ')])
    reply = model(server).complete(QUESTION, tools=[add])
    (call,) = reply.tool_calls
    assert call.arguments is None and call.arguments_text == '{"a": 2, "b": '
    outcome = ToolSet([add]).run(call)
    assert outcome.error_kind == "bad_arguments" and "not valid JSON" in outcome.content and "'add'" in outcome.content
    assert outcome.message().tool_call_id == "call_x"


def test_unknown_tool_and_a_tool_that_raises_become_tool_results(server):
    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"boom: {reason}")

    server.reply(text=None, tool_calls=[("c1", "nope", "{}"), ("c2", "explode", '{"reason": "disk full"}')])
    reply = model(server).complete(QUESTION, tools=[add, explode])
    unknown, raised = [ToolSet([add, explode]).run(c) for c in reply.tool_calls]
    assert unknown.error_kind == "unknown_tool" and "no tool named 'nope'" in unknown.content
    assert "add, explode" in unknown.content
    assert raised.error_kind == "raised" and raised.error == "RuntimeError: boom: disk full"
    assert "failed: RuntimeError: boom: disk full" in raised.content


def test_tool_choice_forms_and_mistakes(server):
    server.reply(text="ok")
    chat = model(server)
    chat.complete(QUESTION, tools=[add], tool_choice="add")
    chat.complete(QUESTION, tools=[add], tool_choice="required")
    chat.complete(QUESTION, tool_choice="auto")  # harmless without tools: not sent
    choices = [r["body"].get("tool_choice") for r in server.requests]
    assert choices == [{"type": "function", "function": {"name": "add"}}, "required", None]
    with pytest.raises(ModelConfigError, match="names no tool"):
        chat.complete(QUESTION, tools=[add], tool_choice="subtract")
    with pytest.raises(ModelConfigError, match="needs tools="):
        chat.complete(QUESTION, tool_choice="required")
    with pytest.raises(ModelConfigError, match="two tools are named 'add'"):
        chat.complete(QUESTION, tools=[add, add.spec])
    with pytest.raises(ModelConfigError, match=r"tools\[0\] is not a tool"):
        chat.complete(QUESTION, tools=[42])
    assert len(server.requests) == 3  # mistakes never reach the server


def test_tools_as_specs_and_openai_dicts(server):
    server.reply(text="ok")
    raw = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
    model(server).complete(QUESTION, tools=[ToolSpec("ping", "Is it up?"), raw])
    assert server.requests[0]["body"]["tools"] == [
        {"type": "function", "function": {"name": "ping", "description": "Is it up?",
                                          "parameters": {"type": "object", "properties": {}}}}, raw]


# --- typed messages ------------------------------------------------------------------------


def test_old_dict_messages_validate_and_serialize_to_the_same_wire_shape():
    old = {"role": "user", "content": "hi"}
    m = Message.model_validate(old)
    assert m.model_dump() == old and m["content"] == "hi" and m.get("role") == "user" and m.get("nope") is None
    assert wire_messages([old, m]) == [old, old]
    with pytest.raises(KeyError):
        m["nope"]


def test_messages_round_trip_through_json_in_the_openai_shape():
    call = ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})
    history = [Message(role="system", content="rules"), Message(role="assistant", tool_calls=[call]),
               Message(role="tool", tool_call_id="c1", content="3"), Message(role="user", content="hi", name="dana")]
    wire = json.loads(json.dumps([m.model_dump() for m in history]))
    assert wire[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    assert wire[3] == {"role": "user", "content": "hi", "name": "dana"}
    back = [Message.model_validate(w) for w in wire]
    assert back == history and back[1].tool_calls[0].arguments == {"a": 1, "b": 2}


def test_message_validation_errors_and_dicts_it_passes_through():
    with pytest.raises(ValidationError, match="role"):
        Message.model_validate({"role": "robot", "content": "x"})
    with pytest.raises(ValidationError, match="extra"):
        Message.model_validate({"role": "user", "content": "x", "mood": "sunny"})
    parts = {"role": "user", "content": [{"type": "text", "text": "look"}]}  # content parts: sent as written
    assert wire_messages([parts]) == [parts]
    mixed = {"role": "assistant", "content": None, "tool_calls": [ToolCall(id="c", name="f", arguments={})]}
    assert wire_messages([mixed])[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    with pytest.raises(ModelConfigError, match=r"messages\[0\] is a str"):
        wire_messages(["hello"])
    with pytest.raises(ModelConfigError, match="list of messages"):
        wire_messages("hello")  # type: ignore[arg-type]
    assert issubclass(ModelConfigError, TracememError) and issubclass(ModelConfigError, ValueError)


def test_tool_call_parsing_rules():
    assert ToolCall(name="f", arguments_text="").arguments == {}  # no-argument call
    assert ToolCall(name="f", arguments_text="[1, 2]").arguments is None  # JSON, but not an object
    assert ToolCall(name="f", arguments_text="{bad").arguments is None
    wire = {"id": "c9", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}  # some servers send objects
    assert ToolCall.model_validate(wire).arguments == {"x": 1}


def test_reply_message_is_the_assistant_turn():
    call = ToolCall(id="c1", name="add", arguments={"a": 1})
    assert Reply(text="", tool_calls=[call]).message.model_dump()["content"] is None
    assert Reply(text="thinking", tool_calls=(call,)).message.content == "thinking"
    assert Reply(text="").message.model_dump() == {"role": "assistant", "content": ""}
    assert Reply(tool_calls=[call]).tool_calls == (call,)  # lists become tuples: a Reply is a value


# --- ScriptedModel ---------------------------------------------------------------------------


def test_scripted_model_scripts_tool_calls_then_text():
    def planner(messages: list[dict]) -> Any:
        if messages[-1]["role"] == "tool":
            return f"The sum is {messages[-1]['content']}."
        return [ToolCall(name="add", arguments={"a": 2, "b": 3}), ToolCall(name="lookup", arguments={"city": "Oslo"})]

    chat, tools = ScriptedModel(default=planner, name="planner"), ToolSet([add, lookup])
    assert isinstance(chat, ChatModel)
    first = chat.complete(QUESTION, tools=tools, tool_choice="auto")
    assert [c.id for c in first.tool_calls] == ["call_1_0", "call_1_1"]  # deterministic ids
    assert first.text == "" and first.finish_reason == "tool_calls" and first.usage.output_tokens > 0
    outcome = tools.run(first.tool_calls[0])
    final = chat.complete([*QUESTION, first.message, outcome.message()])
    assert final.text == "The sum is 5." and final.tool_calls == ()
    assert [s.name for s in chat.requests[0].tools] == ["add", "lookup"] and chat.requests[0].tool_choice == "auto"
    assert chat.calls[1][1]["tool_calls"][0]["id"] == "call_1_0"  # calls are wire dicts


def test_scripted_model_takes_a_reply_as_is_and_streams():
    given = Reply(text="Checking.", tool_calls=[ToolCall(id="t", name="lookup", arguments={"city": "Oslo"})],
                  usage=Usage(1, 2), model="fixed")
    chat = ScriptedModel([given, ToolCall(id="k", name="add", arguments={"a": 1, "b": 1}), "two words"])
    events = list(chat.stream(QUESTION))
    assert events == [TextDelta("Checking."), ToolCallDelta(0, "t", "lookup", '{"city": "Oslo"}'), given]
    assert list(chat.stream(QUESTION))[0] == ToolCallDelta(0, "k", "add", '{"a": 1, "b": 1}')
    tokens: list[str] = []
    assert chat.complete(QUESTION, on_token=tokens.append).text == "two words" and tokens == ["two ", "words"]
    filled = ScriptedModel([Reply(text="On it.", tool_calls=[ToolCall(name="add", arguments={"a": 1})])],
                           name="s").complete(QUESTION)
    assert filled.model == "s" and filled.usage == Usage(10, 2 + 2) and filled.tool_calls[0].id == "call_1_0"


def test_stream_reply_serves_models_that_cannot_stream():
    class Plain:
        name, provider = "plain", "test"

        def complete(self, messages, *, schema=None):
            return Reply(text="whole", usage=Usage(1, 1), model="plain")

    events = list(stream_reply(Plain(), QUESTION))
    assert events == [TextDelta("whole"), Reply(text="whole", usage=Usage(1, 1), model="plain")]
