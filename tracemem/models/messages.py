"""The chat vocabulary every adapter shares: messages, tool calls and tool definitions.

One pydantic ``Message`` type serves the scope, the prompt and model stages and the
adapters. It dumps to the exact OpenAI wire shape, so a stored conversation can be
sent again as is and stored runs load back into the same objects; the old
``{"role", "content"}`` dicts still validate. ``ToolSpec`` is the provider-neutral
tool definition (name, description, JSON-schema parameters) that each adapter turns
into its own format: OpenAI's ``function`` here, Anthropic's ``input_schema`` would fit.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from .errors import ModelConfigError

Role = Literal["system", "developer", "user", "assistant", "tool"]


def parse_arguments(text: str) -> Optional[dict[str, Any]]:
    """The JSON object a model sent as tool arguments; ``{}`` for blank text, None if not a JSON object."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


M = TypeVar("M", bound=BaseModel)

_ATOMS = frozenset({str, int, float, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (tool arguments): dicts and lists copied, strings and numbers kept;
    anything else by ``copy.deepcopy``. A few times cheaper than ``copy.deepcopy`` on such data."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMS else copy_json(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOMS else copy_json(v) for v in value]
    return value if kind in _ATOMS else copy.deepcopy(value)


def _clone(model: M, **fields: Any) -> M:
    """A copy of a message or tool call with `fields` replaced: what a deep copy of one is (their other fields
    are strings). The scope copies every value it stores, and pydantic's generic deep copy costs ~10x this."""
    clone = object.__new__(type(model))
    object.__setattr__(clone, "__dict__", {**model.__dict__, **fields})
    object.__setattr__(clone, "__pydantic_fields_set__", set(model.__pydantic_fields_set__))
    object.__setattr__(clone, "__pydantic_extra__", None)  # extra="forbid": never any
    object.__setattr__(clone, "__pydantic_private__", None)
    return clone


class ToolCall(BaseModel):
    """One tool call a model asked for.

    ``arguments`` is the parsed JSON object, or None when ``arguments_text`` (what the
    model really sent) is not a JSON object; the tool layer reports that to the model
    instead of crashing. Build one from either: ``ToolCall(name="add", arguments={"a": 1})``
    fills ``arguments_text``, ``ToolCall(name="add", arguments_text='{"a": 1}')`` fills
    ``arguments``. It also validates from the OpenAI wire shape
    ``{"id", "type": "function", "function": {"name", "arguments"}}`` and dumps to it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = ""
    name: str
    arguments: Optional[dict[str, Any]] = None
    arguments_text: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "function" in data:  # the OpenAI wire shape
            fn = data.get("function") or {}
            raw = fn.get("arguments") if isinstance(fn, Mapping) else None
            data = {"id": data.get("id") or "", "name": fn.get("name") if isinstance(fn, Mapping) else None,
                    "arguments_text": raw if isinstance(raw, str) else ("" if raw is None else json.dumps(raw))}
        data = dict(data)
        has_text = bool(data.get("arguments_text"))
        if data.get("arguments") is not None and not has_text:
            try:
                data["arguments_text"] = json.dumps(data["arguments"], ensure_ascii=False)
            except (TypeError, ValueError):
                pass  # left to field validation, which names the problem
        elif data.get("arguments") is None and isinstance(data.get("arguments_text"), str):
            data["arguments"] = parse_arguments(data["arguments_text"])
        return data

    @model_serializer(mode="plain")
    def _wire(self) -> dict[str, Any]:
        return self.wire()

    def wire(self) -> dict[str, Any]:
        """The OpenAI wire shape, what ``model_dump()`` gives, built directly (a third of the cost: it is
        built for every message of every model call, and again for the call's request hash)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_text}}

    def with_id(self, call_id: str) -> "ToolCall":
        """This call with ``id`` set: a copy (a ToolCall is frozen) sharing the arguments, as ``model_copy`` would."""
        return _clone(self, id=call_id)

    def __copy__(self) -> "ToolCall":  # what pydantic's does (no extra, no private attributes), a few times faster
        return _clone(self) if type(self) is ToolCall else super().__copy__()

    def __deepcopy__(self, memo: Optional[dict[int, Any]] = None) -> "ToolCall":
        return _clone(self, arguments=copy_json(self.arguments))


class Message(BaseModel):
    """One chat message; ``model_dump()`` is the OpenAI wire shape (``content`` always present).

    ``content`` is None only for an assistant message that carries ``tool_calls`` and
    no text; a tool result is ``Message(role="tool", tool_call_id=..., content=...)``.
    ``message["content"]`` and ``message.get("role")`` read like the dicts earlier
    versions used, so code written against dict messages keeps working.
    """

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: Optional[str] = None
    tool_calls: list[ToolCall] = Field(default_factory=list)  # a factory: no copy of a default per message
    tool_call_id: Optional[str] = None
    name: Optional[str] = None

    @model_serializer(mode="plain")
    def _wire(self) -> dict[str, Any]:
        return self.wire()

    def wire(self) -> dict[str, Any]:
        """The OpenAI wire shape, what ``model_dump()`` gives, built directly (see ``ToolCall.wire``)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.wire() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def __copy__(self) -> "Message":  # what pydantic's does (no extra, no private attributes), a few times faster
        return _clone(self) if type(self) is Message else super().__copy__()

    def __deepcopy__(self, memo: Optional[dict[int, Any]] = None) -> "Message":
        return _clone(self, tool_calls=[c.__deepcopy__(memo) for c in self.tool_calls])

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get`` for code written against dict messages."""
        return getattr(self, key) if key in type(self).model_fields else default


MessageLike = Union[Message, Mapping[str, Any]]


def wire_message(message: MessageLike, index: int = 0) -> dict[str, Any]:
    """One message in the OpenAI wire shape.

    A ``Message`` dumps itself; a dict that validates as a ``Message`` is normalised the
    same way (so ``ToolCall`` objects inside it serialise); any other dict (content parts,
    vendor extras) is sent unchanged, as the caller wrote it.
    """
    if isinstance(message, Message):
        return message.wire()
    if not isinstance(message, Mapping) and callable(getattr(message, "model_dump", None)):
        message = message.model_dump()  # another pydantic model of this shape, or a scope's tracked copy of one
    if isinstance(message, Mapping):
        try:
            return Message.model_validate(message).model_dump()
        except ValidationError:
            return dict(message)
    raise ModelConfigError(f"messages[{index}] is a {type(message).__name__}; each message must be a "
                           "tracemem.models.Message or a dict like {'role': 'user', 'content': '...'}")


def wire_messages(messages: Sequence[MessageLike]) -> list[dict[str, Any]]:
    """Every message in the OpenAI wire shape (see ``wire_message``)."""
    if isinstance(messages, (str, bytes, Mapping)):
        raise ModelConfigError("messages must be a list of messages, e.g. [{'role': 'user', 'content': 'hi'}], "
                               f"not a {type(messages).__name__}")
    return [wire_message(m, i) for i, m in enumerate(messages)]


EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about one tool: name, description and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS), hash=False)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}

    @classmethod
    def coerce(cls, tool: Any, index: int = 0) -> "ToolSpec":
        """A ToolSpec from a ToolSpec, a ``Tool`` (anything with a ``.spec``), or an OpenAI/bare dict."""
        if isinstance(tool, ToolSpec):
            return tool
        spec = getattr(tool, "spec", None)
        if isinstance(spec, ToolSpec):
            return spec
        if isinstance(tool, Mapping):
            fn = tool.get("function") if tool.get("type") == "function" else tool
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"]:
                params = fn.get("parameters")
                return cls(fn["name"], str(fn.get("description") or ""),
                           dict(params) if isinstance(params, Mapping) else dict(EMPTY_PARAMETERS))
        raise ModelConfigError(
            f"tools[{index}] is not a tool: {tool!r:.120}; pass a tracemem.tools.Tool (e.g. from @tool), a ToolSpec, "
            "or a dict like {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")


def tool_specs(tools: Optional[Sequence[Any]]) -> list[ToolSpec]:
    """The tools of a call as ToolSpecs; two tools with one name is an error that names it."""
    specs = [ToolSpec.coerce(t, i) for i, t in enumerate(tools or [])]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ModelConfigError(f"two tools are named {spec.name!r}; tool names must be unique in one call")
        seen.add(spec.name)
    return specs
