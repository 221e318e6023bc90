"""OpenInference attributes beside the GenAI ones (`OTelListener(..., openinference=True)`), for Phoenix and Arize.

Those tools read a span's kind and its input and output from OpenInference attributes
(`openinference.span.kind`, `input.value`, `output.value`, `llm.input_messages.*`, ...), and show
a span without them as UNKNOWN with empty columns. With this option a run is an AGENT (a pipeline
with tool stages) or a CHAIN, a stage a CHAIN (a tool step a TOOL), a model call an LLM span with
its messages, memory recall a RETRIEVER with its documents, and every span carries the
conversation as `session.id` where it has one. Names come from the maintained
`openinference-semantic-conventions` package (the `otlp` extra), imported only when asked for.
Content (inputs, outputs, messages, document text) goes out only with content capture, as on the
GenAI side.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from openinference.semconv.trace import (DocumentAttributes, MessageAttributes, OpenInferenceMimeTypeValues,
                                         OpenInferenceSpanKindValues, SpanAttributes, ToolAttributes,
                                         ToolCallAttributes)

__all__ = ["run_attributes", "step_attributes", "llm_attributes", "custom_attributes"]

KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
JSON = OpenInferenceMimeTypeValues.JSON.value
TEXT = OpenInferenceMimeTypeValues.TEXT.value


def _io(attributes: dict[str, Any], key: str, value: Optional[str], mime: str = JSON) -> None:
    """`input.value`/`output.value` (key "input"/"output") with its MIME type."""
    if value is None:
        return
    attributes[SpanAttributes.INPUT_VALUE if key == "input" else SpanAttributes.OUTPUT_VALUE] = value
    attributes[SpanAttributes.INPUT_MIME_TYPE if key == "input" else SpanAttributes.OUTPUT_MIME_TYPE] = mime


def run_attributes(agent: bool, name: str, session: Optional[str], input_json: Optional[str]) -> dict[str, Any]:
    """A run span: AGENT (with the agent's name) or CHAIN, its session, its input (content)."""
    attributes: dict[str, Any] = {KIND: (OpenInferenceSpanKindValues.AGENT if agent else
                                         OpenInferenceSpanKindValues.CHAIN).value}
    if agent:
        attributes[SpanAttributes.AGENT_NAME] = name
    if session:
        attributes[SpanAttributes.SESSION_ID] = session
    _io(attributes, "input", input_json)
    return attributes


def step_attributes(tool: Optional[Mapping[str, Any]], tool_name: Optional[str], description: Optional[str],
                    inputs: Optional[str], outputs: Optional[str]) -> dict[str, Any]:
    """A step span: a TOOL (a tool step: its name, description, arguments and result) or a CHAIN, with what the
    step read (`inputs`) and wrote (`outputs`) as JSON when content is captured."""
    if tool is None and tool_name is None:
        attributes: dict[str, Any] = {KIND: OpenInferenceSpanKindValues.CHAIN.value}
        _io(attributes, "input", inputs)
        _io(attributes, "output", outputs)
        return attributes
    attributes = {KIND: OpenInferenceSpanKindValues.TOOL.value,
                  SpanAttributes.TOOL_NAME: (tool or {}).get("name") or tool_name}
    if description:
        attributes[SpanAttributes.TOOL_DESCRIPTION] = description
    if tool is not None:
        if tool.get("call_id"):
            attributes[SpanAttributes.TOOL_ID] = tool["call_id"]
        if inputs is not None and tool.get("arguments_text") is not None:
            attributes[SpanAttributes.TOOL_PARAMETERS] = tool["arguments_text"]
            _io(attributes, "input", tool["arguments_text"])
        if outputs is not None and tool.get("result") is not None:
            _io(attributes, "output", str(tool["result"]), TEXT)
        return attributes
    _io(attributes, "input", inputs)
    _io(attributes, "output", outputs)
    return attributes


def _message(prefix: str, message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}.{MessageAttributes.MESSAGE_ROLE}": message.get("role") or "user"}
    content = message.get("content")
    if content is not None:
        out[f"{prefix}.{MessageAttributes.MESSAGE_CONTENT}"] = content if isinstance(content, str) else \
            json.dumps(content, default=str, ensure_ascii=False)
    if message.get("tool_call_id"):
        out[f"{prefix}.{MessageAttributes.MESSAGE_TOOL_CALL_ID}"] = message["tool_call_id"]
    if message.get("name"):
        out[f"{prefix}.{MessageAttributes.MESSAGE_NAME}"] = message["name"]
    for j, call in enumerate(message.get("tool_calls") or ()):
        fn = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        at = f"{prefix}.{MessageAttributes.MESSAGE_TOOL_CALLS}.{j}"
        out[f"{at}.{ToolCallAttributes.TOOL_CALL_ID}"] = call.get("id") or ""
        out[f"{at}.{ToolCallAttributes.TOOL_CALL_FUNCTION_NAME}"] = fn.get("name") or ""
        out[f"{at}.{ToolCallAttributes.TOOL_CALL_FUNCTION_ARGUMENTS_JSON}"] = fn.get("arguments") or ""
    return out


def llm_attributes(row: Mapping[str, Any], request: Optional[Mapping[str, Any]], reply: Optional[Mapping[str, Any]],
                   session: Optional[str], capture_content: bool) -> dict[str, Any]:
    """A model call: LLM with model, provider, tokens and options; with content capture also every input message
    (system instructions first), the reply, the tools offered, and input/output values."""
    attributes: dict[str, Any] = {KIND: OpenInferenceSpanKindValues.LLM.value}
    for key, value in ((SpanAttributes.LLM_MODEL_NAME, row.get("model")), (SpanAttributes.LLM_PROVIDER, row.get("provider")),
                       (SpanAttributes.LLM_TOKEN_COUNT_PROMPT, row.get("input_tokens")),
                       (SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, row.get("output_tokens")),
                       (SpanAttributes.SESSION_ID, session)):
        if value is not None:
            attributes[key] = value
    if row.get("input_tokens") is not None and row.get("output_tokens") is not None:
        attributes[SpanAttributes.LLM_TOKEN_COUNT_TOTAL] = row["input_tokens"] + row["output_tokens"]
    if request is not None and request.get("options"):
        attributes[SpanAttributes.LLM_INVOCATION_PARAMETERS] = json.dumps(request["options"], default=str)
    if not capture_content or request is None:
        return attributes
    sent: Sequence[Mapping[str, Any]] = [*request.get("system", ()), *request.get("messages", ())]
    for i, message in enumerate(sent):
        attributes.update(_message(f"{SpanAttributes.LLM_INPUT_MESSAGES}.{i}", message))
    _io(attributes, "input", json.dumps({"messages": list(sent)}, default=str, ensure_ascii=False))
    for i, tool in enumerate(request.get("tools") or ()):
        attributes[f"{SpanAttributes.LLM_TOOLS}.{i}.{ToolAttributes.TOOL_JSON_SCHEMA}"] = json.dumps(tool, default=str)
    if reply is not None:
        attributes.update(_message(f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0", reply))
        _io(attributes, "output", reply.get("content") or json.dumps(reply, default=str), TEXT)
    return attributes


def custom_attributes(attributes: Mapping[str, Any], documents: Optional[Sequence[Mapping[str, Any]]],
                      capture_content: bool) -> dict[str, Any]:
    """A `ctx.span(...)` span: memory recall (`gen_ai.operation.name` retrieval) is a RETRIEVER with its query
    and documents (ids and scores; text with content capture), anything else a CHAIN."""
    if attributes.get("gen_ai.operation.name") != "retrieval":
        return {KIND: OpenInferenceSpanKindValues.CHAIN.value}
    out: dict[str, Any] = {KIND: OpenInferenceSpanKindValues.RETRIEVER.value}
    query = attributes.get("gen_ai.retrieval.query.text")
    if capture_content and isinstance(query, str):
        _io(out, "input", query, TEXT)
    for i, doc in enumerate(documents or ()):
        at = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{i}"
        if doc.get("id") is not None:
            out[f"{at}.{DocumentAttributes.DOCUMENT_ID}"] = str(doc["id"])
        if isinstance(doc.get("score"), (int, float)):
            out[f"{at}.{DocumentAttributes.DOCUMENT_SCORE}"] = float(doc["score"])
        if capture_content and doc.get("content") is not None:
            out[f"{at}.{DocumentAttributes.DOCUMENT_CONTENT}"] = str(doc["content"])
    return out
