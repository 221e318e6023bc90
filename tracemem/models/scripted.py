"""``ScriptedModel``: a deterministic chat model for tests, examples and the demo.

Same input, same output, no network, yet it behaves like a real adapter: it can
answer with text, structured JSON, tool calls (one or several in parallel) or a full
``Reply``, and it streams its text word by word, so a tool loop or a streaming chat
UI can be built and tested without a server.
"""
from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from pydantic import BaseModel

from .errors import ModelError
from .messages import MessageLike, ToolCall, ToolSpec, tool_specs, wire_messages
from .openai_wire import excerpt
from .protocol import (Reply, Schema, StreamEvent, TextDelta, TokenCallback, ToolCallDelta, ToolChoice, Usage,
                       count_tokens_estimate)

WireMessages = list[dict[str, Any]]
ReplySpec = Union[str, BaseModel, dict, list, ToolCall, Reply, Callable[[WireMessages], Any]]
"""A scripted answer: text; a pydantic model, dict or list (sent as JSON text); a ``ToolCall``
or a list of them (parallel calls, no text); a ``Reply`` (text and tool calls together; an
empty model name or unknown usage is filled in); or a function of the messages (as OpenAI
wire dicts) returning any of these."""
Pattern = Union[str, re.Pattern[str], Callable[[WireMessages], bool]]


@dataclass(frozen=True)
class ScriptedCall:
    """What one call asked for: the messages (wire dicts) and the tools, tool choice and schema offered."""

    messages: WireMessages
    tools: tuple[ToolSpec, ...]
    tool_choice: ToolChoice
    schema: Schema


def _last_user(messages: WireMessages) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content") or "")
    return ""


def _matches(pattern: Pattern, messages: WireMessages) -> bool:
    if isinstance(pattern, str):
        return pattern in _last_user(messages)
    if isinstance(pattern, re.Pattern):
        return pattern.search(_last_user(messages)) is not None
    if callable(pattern):
        return bool(pattern(messages))
    raise TypeError(f"rule pattern must be a str, compiled regex or callable, got {pattern!r}")


def _is_calls(value: Any) -> bool:
    return isinstance(value, ToolCall) or (isinstance(value, (list, tuple)) and bool(value)
                                           and all(isinstance(v, ToolCall) for v in value))


class ScriptedModel:
    """A deterministic model: same input, same output, no network.

    For each call: the first matching rule wins; otherwise the next unused entry of
    ``replies``; otherwise ``default``; otherwise ModelError(kind="script"). Rule patterns
    (substring / regex) are matched against the last user message; a callable pattern
    or reply gets every message as a wire dict (so it can look for ``role == "tool"``).
    Tool calls without an id get ``call_{n}_{i}`` (call number, position): deterministic.
    ``calls`` keeps each call's messages; ``requests`` also keeps the tools offered.
    """

    def __init__(
        self,
        replies: Optional[list[ReplySpec]] = None,
        *,
        rules: Optional[list[tuple[Pattern, ReplySpec]]] = None,
        default: Optional[ReplySpec] = None,
        name: str = "scripted",
        provider: str = "scripted",
    ) -> None:
        self.replies = list(replies or [])
        self.rules = list(rules or [])
        self.default = default
        self.name = name
        self.provider = provider
        self.calls: list[WireMessages] = []
        self.requests: list[ScriptedCall] = []
        self._cursor = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"ScriptedModel(name={self.name!r}, replies={len(self.replies)}, "
                f"rules={len(self.rules)}, default={'set' if self.default is not None else None})")

    def complete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                 tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                 on_token: Optional[TokenCallback] = None) -> Reply:
        """The scripted reply for these messages (``schema`` and ``tool_choice`` are recorded, not enforced)."""
        snapshot = wire_messages(messages)
        specs = tuple(tool_specs(tools))
        with self._lock:
            self.calls.append(snapshot)
            self.requests.append(ScriptedCall(snapshot, specs, tool_choice, schema))
            call_no = len(self.calls)
            spec = self._choose(snapshot, call_no)
        reply = self._reply(spec, snapshot, call_no)
        if on_token is not None:
            for piece in _pieces(reply.text):
                on_token(piece)
        return reply

    async def acomplete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                        tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                        on_token: Optional[TokenCallback] = None) -> Reply:
        """Async variant; scripted replies are instant, so no thread is needed."""
        return self.complete(messages, schema=schema, tools=tools, tool_choice=tool_choice, on_token=on_token)

    def stream(self, messages: Sequence[MessageLike], *, schema: Schema = None,
               tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None) -> Iterator[StreamEvent]:
        """The scripted reply as a stream: its text word by word, each tool call, then the Reply."""
        reply = self.complete(messages, schema=schema, tools=tools, tool_choice=tool_choice)
        for piece in _pieces(reply.text):
            yield TextDelta(piece)
        for index, call in enumerate(reply.tool_calls):
            yield ToolCallDelta(index, call.id, call.name, call.arguments_text)
        yield reply

    async def astream(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                      tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None) -> AsyncIterator[StreamEvent]:
        """``stream`` for async code."""
        for event in self.stream(messages, schema=schema, tools=tools, tool_choice=tool_choice):
            yield event

    def _reply(self, spec: ReplySpec, messages: WireMessages, call_no: int) -> Reply:
        value = spec(messages) if callable(spec) and not isinstance(spec, (ToolCall, BaseModel)) else spec
        prompt_tokens = sum(count_tokens_estimate(str(m.get("content") or "")) for m in messages)
        if isinstance(value, Reply):  # as given; a missing model name, usage or call id is filled in
            calls = _with_ids(value.tool_calls, call_no)
            out = sum(count_tokens_estimate(c.arguments_text) for c in calls)
            return dataclasses.replace(
                value, model=value.model or self.name, tool_calls=tuple(calls),
                usage=value.usage if value.usage != Usage() else Usage(prompt_tokens, count_tokens_estimate(value.text) + out))
        if _is_calls(value):
            calls = _with_ids([value] if isinstance(value, ToolCall) else list(value), call_no)
            out = sum(count_tokens_estimate(c.arguments_text) for c in calls)
            return Reply(text="", usage=Usage(prompt_tokens, out), model=self.name, tool_calls=tuple(calls),
                         finish_reason="tool_calls")
        text = _render(value)
        return Reply(text=text, usage=Usage(prompt_tokens, count_tokens_estimate(text)), model=self.name,
                     finish_reason="stop")

    def _choose(self, messages: WireMessages, call_no: int) -> ReplySpec:
        for pattern, spec in self.rules:
            if _matches(pattern, messages):
                return spec
        if self._cursor < len(self.replies):
            spec = self.replies[self._cursor]
            self._cursor += 1
            return spec
        if self.default is not None:
            return self.default
        last = excerpt(_last_user(messages), 120)
        if self.replies:
            why = (f"ran out of replies: {len(self.replies)} were scripted and this is call {call_no}; "
                   "add more replies or a default=")
        else:
            why = "has no rule matching this call and no default; add a rule or a default="
        raise ModelError(f"ScriptedModel {self.name!r} {why} (last user message: {last!r})",
                         kind="script", model=self.name)


def _with_ids(calls: Sequence[ToolCall], call_no: int) -> list[ToolCall]:
    """Tool calls with an id each: ``call_{call number}_{position}`` where none was given."""
    return [c if c.id else c.with_id(f"call_{call_no}_{i}") for i, c in enumerate(calls)]


def _render(value: Any) -> str:
    """Structured values become JSON so schema-using stages work too."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _pieces(text: str) -> list[str]:
    """Text cut the way a tokenizer streams it: each word with the whitespace after it."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
