"""The spans under a step, built from the rows it recorded: model calls and `ctx.span(...)` telemetry.

A `model_calls` row becomes a `chat {model}` span (kind CLIENT) carrying the call's exact request
(the step's `_exchange` row: system instructions, messages with their real roles and parts, tool
definitions, options) and its reply; a call recorded without one (a row a stage emitted itself)
falls back to the prompt it names. A `ctx.span(...)` row becomes a span of its own: memory recall
is a `retrieval` span whose documents carry ids and scores, and their text only with content
capture; other content attributes (`CONTENT_ATTRIBUTES`) are dropped without it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from opentelemetry.trace import SpanKind, Status, StatusCode

from ..genai import (attribute_value, finish_reason, input_messages, output_messages, prompt_request,
                     request_attributes, system_instructions, tool_definitions)
from ..record import Step
from .status import described, error_type

__all__ = ["CONTENT_ATTRIBUTES", "Export", "chat_span", "custom_span", "reply_message"]

CONTENT_ATTRIBUTES = frozenset({
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.prompt",
    "gen_ai.completion", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.retrieval.query.text",
    "gen_ai.tool.definitions", "tracemem.input", "tracemem.output", "tracemem.query", "tracemem.logs",
    "tracemem.decision.evidence",
})
"""Attributes that carry content: dropped from `ctx.span(...)` rows unless capture_content=True
(`gen_ai.retrieval.documents` keeps each document's id and score, and loses its `content`)."""

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
          "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}


@dataclass(frozen=True)
class Export:
    """How an exporter builds spans: whether content goes out, and the OpenInference attribute builders
    (tracemem/otel/openinference.py) when asked for, else None."""

    capture_content: bool = False
    openinference: Any = None


def reply_message(row: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """A `model_calls` row's reply as a wire message (None when the call got none)."""
    if row.get("response") is None:
        return None
    calls = row.get("tool_calls")
    calls = json.loads(calls) if isinstance(calls, str) else calls or []
    message: dict[str, Any] = {"role": "assistant", "content": row["response"] if row["response"] or not calls else None}
    if calls:
        message["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                  "function": {"name": c.get("name"), "arguments": c.get("arguments")}} for c in calls]
    return message


def chat_span(tracer: Any, context: Any, export: Export, run_id: str, step: Step, row: Mapping[str, Any],
              request: Optional[Mapping[str, Any]], prompt: Optional[Mapping[str, Any]],
              session: Optional[str]) -> None:
    """The `chat {model}` span of one model call. `request`: its `_exchange` row; `prompt`: the prompts row it
    names (used when there is no exchange)."""
    model = row.get("model")
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    for key, column in (("gen_ai.provider.name", "provider"), ("gen_ai.request.model", "model"),
                        ("gen_ai.usage.input_tokens", "input_tokens"),
                        ("gen_ai.usage.output_tokens", "output_tokens"), ("tracemem.prompt_id", "prompt_id"),
                        ("tracemem.call_id", "call_id")):
        value = row.get(column)
        if value is not None:
            attributes[key] = value
    if model is not None and not row.get("error"):
        attributes["gen_ai.response.model"] = model
    if row.get("response") is not None or row.get("error"):
        attributes["gen_ai.response.finish_reasons"] = [finish_reason(row)]
    if session is not None:
        attributes["gen_ai.conversation.id"] = session
    attributes["tracemem.run_id"] = run_id
    attributes["tracemem.step"] = step.step
    if row.get("error"):
        attributes["error.type"] = error_type(str(row["error"]))
    if request is None and prompt is not None:
        system, messages = prompt_request(prompt)
        request = {"system": system, "messages": messages, "tools": None, "options": None}
    if request is not None:
        attributes.update(request_attributes(request.get("options")))
    if export.capture_content:
        for key, value in (("gen_ai.system_instructions", system_instructions(request["system"]) if request else None),
                           ("gen_ai.input.messages", input_messages(request["messages"]) if request else None),
                           ("gen_ai.output.messages", output_messages(row)),
                           ("gen_ai.tool.definitions", tool_definitions(request.get("tools")) if request else None)):
            if value is not None:
                attributes[key] = value
    if export.openinference is not None:
        attributes.update(export.openinference.llm_attributes(row, request, reply_message(row), session,
                                                              export.capture_content))
    started = row.get("started_at")
    start = started if isinstance(started, int) else step.started_at
    latency = row.get("latency_ms")
    end = start + int(latency * 1e6) if isinstance(latency, (int, float)) else step.ended_at
    span = tracer.start_span(f"chat {model}" if model else "chat", context=context, kind=SpanKind.CLIENT,
                             attributes=attributes, start_time=start)
    if row.get("error"):
        span.set_status(Status(StatusCode.ERROR, described(str(row["error"]), "model call failed",
                                                           export.capture_content)))
    span.end(end_time=max(end, start))


def _documents(value: Any, capture_content: bool) -> Optional[list[dict[str, Any]]]:
    """Retrieved documents as the conventions list them: id and score, and `content` only with capture."""
    if not isinstance(value, (list, tuple)):
        return None
    return [{k: v for k, v in doc.items() if capture_content or k != "content"} for doc in value
            if isinstance(doc, Mapping)]


def custom_span(tracer: Any, context: Any, export: Export, run_id: str, step: Step, row: Mapping[str, Any]) -> None:
    """A `ctx.span(name, kind=..., attributes=..., start_ns=..., end_ns=...)` row."""
    attributes: dict[str, Any] = {}
    documents: Optional[list[dict[str, Any]]] = None
    for key, value in (row.get("attributes") or {}).items():
        if key in CONTENT_ATTRIBUTES and not export.capture_content:
            continue
        if key == "gen_ai.retrieval.documents":
            documents = _documents(value, export.capture_content)
            value = json.dumps(documents, default=str, ensure_ascii=False) if documents is not None else value
        value = attribute_value(value)
        if value is not None:
            attributes[str(key)] = value
    attributes.setdefault("tracemem.run_id", run_id)
    attributes.setdefault("tracemem.step", step.step)
    if export.openinference is not None:
        attributes.update(export.openinference.custom_attributes(
            {**(row.get("attributes") or {}), **attributes}, documents, export.capture_content))
    start = row.get("start_ns") or step.started_at
    end = row.get("end_ns") or step.ended_at
    kind = row.get("kind")
    span = tracer.start_span(str(row.get("name") or "span"), context=context,
                             kind=kind if isinstance(kind, SpanKind) else _KINDS.get(str(kind).lower(),
                                                                                    SpanKind.INTERNAL),
                             attributes=attributes, start_time=start)
    if "error.type" in attributes:
        span.set_status(Status(StatusCode.ERROR, str(attributes["error.type"])))
    span.end(end_time=max(end, start))
