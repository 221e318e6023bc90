"""GenAI semantic-convention values built from what a run recorded: messages as roles and parts, tools.

OpenTelemetry export (`tracemem.otel`) puts these on spans. They are plain JSON made from
records: a call's exact request (wire messages, tracemem/exchange.py), a `model_calls` row,
a `tool_calls` row, so this module needs nothing from OpenTelemetry. The shapes are the
conventions' JSON schemas: a message is `{"role", "parts"}`, a part is `text` (`content`),
`tool_call` (`id`, `name`, `arguments`) or `tool_call_response` (`id`, `response`); system
instructions are a list of parts. Content goes out only when the exporter captures it.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

__all__ = ["attribute_value", "parts_of", "message_of", "input_messages", "system_instructions",
           "output_messages", "prompt_request", "tool_definitions", "tool_call_attributes", "request_attributes",
           "finish_reason"]

# options a call may pass, as the conventions name them
_REQUEST = {"temperature": "gen_ai.request.temperature", "max_tokens": "gen_ai.request.max_tokens",
            "max_completion_tokens": "gen_ai.request.max_tokens", "top_p": "gen_ai.request.top_p",
            "top_k": "gen_ai.request.top_k", "seed": "gen_ai.request.seed", "stop": "gen_ai.request.stop_sequences",
            "frequency_penalty": "gen_ai.request.frequency_penalty",
            "presence_penalty": "gen_ai.request.presence_penalty", "n": "gen_ai.request.choice.count"}


def attribute_value(value: Any) -> Any:
    """An attribute value OpenTelemetry accepts (None = leave the attribute out)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in value):
        return list(value)
    return json.dumps(value, default=str)


def _arguments(text: Any) -> Any:
    """Tool call arguments as the JSON they are, or the raw text the model sent when they are not JSON."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, list):  # OpenAI content parts: text as a text part, anything else as it is
        return [{"type": "text", "content": p.get("text", "")} if isinstance(p, Mapping) and p.get("type") == "text"
                else dict(p) if isinstance(p, Mapping) else {"type": "text", "content": str(p)} for p in content]
    return [{"type": "text", "content": str(content)}]


def parts_of(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A wire message's parts: a tool result as `tool_call_response`, its text, each tool call it asks for."""
    if message.get("role") == "tool":
        return [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}]
    parts = _content_parts(message.get("content"))
    for call in message.get("tool_calls") or ():
        fn = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        parts.append({"type": "tool_call", "id": call.get("id") if isinstance(call, Mapping) else None,
                      "name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))})
    return parts


def message_of(message: Mapping[str, Any]) -> dict[str, Any]:
    """One wire message as a conventions message: its real role and parts (and its `name`, when it has one)."""
    out: dict[str, Any] = {"role": message.get("role") or "user", "parts": parts_of(message)}
    if message.get("name"):
        out["name"] = message["name"]
    return out


def input_messages(messages: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """`gen_ai.input.messages`: the conversation a call sent (after its system instructions), as JSON."""
    if not messages:
        return None
    return json.dumps([message_of(m) for m in messages], default=str, ensure_ascii=False)


def system_instructions(system: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """`gen_ai.system_instructions`: the parts of a call's leading system messages, as JSON."""
    parts = [p for m in system for p in _content_parts(m.get("content"))]
    return json.dumps(parts, default=str, ensure_ascii=False) if parts else None


def finish_reason(row: Mapping[str, Any]) -> str:
    """Why the reply ended, as the conventions name it: `tool_call` when it asked for tools, `error` when the
    call failed, else `stop`."""
    if row.get("error"):
        return "error"
    calls = row.get("tool_calls")
    return "tool_call" if calls and calls != "null" else "stop"


def output_messages(row: Mapping[str, Any]) -> Optional[str]:
    """A `model_calls` row's reply as `gen_ai.output.messages`: its text, and a part per tool call it asked for."""
    if row.get("response") is None:
        return None
    calls = row.get("tool_calls")
    calls = json.loads(calls) if isinstance(calls, str) else calls or []
    parts = _content_parts(row["response"]) if row["response"] or not calls else []
    if not parts and not calls:
        parts = [{"type": "text", "content": ""}]
    parts += [{"type": "tool_call", "id": c.get("id"), "name": c.get("name"), "arguments": _arguments(c.get("arguments"))}
              for c in calls]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": finish_reason(row)}], default=str,
                      ensure_ascii=False)


def prompt_request(prompt: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system, messages) from a `prompts` row, for a call recorded without its exact request (a row a stage
    emitted itself): its messages when it kept them, else its text as the system instructions."""
    messages = prompt.get("messages")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            messages = None
    if isinstance(messages, list) and messages:
        wire = [m if isinstance(m, Mapping) else {"role": "user", "content": str(m)} for m in messages]
        lead = 0
        while lead < len(wire) and wire[lead].get("role") in ("system", "developer"):
            lead += 1
        return [dict(m) for m in wire[:lead]], [dict(m) for m in wire[lead:]]
    if prompt.get("text") is not None:
        return [{"role": "system", "content": prompt["text"]}], []
    return [], []


def tool_definitions(tools: Optional[Sequence[Any]]) -> Optional[str]:
    """`gen_ai.tool.definitions`: each tool's type, name, description and parameters, as JSON."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else {"name": str(tool)}
        out.append({"type": tool.get("type", "function") if isinstance(tool, Mapping) else "function",
                    "name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")})
    return json.dumps(out, default=str, ensure_ascii=False)


def request_attributes(options: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """`gen_ai.request.*` from a call's options (temperature, max_tokens, ...; the rest stays in the store)."""
    attributes: dict[str, Any] = {}
    for key, value in (options or {}).items():
        name = _REQUEST.get(key)
        if name is None:
            continue
        if name == "gen_ai.request.stop_sequences":
            value = [value] if isinstance(value, str) else value
        value = attribute_value(value)
        if value is not None:
            attributes[name] = value
    return attributes


def tool_call_attributes(row: Mapping[str, Any], capture_content: bool) -> dict[str, Any]:
    """A `tool_calls` row on its tool step's span: name, call id, the error; arguments and result only when
    content is captured."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": row["name"],
                                  "gen_ai.tool.type": "function", "gen_ai.tool.call.id": row.get("call_id") or ""}
    if row.get("error"):
        attributes["error.type"] = str(row.get("error_kind") or "_OTHER")
    if capture_content:
        if row.get("arguments_text") is not None:
            attributes["gen_ai.tool.call.arguments"] = row["arguments_text"]
        if row.get("result") is not None:
            attributes["gen_ai.tool.call.result"] = row["result"]
    return attributes
