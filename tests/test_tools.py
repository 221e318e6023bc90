"""Tools: schemas derived from functions, arguments validated, outcomes that never crash a run."""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

import tracemem.models
import tracemem.tools
from tracemem.errors import TracememError
from tracemem.models import ToolCall
from tracemem.tools import (MAX_RESULT_CHARS, Tool, ToolArgumentsError, ToolDefinitionError, ToolError, ToolSet,
                            UnknownToolError, cap_text, parse_docstring, render_result, tool)


class Color(str, enum.Enum):
    red = "red"
    blue = "blue"


class Address(BaseModel):
    city: str
    zip: Optional[str] = None


@tool
def paint(address: Address, color: Color, coats: int = 2, finish: Literal["matte", "gloss"] = "matte",
          title: Annotated[str, Field(description="shown on the invoice")] = "") -> str:
    """Paint a house.

    Books a painter for the address.

    Args:
        address: Where the house is.
        color (Color): Which paint to use,
            from the catalogue.
        coats: How many coats.
        title: Ignored here: the Annotated description wins.

    Returns:
        A booking reference.
    """
    return f"{address.city}/{color.value}/{coats}/{finish}"


def test_schema_from_type_hints_and_docstring():
    spec = paint.openai_schema()["function"]
    assert spec["name"] == "paint" and spec["description"] == "Paint a house.\n\nBooks a painter for the address."
    params = spec["parameters"]
    assert params["required"] == ["address", "color"] and params["additionalProperties"] is False
    props = params["properties"]
    assert props["coats"] == {"default": 2, "description": "How many coats.", "type": "integer"}
    assert props["color"]["description"] == "Which paint to use, from the catalogue."
    assert props["finish"] == {"default": "matte", "enum": ["matte", "gloss"], "type": "string"}
    assert props["title"]["description"] == "shown on the invoice"
    assert params["$defs"]["Address"]["properties"]["city"] == {"type": "string"}  # generated titles dropped
    assert params["$defs"]["Color"]["enum"] == ["red", "blue"]
    assert "title" in props  # a parameter called title survives the title stripping


def test_validate_accepts_dicts_json_text_and_bytes_and_returns_typed_values():
    kwargs = paint.validate('{"address": {"city": "Oslo"}, "color": "red", "coats": "3"}')
    assert kwargs == {"address": Address(city="Oslo"), "color": Color.red, "coats": 3, "finish": "matte", "title": ""}
    assert paint.validate(b'{"address": {"city": "Bergen"}, "color": "blue"}')["address"].city == "Bergen"
    assert paint(Address(city="X"), Color.blue) == "X/blue/2/matte"  # the Tool still calls like the function


@pytest.mark.parametrize("arguments, field, fragment", [
    ('{"address": {"city": "Oslo"}}', "color", "Field required"),
    ('{"address": {"city": "Oslo"}, "color": "green"}', "color", "got \"green\""),
    ('{"address": {"zip": "1"}, "color": "red"}', "address.city", "Field required"),
    ('{"address": {"city": "Oslo"}, "color": "red", "brush": "wide"}', "brush", "Extra inputs"),
    ('{"address": ', None, "not valid JSON"),
    ('["red"]', None, "must be a JSON object"),
])
def test_validation_errors_name_the_tool_and_the_field(arguments, field, fragment):
    with pytest.raises(ToolArgumentsError) as info:
        paint.validate(arguments)
    err = info.value
    assert err.tool == "paint" and err.field == field and fragment in str(err) and "'paint'" in str(err)
    assert isinstance(err, ValueError) and isinstance(err, TracememError)


def test_sync_and_async_tools_call_and_acall():
    @tool
    async def double(x: int) -> int:
        """:param x: the number to double"""
        await asyncio.sleep(0)
        return 2 * x

    assert double.is_async and double.parameters["properties"]["x"]["description"] == "the number to double"
    assert double.call({"x": 2}) == 4 and paint.call({"address": {"city": "A"}, "color": "red"}) == "A/red/2/matte"

    async def inside() -> tuple[int, str]:
        with pytest.raises(ToolError, match="acall"):
            double.call({"x": 1})
        return await double.acall('{"x": 5}'), await paint.acall({"address": {"city": "B"}, "color": "blue"})

    assert asyncio.run(inside()) == (10, "B/blue/2/matte")


def test_injected_parameters_are_hidden_from_the_model_and_supplied_by_the_caller():
    @tool(inject=("scope",), name="remember")
    def note(text: str, scope: dict) -> str:
        """Keep a note."""
        scope.setdefault("notes", []).append(text)
        return "noted"

    assert list(note.parameters["properties"]) == ["text"]
    scope: dict[str, Any] = {}
    assert note.call({"text": "hi"}, scope=scope) == "noted" and scope == {"notes": ["hi"]}
    with pytest.raises(ToolArgumentsError, match="'scope'"):  # the model cannot forge it
        note.call({"text": "x", "scope": {}}, scope=scope)
    with pytest.raises(ToolError, match="needs 'scope' injected"):
        note.call({"text": "x"})
    outcome = ToolSet([note]).run(ToolCall(id="c", name="remember", arguments={"text": "yo"}), scope=scope, ctx=None)
    assert outcome.ok and scope["notes"] == ["hi", "yo"]


def test_definition_errors_are_clear():
    def star(*args: int) -> int:
        return 0

    with pytest.raises(ToolDefinitionError, match="VAR_POSITIONAL|variadic"):
        Tool.from_function(star)
    with pytest.raises(ToolDefinitionError, match="pass name="):
        tool(lambda x: x)
    assert tool(name="ident")(lambda x: x).parameters["properties"] == {"x": {}}
    with pytest.raises(ToolDefinitionError, match="not allowed"):
        tool(name="has space")(paint.function)

    def unresolvable(x: "NoSuchType") -> None:  # noqa: F821
        pass

    with pytest.raises(ToolDefinitionError, match="type hints"):
        tool(unresolvable)
    with pytest.raises(ToolDefinitionError, match="not parameters"):
        tool(inject=("ctx",))(paint.function)
    with pytest.raises(ToolDefinitionError, match="two tools are named 'paint'"):
        ToolSet([paint, paint.function])


# --- running calls: outcomes ----------------------------------------------------------------------


def boom(why: str) -> str:
    """Fails on purpose."""
    raise ValueError(f"cannot: {why}")


def big(n: int) -> str:
    """A long result."""
    return "x" * n


TOOLS = ToolSet([paint, boom, big], max_result_chars=100)


def test_a_successful_call():
    call = ToolCall(id="c1", name="paint", arguments={"address": {"city": "Oslo"}, "color": "red"})
    out = TOOLS.run(call)
    assert out.ok and out.result == out.content == "Oslo/red/2/matte" and out.error is None
    assert (out.call_id, out.name, out.arguments, out.truncated, out.original_chars) == (
        "c1", "paint", call.arguments, False, 16)
    assert out.duration_ms >= 0 and out.started_at > 0
    assert out.message().model_dump() == {"role": "tool", "content": "Oslo/red/2/matte", "tool_call_id": "c1"}


@pytest.mark.parametrize("call, kind, fragment", [
    (ToolCall(id="a", name="boom", arguments={"why": "rain"}), "raised", "failed: ValueError: cannot: rain"),
    (ToolCall(id="b", name="paint", arguments_text='{"color": "red",'), "bad_arguments", "not valid JSON"),
    (ToolCall(id="c", name="paint", arguments={"color": "red"}), "bad_arguments", "'address': Field required"),
    (ToolCall(id="d", name="sculpt", arguments={}), "unknown_tool", "no tool named 'sculpt' (available: paint, boom, big)"),
])
def test_failures_become_tool_results_stating_the_error(call, kind, fragment):
    for out in (TOOLS.run(call), asyncio.run(TOOLS.arun(call))):
        assert not out.ok and out.error_kind == kind and fragment in out.content and out.content.startswith("Error: ")
        assert out.result is None and out.error and out.message().tool_call_id == call.id


def test_a_result_over_the_cap_is_cut_and_says_so():
    out = TOOLS.run(ToolCall(id="z", name="big", arguments={"n": 1000}))
    assert out.ok and out.truncated and out.original_chars == 1000 and len(out.content) <= 100
    assert "truncated" in out.content and "of 1000 characters" in out.content and out.result == "x" * 1000
    assert MAX_RESULT_CHARS == ToolSet([]).max_result_chars == 20_000


def test_parallel_sync_tools_run_concurrently_under_arun():
    barrier = threading.Barrier(2, timeout=5)  # passes only if both calls are in flight at once

    @tool
    def meet(who: str) -> str:
        """Wait for the other call."""
        barrier.wait()
        return who

    tools = ToolSet([meet])

    async def both() -> list[str]:
        calls = [ToolCall(id=str(i), name="meet", arguments={"who": w}) for i, w in enumerate("ab")]
        return [o.content for o in await asyncio.gather(*(tools.arun(c) for c in calls))]

    assert asyncio.run(both()) == ["a", "b"]


def test_async_tool_run_from_sync_code_and_refused_inside_a_loop():
    @tool
    async def later(x: int) -> int:
        """Async."""
        return x + 1

    tools, call = ToolSet([later]), ToolCall(id="q", name="later", arguments={"x": 1})
    assert tools.run(call).content == "2"

    async def inside() -> Any:
        return tools.run(call)

    out = asyncio.run(inside())
    assert out.error_kind == "setup" and "arun" in out.content


# --- helpers -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int


def test_render_result():
    loop: list[Any] = []
    loop.append(loop)
    assert render_result("text") == "text" and render_result(None) == "null" and render_result(b"by") == "by"
    assert render_result(Address(city="Oslo")) == '{"city":"Oslo","zip":null}'
    assert render_result(Point(1, 2)) == '{"x":1,"y":2}' and render_result({"s": {1}}) == '{"s":[1]}'
    assert render_result(loop) == "[[...]]"


@pytest.mark.parametrize("size", [0, 5, 60, 61, 200, 5000])
@pytest.mark.parametrize("cap", [1, 10, 60, 100])
def test_cap_text_never_exceeds_the_cap(size, cap):
    text, cut = cap_text("y" * size, cap)
    assert len(text) <= cap and cut == (size > cap)
    if not cut:
        assert text == "y" * size
    elif cap >= 60:  # room for the notice: the kept head, then what was cut
        head, notice = text.split("\n[truncated: ")
        assert head == "y" * len(head) and notice == f"showing the first {len(head)} of {size} characters]"


def test_parse_docstring_styles():
    google = """Summary line.

    Args:
        a (int): First,
            continued.
        *rest: Ignored style.
    Raises:
        ValueError: not a parameter.
    """
    assert parse_docstring(google) == ("Summary line.", {"a": "First, continued.", "rest": "Ignored style."})
    numpy = """Summary.

    Parameters
    ----------
    a : int
        The a.
    b
        The b.

    Returns
    -------
    int
        Not a parameter.
    """
    assert parse_docstring(numpy) == ("Summary.", {"a": "The a.", "b": "The b."})
    sphinx = """Summary.

    :param a: The a,
        more.
    :param int b: The b.
    :returns: nothing
    """
    assert parse_docstring(sphinx) == ("Summary.", {"a": "The a, more.", "b": "The b."})
    assert parse_docstring(None) == ("", {}) and parse_docstring("Just text.") == ("Just text.", {})


# --- the public surface is a contract ------------------------------------------------------------


@pytest.mark.parametrize("module", [tracemem.models, tracemem.tools])
def test_all_lists_exactly_the_public_names(module):
    public = {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, type(tracemem))}
    assert sorted(module.__all__) == module.__all__ and set(module.__all__) == public


def test_tool_errors_form_one_tree():
    for cls in (ToolArgumentsError, ToolDefinitionError, UnknownToolError):
        assert issubclass(cls, ToolError) and issubclass(cls, TracememError)
    assert issubclass(UnknownToolError, LookupError) and not issubclass(UnknownToolError, KeyError)


def test_bind_and_outcome_let_a_caller_run_the_function_itself():
    call = ToolCall(id="p", name="paint", arguments={"address": {"city": "Rome"}, "color": "blue", "coats": 1})
    one, kwargs = TOOLS.bind(call)
    assert one is TOOLS["paint"] and kwargs["coats"] == 1 and kwargs["address"] == Address(city="Rome")
    done = TOOLS.outcome(call, one.function(**kwargs), started_at=5, duration_ms=1.5)
    assert (done.content, done.started_at, done.duration_ms, done.ok) == ("Rome/blue/1/matte", 5, 1.5, True)
    failed = TOOLS.outcome(call, error=TimeoutError("took too long"))
    assert failed.error_kind == "raised" and failed.content == "Error: tool 'paint' failed: TimeoutError: took too long"
    with pytest.raises(UnknownToolError):
        TOOLS.bind(ToolCall(id="u", name="nope"))
