"""The tool loop records each call exactly: its own step and rows, errors still reach the model, the request
hash is unchanged, and the cheap copies are still copies."""
from __future__ import annotations

import copy
import threading
from typing import Any

from stages import tool_agent
from tracemem.flow.replay import request_hash
from tracemem.models import Message, ScriptedModel, ToolCall
from tracemem.tools import ToolSet, tool


def _agent(calls: list[ToolCall], tools: list[Any]) -> Any:
    def brain(messages: list[dict[str, Any]]) -> Any:
        return "done" if any(m["role"] == "tool" for m in messages) else calls

    return tool_agent(tools, model=ScriptedModel(default=brain), max_turns=2).build()


def test_tool_calls_of_one_reply_are_each_recorded_as_their_own_step(tmp_path: Any) -> None:
    threads: list[int] = []

    def lookup(city: str) -> str:
        """Weather.

        Args:
            city: The city.
        """
        threads.append(threading.get_ident())
        return f"rain in {city}"

    cities = ["Oslo", "Bergen", "Tromsø", "Bodø"]
    flow = _agent([ToolCall(name="lookup", arguments={"city": c}) for c in cities], [lookup])
    run = flow.run({"question": "weather?"})
    assert len(threads) == len(cities)  # each call ran once (the first in the caller's thread, the rest beside it)
    steps = [s for s in run.steps if s.stage == "tools"]
    assert [s.iteration for s in steps] == [0, 1, 2, 3] and all(s.kind == "tool" for s in steps)
    rows = run.rows["tool_calls"]
    assert [(r["step"], r["arguments"], r["result"], r["error"]) for r in rows] == [
        (s.step, {"city": c}, f"rain in {c}", None) for s, c in zip(steps, cities)]
    for s in steps:  # each step read its element and the conversation, and appended one tool message
        assert [r.path for r in run.reads if r.step == s.step] == ["pending_tool_calls", "messages"]
        assert [(w.path, w.verb) for w in run.writes if w.step == s.step] == [("messages", "append")]
    tool_messages = [m for m in run.output.messages if m.role == "tool"]
    assert [m.content for m in tool_messages] == [f"rain in {c}" for c in cities]
    assert [m.tool_call_id for m in tool_messages] == [r["call_id"] for r in rows]


def test_errors_of_inline_calls_still_become_tool_result_messages() -> None:
    def boom(x: int) -> int:
        """Fails.

        Args:
            x: A number.
        """
        raise RuntimeError(f"no {x}")

    calls = [ToolCall(name="boom", arguments={"x": 1}), ToolCall(name="nope", arguments={}),
             ToolCall(name="boom", arguments_text="{not json")]
    run = _agent(calls, [boom]).run({"question": "q"})
    assert run.status == "ok"
    kinds = [r["error_kind"] for r in run.rows["tool_calls"]]
    assert kinds == ["raised", "unknown_tool", "bad_arguments"]
    texts = [m.content for m in run.output.messages if m.role == "tool"]
    assert "RuntimeError: no 1" in texts[0] and "no tool named 'nope'" in texts[1] and "not valid JSON" in texts[2]


def test_a_tool_that_asks_for_the_scope_still_gets_it_and_its_reads_are_recorded() -> None:
    @tool(inject=("scope",))
    def whoami(scope: Any) -> str:
        """The question asked."""
        return scope.question

    run = _agent([ToolCall(name="whoami", arguments={})], [whoami]).run({"question": "who?"})
    assert run.rows["tool_calls"][0]["result"] == "who?"
    step = next(s.step for s in run.steps if s.stage == "tools")
    assert "question" in [r.path for r in run.reads if r.step == step]


def test_the_request_hash_of_a_conversation_is_unchanged() -> None:
    # computed before the hash learned to dump messages itself: recorded runs must still replay
    def lookup(city: str, days: int = 1) -> str:
        """Weather."""
        return city

    msgs: list[Any] = [Message(role="system", content="be brief"), {"role": "user", "content": "weather?"},
                       Message(role="assistant", tool_calls=[ToolCall(id="c1", name="lookup",
                                                                      arguments={"city": "Oslo"})]),
                       Message(role="tool", tool_call_id="c1", content="rain")]
    options = {"tools": ToolSet([tool(lookup)]).specs, "temperature": 0.2}
    assert request_hash("m1", msgs, options) == "1147beca7b9d841420c2e233052a66ee"


def test_copies_of_messages_and_tool_calls_share_nothing_mutable() -> None:
    call = ToolCall(id="c1", name="f", arguments={"a": [1, {"b": 2}], "c": "x"})
    message = Message(role="assistant", tool_calls=[call])
    deep = copy.deepcopy(message)
    assert deep == message and deep.tool_calls[0] is not call
    assert deep.tool_calls[0].arguments is not call.arguments
    deep.tool_calls[0].arguments["a"][1]["b"] = 3  # type: ignore[index]
    assert call.arguments == {"a": [1, {"b": 2}], "c": "x"}
    shallow = message.model_copy()
    assert shallow == message and shallow is not message
    shallow.content = "changed"
    assert message.content is None
    assert message.model_copy(update={"content": "hi"}).content == "hi"

    class Tagged(Message):
        tag: str = ""

    tagged = Tagged(role="user", content="x", tag="t")
    assert tagged.model_copy() == tagged and type(tagged.model_copy()) is Tagged
