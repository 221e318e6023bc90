"""``ToolSet``: run the tool calls a model asked for, and never let one crash the run.

Whatever happens (the tool returns, raises, gets arguments that are not JSON or do
not fit, or does not exist), ``run``/``arun`` return a ``ToolOutcome``: the text to
send back to the model (the result, or the error stated so the model can correct
itself), the error for the record, whether the text was cut to the size cap and
from how long, and the timing. This is what a tool agent records per tool step.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Optional, Union

import pydantic_core

from tracemem.errors import PauseSignal
from tracemem.models import Message, ToolCall, ToolSpec

from .errors import ToolArgumentsError, ToolDefinitionError, ToolError, UnknownToolError
from .tool import Tool

MAX_RESULT_CHARS = 20_000
"""Default cap on the text one tool result sends back to the model (about 5k tokens)."""

MAX_ERROR_CHARS = 2_000
"""Cap on an error stated back to the model (whatever ``max_result_chars`` is): enough to say what went wrong."""

OutcomeError = Literal["unknown_tool", "bad_arguments", "raised", "setup"]


def render_result(value: Any) -> str:
    """A tool's return value as text for the model: strings as they are, everything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    try:
        return pydantic_core.to_json(value, fallback=str).decode("utf-8")
    except Exception:  # e.g. a circular structure: say what it is rather than fail the call
        return repr(value)


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """``(text, truncated)``: at most ``max_chars`` characters, the cut stated at the end of the text."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n[truncated: showing the first {{}} of {len(text)} characters]"
    keep = max(max_chars - len(marker.format(max_chars)), 0)
    return (text[:keep] + marker.format(keep))[:max_chars], True


@dataclass(frozen=True)
class ToolOutcome:
    """What running one tool call gave.

    ``content`` is what goes back to the model (``message()`` wraps it as the tool
    message); ``result`` is the tool's Python return value (None on error); ``error`` is
    ``"ExceptionType: message"`` and ``error_kind`` says which failure it was;
    ``original_chars`` is the length of the text before the cap, ``truncated`` whether
    the cap cut it; ``started_at`` is epoch ns, ``duration_ms`` the wall time.
    """

    call_id: str
    name: str
    arguments: Optional[dict[str, Any]]
    arguments_text: str
    content: str
    result: Any = None
    error: Optional[str] = None
    error_kind: Optional[OutcomeError] = None
    truncated: bool = False
    original_chars: int = 0
    started_at: int = 0
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def message(self) -> Message:
        """The tool-result message for the conversation: ``{"role": "tool", "tool_call_id", "content"}``."""
        return Message(role="tool", tool_call_id=self.call_id, content=self.content)

    def recorded(self) -> dict[str, Any]:
        """The outcome as JSON data, all of it but the Python ``result`` (what a replay of the call gives back)."""
        return {f: getattr(self, f) for f in RECORDED}


RECORDED = tuple(f for f in ToolOutcome.__dataclass_fields__ if f != "result")


class ToolSet:
    """The tools a model may call, by name; ``run(call)`` / ``await arun(call)`` give a ``ToolOutcome``.

    A result's text is capped at ``max_result_chars`` (default ``MAX_RESULT_CHARS``), an
    error's at ``MAX_ERROR_CHARS``; the cut is stated in the text and on the outcome.

    Pass it as ``tools=`` to a model (it iterates as its tools). ``injected`` values given
    to ``run``/``arun`` go to the tools that declared them with ``inject=``.
    """

    def __init__(self, tools: Iterable[Union[Tool, Callable[..., Any]]] = (), *,
                 max_result_chars: int = MAX_RESULT_CHARS) -> None:
        if max_result_chars < 1:
            raise ToolDefinitionError(f"max_result_chars must be >= 1, got {max_result_chars}")
        self.max_result_chars = max_result_chars
        self.tools: dict[str, Tool] = {}
        for item in tools:
            one = item if isinstance(item, Tool) else Tool.from_function(item)
            if one.name in self.tools:
                raise ToolDefinitionError(f"two tools are named {one.name!r}; give one a different name=", tool=one.name)
            self.tools[one.name] = one

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __repr__(self) -> str:
        return f"ToolSet({list(self.tools)}, max_result_chars={self.max_result_chars})"

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools.values()]

    def run(self, call: ToolCall, /, **injected: Any) -> ToolOutcome:
        """Run one call in this thread (an async tool gets its own event loop). Never raises for the tool's sake."""
        started, clock = time.time_ns(), time.perf_counter()
        try:
            one, kwargs = self.bind(call, **injected)
            if one.is_async:
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    result = asyncio.run(one.function(**kwargs))
                else:
                    raise ToolError(f"async tool {one.name!r} run with run() inside a running event loop; "
                                    "use `await toolset.arun(call)`", tool=one.name)
            else:
                result = one.function(**kwargs)
        except PauseSignal:  # the tool asked a person (ctx.interrupt): its call pauses, it did not fail
            raise
        except Exception as err:
            return self.outcome(call, error=err, started_at=started, duration_ms=_since(clock))
        return self.outcome(call, result, started_at=started, duration_ms=_since(clock))

    async def arun(self, call: ToolCall, /, **injected: Any) -> ToolOutcome:
        """Run one call from async code: async tools awaited, sync tools in a worker thread."""
        started, clock = time.time_ns(), time.perf_counter()
        try:
            one, kwargs = self.bind(call, **injected)
            result = await one.function(**kwargs) if one.is_async else await asyncio.to_thread(one.function, **kwargs)
        except PauseSignal:
            raise
        except Exception as err:
            return self.outcome(call, error=err, started_at=started, duration_ms=_since(clock))
        return self.outcome(call, result, started_at=started, duration_ms=_since(clock))

    def bind(self, call: ToolCall, /, **injected: Any) -> tuple[Tool, dict[str, Any]]:
        """The tool a call names and its validated keyword arguments (plus the injected values it declared).

        For callers that run the function themselves (their own threads, their own
        recording): raises UnknownToolError, ToolArgumentsError or ToolError; hand the
        error or the result to ``outcome``.
        """
        one = self.tools.get(call.name)
        if one is None:
            known = ", ".join(self.tools) or "none"
            raise UnknownToolError(f"there is no tool named {call.name!r} (available: {known})", tool=call.name)
        arguments = call.arguments if call.arguments is not None else call.arguments_text
        return one, one.bind(arguments, injected)

    def outcome(self, call: ToolCall, result: Any = None, *, error: Optional[BaseException] = None,
                started_at: int = 0, duration_ms: float = 0.0) -> ToolOutcome:
        """The ToolOutcome of a call that returned ``result`` or raised ``error``: text capped, error stated."""
        if error is None:
            text, fields = render_result(result), {"result": result}
        else:
            text = _error_text(call, error)
            fields = {"error": f"{type(error).__name__}: {error}", "error_kind": _error_kind(error)}
        content, truncated = cap_text(text, MAX_ERROR_CHARS if error is not None else self.max_result_chars)
        return ToolOutcome(call.id, call.name, call.arguments, call.arguments_text, content, truncated=truncated,
                           original_chars=len(text), started_at=started_at, duration_ms=duration_ms, **fields)


def _since(clock: float) -> float:
    return (time.perf_counter() - clock) * 1000


def _error_kind(error: BaseException) -> OutcomeError:
    if isinstance(error, UnknownToolError):
        return "unknown_tool"
    if isinstance(error, ToolArgumentsError):
        return "bad_arguments"
    return "setup" if isinstance(error, ToolError) else "raised"


def _error_text(call: ToolCall, error: BaseException) -> str:
    """The error as the model reads it: what went wrong and what to do."""
    kind = _error_kind(error)
    if kind == "unknown_tool":
        return f"Error: {error}. Call one of the available tools."
    if kind == "bad_arguments":
        return f"Error: {error}."
    if kind == "setup":
        return f"Error: tool {call.name!r} could not be run: {error}"
    return f"Error: tool {call.name!r} failed: {type(error).__name__}: {error}"
