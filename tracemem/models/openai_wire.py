"""The OpenAI chat.completions wire format: request bodies, whole replies and streamed chunks.

Pure functions of JSON, with no HTTP, so the same reply received whole or streamed
goes through one ``build_reply`` and comes out identical (text, tool calls, usage,
model, finish reason). Every failure is a ``ModelError`` that names the model and the
(redacted) URL, says what is missing and what to do, and masks known secrets.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from .errors import ErrorKind, ModelConfigError, ModelError
from .messages import MessageLike, ToolCall, ToolSpec, tool_specs, wire_messages
from .protocol import Reply, Schema, TextDelta, ToolCallDelta, ToolChoice, Usage, usage_count

CHOICES = ("auto", "none", "required")
ENDPOINT_HINT = "check base_url points at an OpenAI-compatible /v1 endpoint"


def excerpt(payload: bytes | str, limit: int = 200) -> str:
    """A short single-line view of a body, so errors stay readable."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    text = " ".join(text[: limit * 4].split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class WireContext:
    """Who is being parsed (model, redacted url), the size cap, and the secrets no error may show."""

    model: str
    url: str
    max_reply_bytes: int
    secrets: tuple[str, ...] = ()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "***")
        return text

    def error(self, message: str, kind: ErrorKind, *, partial: Optional[Reply] = None,
              status: Optional[int] = None, attempts: int = 1) -> ModelError:
        return ModelError(self.redact(f"model {self.model!r}: {message}"), kind=kind, status=status, url=self.url,
                          model=self.model, attempts=attempts, partial=partial)

    def bad(self, what: str, payload: bytes | str | None = None, hint: str = ENDPOINT_HINT,
            partial: Optional[Reply] = None) -> ModelError:
        shown = f": {excerpt(payload)!r}" if payload is not None else ""
        return self.error(f"reply from {self.url} {what}{shown}; {hint}", "bad_reply", partial=partial)


def schema_format(schema: dict[str, Any] | type[BaseModel]) -> dict[str, Any]:
    """The OpenAI ``response_format`` for structured output."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        name, body = schema.__name__, schema.model_json_schema()
    elif isinstance(schema, dict):
        name, body = str(schema.get("title") or "reply"), schema
    else:
        raise ModelConfigError(f"schema must be a JSON schema dict or a pydantic model class, got {schema!r:.120}")
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "reply"  # OpenAI requires ^[a-zA-Z0-9_-]{1,64}$
    return {"type": "json_schema", "json_schema": {"name": name, "schema": body, "strict": True}}


def tool_choice_format(choice: ToolChoice, specs: Sequence[ToolSpec]) -> Any:
    """``auto``/``none``/``required`` as they are, a tool's name as the OpenAI function choice."""
    if isinstance(choice, Mapping):
        return dict(choice)
    if not isinstance(choice, str):
        raise ModelConfigError(f"tool_choice must be 'auto', 'none', 'required' or a tool name, got {choice!r:.80}")
    if choice in CHOICES:
        return choice
    names = [s.name for s in specs]
    if choice not in names:
        raise ModelConfigError(f"tool_choice {choice!r} names no tool of this call (tools: {', '.join(names) or 'none'}); "
                               "pass one of them, or 'auto', 'none' or 'required'")
    return {"type": "function", "function": {"name": choice}}


def request_body(model: str, messages: Sequence[MessageLike], *, schema: Schema = None,
                 tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None, stream: bool = False,
                 stream_usage: bool = True, extra_body: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The JSON body of one chat.completions request (``extra_body`` first, so ours win)."""
    body: dict[str, Any] = {**(extra_body or {}), "model": model, "messages": wire_messages(messages)}
    body.pop("stream", None)
    if not stream:
        body.pop("stream_options", None)
    if schema is not None:
        body["response_format"] = schema_format(schema)
    specs = tool_specs(tools)
    if specs:
        body["tools"] = [spec.to_openai() for spec in specs]
    if tool_choice is not None and (specs or tool_choice not in ("auto", "none")):
        if not specs:
            raise ModelConfigError(f"tool_choice={tool_choice!r} needs tools=; pass the tools the model may call")
        body["tool_choice"] = tool_choice_format(tool_choice, specs)
    if stream:
        body["stream"] = True
        if stream_usage:
            body.setdefault("stream_options", {"include_usage": True})
    return body


def reply_size(text: str, calls: Sequence[ToolCall]) -> int:
    """Bytes of what a reply says: its text plus every tool call's argument text (UTF-8)."""
    return len(text.encode("utf-8", "replace")) + sum(len(c.arguments_text.encode("utf-8", "replace")) for c in calls)


def too_large(ctx: WireContext, size: int, partial: Optional[Reply] = None) -> ModelError:
    kept = "; the partial reply is on this error's .partial" if partial is not None else ""
    return ctx.error(f"reply from {ctx.url} is larger than max_reply_bytes={ctx.max_reply_bytes} "
                     f"({size} bytes so far){kept}; raise max_reply_bytes= or ask for a shorter reply (max_tokens)",
                     "too_large", partial=partial)


def tool_call(item: Any, position: int, ctx: WireContext, payload: bytes | str) -> ToolCall:
    """One ``tool_calls`` entry; a missing id becomes ``call_{position}`` (some local servers omit it)."""
    try:
        call = ToolCall.model_validate(item)
    except ValidationError:
        raise ctx.bad(f"has a malformed tool call at tool_calls[{position}]", payload) from None
    return call if call.id else call.model_copy(update={"id": f"call_{position}"})


def build_reply(ctx: WireContext, *, content: Optional[str], refusal: Optional[str], calls: list[ToolCall],
                finish_reason: Optional[str], model: Any, usage: Any, raw: dict[str, Any]) -> Reply:
    """The one place a Reply is made from wire data, streamed or not."""
    if content is None and not calls:
        why = f"is a refusal ({refusal!r}) with no text content" if refusal else f"has no text content and no tool calls (finish_reason={finish_reason!r})"
        raise ctx.bad(why, hint="the model returned an empty message; retry, or check the request")
    text = content or ""
    size = reply_size(text, calls)
    if size > ctx.max_reply_bytes:
        raise too_large(ctx, size)
    counts = usage if isinstance(usage, Mapping) else {}
    return Reply(text=text, usage=Usage(usage_count(counts.get("prompt_tokens")), usage_count(counts.get("completion_tokens"))),
                 model=str(model or ctx.model), raw=raw, tool_calls=tuple(calls),
                 finish_reason=str(finish_reason) if finish_reason is not None else None)


def text_of(content: Any) -> Optional[str]:
    """Message content as text: a string, or the text parts of a content-part list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    raise TypeError(type(content).__name__)


def parse_completion(payload: bytes, ctx: WireContext) -> Reply:
    """A whole chat.completions body as a Reply, or a ModelError saying precisely what is missing."""
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ctx.bad("is not JSON", payload) from None
    try:
        choice = body["choices"][0]
        message = choice["message"]
        content = text_of(message.get("content"))
        raw_calls = message.get("tool_calls") or []
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ctx.bad("lacks choices[0].message", payload) from None
    if not isinstance(raw_calls, list):
        raise ctx.bad("has tool_calls that are not a list", payload)
    calls = [tool_call(item, i, ctx, payload) for i, item in enumerate(raw_calls)]
    refusal = message.get("refusal")
    return build_reply(ctx, content=content, refusal=refusal if isinstance(refusal, str) else None, calls=calls,
                       finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
                       model=body.get("model"), usage=body.get("usage"), raw=body)


class ReplyAssembler:
    """Builds a Reply from streamed chunks: text deltas joined, tool-call deltas joined by index."""

    def __init__(self, ctx: WireContext) -> None:
        self.ctx = ctx
        self.chunks = 0
        self.finished = False  # a finish_reason arrived
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._saw_content = False
        self._calls: dict[int, dict[str, Any]] = {}
        self._size = 0
        self._finish: Optional[str] = None
        self._model: Optional[str] = None
        self._id: Optional[str] = None
        self._usage: Optional[dict[str, Any]] = None

    def feed(self, chunk: Any) -> list[TextDelta | ToolCallDelta]:
        """One chunk's events; raises ModelError (with the partial reply) for a malformed or oversized chunk."""
        if not isinstance(chunk, Mapping):
            raise self.ctx.bad("sent a stream chunk that is not a JSON object", json.dumps(chunk), partial=self.partial())
        self.chunks += 1
        self._model = self._model or (chunk.get("model") if isinstance(chunk.get("model"), str) else None)
        self._id = self._id or (chunk.get("id") if isinstance(chunk.get("id"), str) else None)
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = dict(chunk["usage"])
        events: list[TextDelta | ToolCallDelta] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, Mapping):
                self._delta(delta, events)
            if choice.get("finish_reason"):
                self._finish, self.finished = str(choice["finish_reason"]), True
        if self._size > self.ctx.max_reply_bytes:
            raise too_large(self.ctx, self._size, self.partial())
        return events

    def _delta(self, delta: Mapping[str, Any], events: list[TextDelta | ToolCallDelta]) -> None:
        content = delta.get("content")
        if isinstance(content, str):
            self._saw_content = True
            if content:
                self._text.append(content)
                self._size += len(content.encode("utf-8", "replace"))
                events.append(TextDelta(content))
        if isinstance(delta.get("refusal"), str):
            self._refusal.append(delta["refusal"])
        for position, item in enumerate(delta.get("tool_calls") or []):
            if not isinstance(item, Mapping):
                continue
            index = item.get("index", position)
            index = index if isinstance(index, int) else position
            slot = self._calls.setdefault(index, {"id": "", "name": "", "args": []})
            fn = item.get("function") if isinstance(item.get("function"), Mapping) else {}
            new_id = item.get("id") if isinstance(item.get("id"), str) and not slot["id"] else None
            new_name = fn.get("name") if isinstance(fn.get("name"), str) and not slot["name"] else None
            args = fn.get("arguments")
            args = args if isinstance(args, str) else ("" if args is None else json.dumps(args))
            slot["id"] = new_id or slot["id"]
            slot["name"] = new_name or slot["name"]
            slot["args"].append(args)
            self._size += len(args.encode("utf-8", "replace"))
            events.append(ToolCallDelta(index, new_id, new_name, args))

    def _tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=slot["id"] or f"call_{position}", name=slot["name"], arguments_text="".join(slot["args"]))
                for position, (_, slot) in enumerate(sorted(self._calls.items()))]

    def _raw(self, reply_text: Optional[str], calls: list[ToolCall]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply_text}
        if calls:
            message["tool_calls"] = [c.wire() for c in calls]
        raw: dict[str, Any] = {"id": self._id, "object": "chat.completion", "model": self._model,
                               "choices": [{"index": 0, "message": message, "finish_reason": self._finish}]}
        if self._usage is not None:
            raw["usage"] = self._usage
        return raw

    def partial(self) -> Reply:
        """What arrived so far, unchecked: text, tool calls (arguments may be cut), usage if it came."""
        calls, text = self._tool_calls(), "".join(self._text)
        counts = self._usage or {}
        return Reply(text=text, usage=Usage(usage_count(counts.get("prompt_tokens")),
                                            usage_count(counts.get("completion_tokens"))),
                     model=self._model or self.ctx.model, raw=self._raw(text, calls), tool_calls=tuple(calls),
                     finish_reason=self._finish)

    def reply(self) -> Reply:
        """The finished reply, through the same checks as a reply received whole."""
        calls = self._tool_calls()
        content = "".join(self._text) if self._saw_content else None
        refusal = "".join(self._refusal) or None
        return build_reply(self.ctx, content=content, refusal=refusal, calls=calls, finish_reason=self._finish,
                           model=self._model, usage=self._usage, raw=self._raw(content, calls))
