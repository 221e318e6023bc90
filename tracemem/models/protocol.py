"""The one interface pipelines depend on: ``ChatModel``, what it returns, and what it streams.

Stages talk to a ``ChatModel`` and never to a vendor SDK, so a run is recorded the
same way whether it used OpenAI, a local vLLM/Ollama/llama.cpp server, or the
deterministic ``ScriptedModel``. The protocol is deliberately small (messages in;
text, tool calls and usage out; tokens to a callback) so that a second adapter, such
as Anthropic's messages API, fits it without new concepts. Streaming is optional:
``stream_reply`` gives every model the same event iterator, streaming or not.
"""
from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Protocol, Union, runtime_checkable

from pydantic import BaseModel

from .messages import Message, MessageLike, ToolCall

Schema = Union[dict[str, Any], type[BaseModel], None]
"""Structured output: a JSON schema dict or a pydantic model class; the reply text is JSON of it."""

ToolChoice = Union[Literal["auto", "none", "required"], str, Mapping[str, Any], None]
"""``"auto"`` (the model decides), ``"none"``, ``"required"`` (some tool), or one tool's name."""

TokenCallback = Callable[[str], None]
"""Called with each text fragment as it arrives (streaming adapters) or once with the whole text."""

INT32_MAX = 2**31 - 1


def usage_count(value: Any) -> Optional[int]:
    """A token count a server reported, or None (unknown) when it is missing, non-numeric,
    negative, fractional or larger than int32: a bad count is never guessed, and never
    raises or overflows a column downstream."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= INT32_MAX else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value) if 0 <= value <= INT32_MAX else None
    return None


@dataclass(frozen=True)
class Usage:
    """Token counts for one call (None = the server did not say, or said something unusable)."""

    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None


@dataclass(frozen=True)
class Reply:
    """What a model said, plus what it cost.

    ``text`` is "" when the model only called tools (``content: null`` on the wire).
    ``raw`` keeps the provider body for forensics (for a stream, the assembled body in
    the non-streamed shape); it is not part of a reply's identity, so a streamed reply
    equals the same reply received whole.
    """

    text: str = ""
    usage: Usage = Usage()
    model: str = ""
    raw: Optional[dict[str, Any]] = field(default=None, compare=False, repr=False)
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    @property
    def message(self) -> Message:
        """The assistant message to append to the conversation (with its tool calls)."""
        content = self.text if (self.text or not self.tool_calls) else None
        return Message(role="assistant", content=content, tool_calls=list(self.tool_calls))


@dataclass(frozen=True)
class TextDelta:
    """A fragment of reply text, as it arrived."""

    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of tool call ``index``: ``id``/``name`` when first seen, then argument text."""

    index: int
    id: Optional[str] = None
    name: Optional[str] = None
    arguments: str = ""
    kind: Literal["tool_call"] = "tool_call"


StreamEvent = Union[TextDelta, ToolCallDelta, Reply]
"""What ``stream()`` yields: deltas as they arrive, then exactly one final ``Reply``."""


@runtime_checkable
class ChatModel(Protocol):
    """The only interface pipelines depend on, so adapters are interchangeable.

    ``messages`` are ``Message`` objects or dicts of the same shape. With ``schema`` the
    reply text is JSON of that shape. ``tools`` are ``tracemem.tools.Tool`` objects,
    ``ToolSpec``s or OpenAI tool dicts; the reply then may carry ``tool_calls``.
    ``on_token`` receives text as it arrives (adapters that cannot stream call it once).
    Adapters that stream also offer ``stream()``/``astream()`` yielding ``StreamEvent``s.
    """

    name: str
    provider: str

    def complete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                 tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                 on_token: Optional[TokenCallback] = None) -> Reply:
        """One chat completion."""
        ...

    async def acomplete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                        tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                        on_token: Optional[TokenCallback] = None) -> Reply:
        """`complete` for async stages."""
        ...


def count_tokens_estimate(text: str) -> int:
    """Whitespace word count: a cheap, deterministic stand-in when no tokenizer is at hand."""
    return len(text.split())


def reply_events(reply: Reply) -> Iterator[StreamEvent]:
    """The events a model that cannot stream gives: its whole text, each tool call, the reply."""
    if reply.text:
        yield TextDelta(reply.text)
    for index, call in enumerate(reply.tool_calls):
        yield ToolCallDelta(index, call.id, call.name, call.arguments_text)
    yield reply


def stream_reply(model: Any, messages: Sequence[MessageLike], **kwargs: Any) -> Iterator[StreamEvent]:
    """``model.stream(...)`` when the model streams, else ``complete`` replayed as events.

    Either way the caller sees deltas then one final ``Reply``, so a chat UI or
    ``flow.stream`` needs one code path for every ``ChatModel``.
    """
    if callable(getattr(model, "stream", None)):
        return iter(model.stream(messages, **kwargs))
    return reply_events(model.complete(messages, **kwargs))


async def astream_reply(model: Any, messages: Sequence[MessageLike], **kwargs: Any) -> AsyncIterator[StreamEvent]:
    """Async ``stream_reply``: ``model.astream(...)`` when there is one, else ``acomplete`` as events."""
    if callable(getattr(model, "astream", None)):
        async for event in model.astream(messages, **kwargs):
            yield event
        return
    for event in reply_events(await model.acomplete(messages, **kwargs)):
        yield event
