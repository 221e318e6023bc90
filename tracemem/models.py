"""Chat models behind one small protocol.

Pipelines talk to a ``ChatModel`` and never to a vendor SDK, so a run can be
recorded the same way whether it used OpenAI, a local vLLM/Ollama/llama.cpp
server, or the deterministic ``ScriptedModel`` that tests and the demo use.
Nothing here touches the network until an ``OpenAICompatibleModel`` is built
*and* called.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Union, runtime_checkable

from pydantic import BaseModel
from .errors import TracememError

__all__ = ["Message", "Usage", "Reply", "ChatModel", "ModelError", "OpenAICompatibleModel",
           "ScriptedModel", "count_tokens_estimate"]
Message = dict[str, str]
"""One chat message: ``{"role": "user" | "system" | "assistant", "content": ...}``."""

Schema = Union[dict[str, Any], type[BaseModel], None]

RETRY_AFTER_CAP = 30.0
"""Longest wait (seconds) we accept from a Retry-After header or our own backoff,
so a misbehaving server cannot stall a pipeline for minutes."""


@dataclass(frozen=True)
class Usage:
    """Token counts for one call; recorded per model call so cost is queryable."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Reply:
    """What a model said, plus what it cost; ``raw`` keeps the provider body for forensics."""

    text: str
    usage: Usage
    model: str
    raw: dict[str, Any] | None = field(default=None, hash=False)


@runtime_checkable
class ChatModel(Protocol):
    """The only interface pipelines depend on, so adapters are interchangeable."""

    name: str
    provider: str

    def complete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """One chat completion; with `schema`, the reply text is JSON of that shape."""
        ...

    async def acomplete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """`complete` for async stages."""
        ...


ErrorKind = Literal["status", "timeout", "bad_reply", "connection", "script"]


class ModelError(TracememError):
    """A model call failed; the message says what failed and what to do about it.

    ``kind`` lets callers branch without parsing text: "status" (HTTP error
    status), "timeout", "bad_reply" (not JSON / missing content),
    "connection" (could not reach the server), "script" (a ScriptedModel has
    no reply for this call: a test-setup problem, not a model problem).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        status: int | None = None,
        url: str | None = None,
        model: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.url = url
        self.model = model
        self.attempts = attempts


def count_tokens_estimate(text: str) -> int:
    """Whitespace word count: a cheap, deterministic stand-in when no tokenizer is at hand."""
    return len(text.split())


def _excerpt(payload: bytes | str, limit: int = 200) -> str:
    """A short single-line view of a body, so errors stay readable."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _schema_format(schema: dict[str, Any] | type[BaseModel]) -> dict[str, Any]:
    """Build the OpenAI ``response_format`` for structured output."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        name, body = schema.__name__, schema.model_json_schema()
    elif isinstance(schema, dict):
        name, body = str(schema.get("title") or "reply"), schema
    else:
        raise TypeError(f"schema must be a JSON schema dict or a pydantic model class, got {schema!r}")
    # OpenAI requires ^[a-zA-Z0-9_-]{1,64}$ for the name.
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "reply"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": body, "strict": True}}


def _is_loopback(url: str) -> bool:
    """True for localhost URLs, which must not be sent through an HTTP(S)_PROXY."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_STATUS_HINTS = {
    400: "the server rejected the request; check the model name, messages and schema",
    401: "check api_key",
    403: "check api_key and that it may use this model",
    404: "check base_url (usually ends in /v1) and the model name",
    429: "rate limited; lower concurrency or raise max_retries/backoff",
}


class OpenAICompatibleModel:
    """Client for any ``POST {base_url}/chat/completions`` server (OpenAI, vLLM, Ollama, llama.cpp).

    Stdlib only, so the package needs no vendor SDK. ``max_retries`` counts
    retries after the first attempt; 429, 5xx and connection errors are retried
    with exponential backoff, other 4xx and timeouts are not (a retry would not
    help, and each timeout already cost ``timeout`` seconds).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        provider: str = "openai",
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = model
        self.provider = provider
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.extra_body = dict(extra_body or {})
        self.url = f"{self.base_url}/chat/completions"
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.url) else []
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:  # never show the api key
        return f"OpenAICompatibleModel(base_url={self.base_url!r}, model={self.model!r}, provider={self.provider!r})"

    def complete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """Send one chat request, retrying transient failures, and parse the reply."""
        body: dict[str, Any] = {**self.extra_body, "model": self.model, "messages": list(messages)}
        if schema is not None:
            body["response_format"] = _schema_format(schema)
        data = json.dumps(body).encode("utf-8")
        attempts = self.max_retries + 1
        last: ModelError | None = None
        for attempt in range(attempts):
            try:
                status, headers, payload = self._send(data)
            except ModelError as err:
                if err.kind != "connection":
                    raise
                last = err
                if attempt + 1 < attempts:
                    time.sleep(self._delay(attempt, None))
                continue
            if 200 <= status < 300:
                return self._parse(payload)
            last = self._status_error(status, payload, attempt + 1)
            if status != 429 and status < 500:
                raise last
            if attempt + 1 < attempts:
                time.sleep(self._delay(attempt, headers.get("Retry-After")))
        assert last is not None
        raise ModelError(f"{last} (gave up after {attempts} attempts)", kind=last.kind,
                         status=last.status, url=self.url, model=self.model, attempts=attempts)

    async def acomplete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """Async variant: runs the blocking call in a worker thread so the event loop stays free."""
        return await asyncio.to_thread(self.complete, messages, schema=schema)

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry ``attempt + 1``: the server's numeric Retry-After, else backoff."""
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), RETRY_AFTER_CAP)
            except ValueError:
                pass  # an HTTP-date or junk: fall back to our own backoff
        return min(self.backoff * (2 ** attempt), RETRY_AFTER_CAP)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "tracemem"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _send(self, data: bytes) -> tuple[int, Any, bytes]:
        """One HTTP round trip; error statuses are returned, transport failures raise ModelError."""
        req = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            try:
                payload = err.read()
            except Exception:  # body unreadable; the status alone still explains the failure
                payload = b""
            return err.code, err.headers, payload
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise self._timeout_error() from err
            raise self._connection_error(err.reason) from err
        except TimeoutError as err:
            raise self._timeout_error() from err
        except (http.client.HTTPException, OSError) as err:
            raise self._connection_error(err) from err

    def _timeout_error(self) -> ModelError:
        return ModelError(
            f"model {self.model!r}: no reply from {self.url} within timeout={self.timeout}s; "
            "raise timeout= or check the server is up and not overloaded",
            kind="timeout", url=self.url, model=self.model)

    def _connection_error(self, reason: object) -> ModelError:
        return ModelError(
            f"model {self.model!r}: could not connect to {self.url} ({reason}); "
            "check the server is running and base_url is right",
            kind="connection", url=self.url, model=self.model)

    def _status_error(self, status: int, payload: bytes, attempts: int) -> ModelError:
        hint = _STATUS_HINTS.get(status) or (
            "server error; check the server logs" if status >= 500 else "unexpected status")
        return ModelError(
            f"model {self.model!r}: HTTP {status} from {self.url}: {_excerpt(payload)!r}; {hint}",
            kind="status", status=status, url=self.url, model=self.model, attempts=attempts)

    def _parse(self, payload: bytes) -> Reply:
        """Turn a chat.completions body into a Reply, or say precisely what is missing."""
        def bad(what: str) -> ModelError:
            return ModelError(
                f"model {self.model!r}: reply from {self.url} {what}: {_excerpt(payload)!r}; "
                "check base_url points at an OpenAI-compatible /v1 endpoint",
                kind="bad_reply", url=self.url, model=self.model)

        try:
            body = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            raise bad("is not JSON") from None
        try:
            message = body["choices"][0]["message"]
            text = message["content"]
        except (KeyError, IndexError, TypeError):
            raise bad("lacks choices[0].message.content") from None
        if not isinstance(text, str):
            refusal = message.get("refusal") if isinstance(message, dict) else None
            raise bad(f"has no text content (refusal: {refusal!r})" if refusal else "has no text content")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        return Reply(
            text=text,
            usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            model=str(body.get("model") or self.model),
            raw=body,
        )


ReplySpec = Union[str, BaseModel, dict, list, Callable[[list[Message]], Any]]
Pattern = Union[str, re.Pattern[str], Callable[[list[Message]], bool]]


def _last_user(messages: list[Message]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content") or "")
    return ""


def _matches(pattern: Pattern, messages: list[Message]) -> bool:
    if isinstance(pattern, str):
        return pattern in _last_user(messages)
    if isinstance(pattern, re.Pattern):
        return pattern.search(_last_user(messages)) is not None
    if callable(pattern):
        return bool(pattern(messages))
    raise TypeError(f"rule pattern must be a str, compiled regex or callable, got {pattern!r}")


def _render(spec: ReplySpec, messages: list[Message]) -> str:
    """Resolve a scripted reply; structured values become JSON so schema-using stages work too."""
    value = spec(messages) if callable(spec) else spec
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


class ScriptedModel:
    """A deterministic model for tests, examples and the demo: same input, same output, no network.

    For each call: the first matching rule wins; otherwise the next unused
    entry of ``replies``; otherwise ``default``; otherwise ModelError(kind="script").
    Rule patterns (substring / regex) are matched against the last user message.
    """

    def __init__(
        self,
        replies: list[ReplySpec] | None = None,
        *,
        rules: list[tuple[Pattern, ReplySpec]] | None = None,
        default: ReplySpec | None = None,
        name: str = "scripted",
        provider: str = "scripted",
    ) -> None:
        self.replies = list(replies or [])
        self.rules = list(rules or [])
        self.default = default
        self.name = name
        self.provider = provider
        self.calls: list[list[Message]] = []
        self._cursor = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"ScriptedModel(name={self.name!r}, replies={len(self.replies)}, "
                f"rules={len(self.rules)}, default={'set' if self.default is not None else None})")

    def complete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """Pick the scripted reply for these messages (``schema`` is accepted and ignored)."""
        snapshot = [dict(m) for m in messages]
        with self._lock:
            self.calls.append(snapshot)
            call_no = len(self.calls)
            spec = self._choose(snapshot, call_no)
        text = _render(spec, snapshot)
        prompt_tokens = sum(count_tokens_estimate(str(m.get("content") or "")) for m in snapshot)
        return Reply(text=text, usage=Usage(prompt_tokens, count_tokens_estimate(text)), model=self.name)

    async def acomplete(self, messages: list[Message], *, schema: Schema = None) -> Reply:
        """Async variant; scripted replies are instant, so no thread is needed."""
        return self.complete(messages, schema=schema)

    def _choose(self, messages: list[Message], call_no: int) -> ReplySpec:
        for pattern, spec in self.rules:
            if _matches(pattern, messages):
                return spec
        if self._cursor < len(self.replies):
            spec = self.replies[self._cursor]
            self._cursor += 1
            return spec
        if self.default is not None:
            return self.default
        last = _excerpt(_last_user(messages), 120)
        if self.replies:
            why = (f"ran out of replies: {len(self.replies)} were scripted and this is call {call_no}; "
                   "add more replies or a default=")
        else:
            why = "has no rule matching this call and no default; add a rule or a default="
        raise ModelError(f"ScriptedModel {self.name!r} {why} (last user message: {last!r})",
                         kind="script", model=self.name)
