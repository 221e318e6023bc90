"""GenAI semantic-convention values built from recorded rows: messages as role and parts, tool calls.

OpenTelemetry export (`tracemem.otel`) puts these on spans. They are plain JSON made
from what the store records (a `prompts` row, a `model_calls` row, a `tool_calls` row),
so this module needs nothing from OpenTelemetry; content goes out only when the
exporter was asked to capture it.
"""
from __future__ import annotations

import json
from typing import Any, Optional

__all__ = ["attribute_value", "text_parts", "input_messages", "output_messages", "tool_call_attributes"]


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


def text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):  # already parts
        return [p if isinstance(p, dict) else {"type": "text", "content": str(p)} for p in content]
    return [{"type": "text", "content": "" if content is None else str(content)}]


def input_messages(prompt: dict[str, Any]) -> Optional[str]:
    """A `prompts` row as `gen_ai.input.messages` (JSON, role + parts)."""
    messages = prompt.get("messages")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            messages = None
    if isinstance(messages, list) and messages:
        return json.dumps([{"role": m.get("role", "user"), "parts": text_parts(m.get("content"))}
                           if isinstance(m, dict) else {"role": "user", "parts": text_parts(m)}
                           for m in messages], default=str)
    if prompt.get("text") is not None:
        return json.dumps([{"role": "user", "parts": text_parts(prompt["text"])}])
    return None


def output_messages(row: dict[str, Any]) -> Optional[str]:
    """A `model_calls` row's reply as `gen_ai.output.messages`: its text, and a part per tool call it asked for."""
    if row.get("response") is None:
        return None
    calls = row.get("tool_calls")
    calls = json.loads(calls) if isinstance(calls, str) else calls or []
    parts = text_parts(row["response"]) if row["response"] or not calls else []
    parts += [{"type": "tool_call", "id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
              for c in calls]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": "tool_calls" if calls else "stop"}],
                      default=str)


def tool_call_attributes(row: dict[str, Any], capture_content: bool) -> dict[str, Any]:
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
