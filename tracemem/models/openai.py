"""``OpenAICompatibleModel``: any ``POST {base_url}/chat/completions`` server, whole or streamed.

Works with OpenAI, vLLM, Ollama and llama.cpp servers through the stdlib alone, so the
package needs no vendor SDK. This module holds the call's life: build the body, send
it (retrying what a retry can fix), then read the reply whole or as server-sent
events. The wire format lives in ``openai_wire``, the HTTP in ``transport``.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Optional

from .errors import ModelConfigError, ModelError
from .messages import MessageLike
from .openai_wire import ReplyAssembler, WireContext, excerpt, parse_completion, request_body
from .protocol import Reply, Schema, StreamEvent, TextDelta, TokenCallback, ToolChoice, reply_events
from .sse import DONE, SSEDecoder
from .transport import (Endpoint, Response, Transport, TransportConnectionError, TransportError, TransportRedirectError,
                        TransportTimeout, TransportTooLarge, is_loopback)

RETRY_AFTER_CAP = 30.0
"""Longest wait (seconds) we accept from a Retry-After header or our own backoff,
so a misbehaving server cannot stall a pipeline for minutes."""

MAX_REPLY_BYTES = 4 * 1024 * 1024
"""Default cap on what one reply says (text plus tool-call arguments, UTF-8): 4 MiB, about
a million tokens, far beyond any model's output limit. A whole (non-streamed) body may be
up to 4x that plus 64 KiB, to allow for JSON escaping and the envelope."""

ERROR_BODY_BYTES = 64 * 1024  # what we read of an error status's body to quote it

_STATUS_HINTS = {
    400: "the server rejected the request; check the model name, messages, tools and schema",
    401: "check api_key",
    403: "check api_key and that it may use this model",
    404: "check base_url (usually ends in /v1) and the model name",
    429: "rate limited; lower concurrency or raise max_retries/backoff",
}


class OpenAICompatibleModel:
    """Client for any ``POST {base_url}/chat/completions`` server (OpenAI, vLLM, Ollama, llama.cpp).

    - ``max_retries`` counts retries after the first attempt: 429, 5xx and connection
      errors are retried with exponential backoff (a numeric Retry-After wins, capped at
      ``RETRY_AFTER_CAP``); other 4xx and timeouts are not. A stream is never retried
      once its first byte arrived.
    - ``timeout`` bounds the *whole* reply, redirects and streaming included: a server
      trickling bytes cannot hold a call longer. For a stream that includes the time the
      consumer spends between events; raise it for long generations.
    - ``max_reply_bytes`` caps what one reply says (see ``MAX_REPLY_BYTES``); beyond it
      the call fails with ``ModelError(kind="too_large")``.
    - ``user:password@`` in ``base_url`` is sent as Basic auth (unless ``api_key`` is set)
      and shown as ``***@`` in ``base_url``, ``url``, reprs and errors; the api key and
      password never appear in an error text. Redirects re-send the POST but drop
      credentials when they leave the origin.
    - ``stream=True`` makes ``complete`` stream too (as does ``on_token=``);
      ``stream_usage`` asks the server for usage in the stream (``stream_options``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: Optional[str] = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        provider: str = "openai",
        extra_body: Optional[dict[str, Any]] = None,
        *,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        stream: bool = False,
        stream_usage: bool = True,
        max_redirects: int = 5,
    ) -> None:
        endpoint = Endpoint.parse(base_url.rstrip("/"))
        for label, value, ok in (("timeout", timeout, timeout > 0), ("max_retries", max_retries, max_retries >= 0),
                                 ("max_reply_bytes", max_reply_bytes, max_reply_bytes > 0),
                                 ("max_redirects", max_redirects, max_redirects >= 0)):
            if not ok:
                raise ModelConfigError(f"{label} must be {'> 0' if label in ('timeout', 'max_reply_bytes') else '>= 0'}, "
                                       f"got {value}")
        self.base_url = endpoint.safe_url
        self.url = f"{endpoint.safe_url}/chat/completions"
        self.model = self.name = model
        self.provider = provider
        self.api_key = api_key
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_reply_bytes = max_reply_bytes
        self.extra_body = dict(extra_body or {})
        self.stream_default = stream or bool(self.extra_body.get("stream"))
        self.stream_usage = stream_usage
        self._endpoint = endpoint
        self._target = f"{endpoint.url}/chat/completions"
        self._transport = Transport(use_proxies=not is_loopback(endpoint.url), max_redirects=max_redirects)
        basic = endpoint.basic_auth()
        secrets = (api_key, endpoint.password, basic.split(" ", 1)[1] if basic else None)
        self._wire = WireContext(model, self.url, max_reply_bytes, tuple(s for s in secrets if s and len(s) >= 4))

    def __repr__(self) -> str:  # never shows the api key or URL credentials
        return f"OpenAICompatibleModel(base_url={self.base_url!r}, model={self.model!r}, provider={self.provider!r})"

    # -- the three ways to call -----------------------------------------------------------

    def complete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                 tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                 on_token: Optional[TokenCallback] = None) -> Reply:
        """One chat completion; with ``on_token`` (or ``stream=True``) the reply streams and each text
        fragment reaches ``on_token`` as it arrives. Either way the Reply is the same."""
        if on_token is None and not self.stream_default:
            body = request_body(self.model, messages, schema=schema, tools=tools, tool_choice=tool_choice,
                                extra_body=self.extra_body)
            _, payload = self._send(body, streaming=False)
            return parse_completion(payload, self._wire)
        for event in self.stream(messages, schema=schema, tools=tools, tool_choice=tool_choice):
            if isinstance(event, Reply):
                return event
            if on_token is not None and isinstance(event, TextDelta):
                on_token(event.text)
        raise AssertionError("stream() ended without a Reply")  # stream() always ends in a Reply or raises

    def stream(self, messages: Sequence[MessageLike], *, schema: Schema = None,
               tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None) -> Iterator[StreamEvent]:
        """Stream one completion: ``TextDelta``/``ToolCallDelta`` events as they arrive, then the ``Reply``.

        A stream that breaks before ``[DONE]`` raises ``ModelError(kind="cut_off")`` (or
        "timeout"/"too_large") whose ``.partial`` is the reply so far. Closing the iterator
        early closes the connection.
        """
        body = request_body(self.model, messages, schema=schema, tools=tools, tool_choice=tool_choice, stream=True,
                            stream_usage=self.stream_usage, extra_body=self.extra_body)
        response, _ = self._send(body, streaming=True)
        yield from self._events(response)

    async def acomplete(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                        tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None,
                        on_token: Optional[TokenCallback] = None) -> Reply:
        """``complete`` in a worker thread so the event loop stays free (``on_token`` runs in that thread)."""
        return await asyncio.to_thread(self.complete, messages, schema=schema, tools=tools, tool_choice=tool_choice,
                                       on_token=on_token)

    async def astream(self, messages: Sequence[MessageLike], *, schema: Schema = None,
                      tools: Optional[Sequence[Any]] = None, tool_choice: ToolChoice = None) -> AsyncIterator[StreamEvent]:
        """``stream`` for async code: the HTTP read runs in a worker thread, events come to the loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        holder: dict[str, Response] = {}
        stop = threading.Event()

        def post(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # the loop is gone: nobody is listening any more
                stop.set()

        def pump() -> None:  # its own thread: a long stream must not hold a slot of the shared executor
            try:
                body = request_body(self.model, messages, schema=schema, tools=tools, tool_choice=tool_choice,
                                    stream=True, stream_usage=self.stream_usage, extra_body=self.extra_body)
                holder["response"], _ = self._send(body, streaming=True)
                for event in self._events(holder["response"]):
                    if stop.is_set():
                        return
                    post("event", event)
            except BaseException as err:  # handed to the awaiting side, which re-raises it
                post("error", err)
            finally:
                post("finished", None)

        threading.Thread(target=pump, name="tracemem-astream", daemon=True).start()
        finished = False
        try:
            while True:
                kind, value = await queue.get()
                if kind == "finished":
                    finished = True
                    return
                if kind == "error":
                    raise value
                if kind == "event":
                    yield value
        finally:
            stop.set()
            if "response" in holder:
                holder["response"].abort()
            while not finished:  # let the thread end before the loop might close
                finished = (await queue.get())[0] == "finished"

    # -- sending, with retries ------------------------------------------------------------

    def _headers(self, streaming: bool) -> tuple[dict[str, str], dict[str, str]]:
        """Plain headers, and the credentials that go only to the base URL's origin."""
        headers = {"Content-Type": "application/json", "User-Agent": "tracemem",
                   "Accept": "text/event-stream" if streaming else "application/json"}
        auth = f"Bearer {self.api_key}" if self.api_key else self._endpoint.basic_auth()
        return headers, ({"Authorization": auth} if auth else {})

    def _send(self, body: dict[str, Any], *, streaming: bool) -> tuple[Response, bytes]:
        """POST until a 2xx arrives (retrying 429/5xx/connection errors); the body too unless streaming."""
        data = json.dumps(body).encode("utf-8")
        headers, credentials = self._headers(streaming)
        attempts = self.max_retries + 1
        last: Optional[ModelError] = None
        for attempt in range(attempts):
            retry_after: Optional[str] = None
            try:
                response = self._transport.post(self._target, data, headers, timeout=self.timeout,
                                                credentials=credentials)
                if 200 <= response.status < 300:
                    if streaming:
                        return response, b""
                    with response:
                        return response, response.read(self.max_reply_bytes * 4 + 65536)
                with response:
                    payload = self._error_body(response)
                last = self._status_error(response.status, payload, attempt + 1)
                if response.status != 429 and response.status < 500:
                    raise last
                retry_after = response.headers.get("Retry-After")
            except TransportConnectionError as err:
                last = self._wire.error(f"could not connect to {self.url} ({err}); check the server is running "
                                        "and base_url is right", "connection", attempts=attempt + 1)
            except TransportError as err:
                raise self._transport_error(err) from None
            if attempt + 1 < attempts:
                time.sleep(self._delay(attempt, retry_after))
        assert last is not None
        raise ModelError(f"{last} (gave up after {attempts} attempts)", kind=last.kind, status=last.status,
                         url=self.url, model=self.model, attempts=attempts)

    def _error_body(self, response: Response) -> bytes:
        try:
            return response.read(ERROR_BODY_BYTES)
        except TransportError:  # too long or broken: the status alone still explains the failure
            return b"(body unreadable)"

    def _delay(self, attempt: int, retry_after: Optional[str]) -> float:
        """Seconds to wait before retry ``attempt + 1``: the server's numeric Retry-After, else backoff."""
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), RETRY_AFTER_CAP)
            except ValueError:
                pass  # an HTTP-date or junk: fall back to our own backoff
        return min(self.backoff * (2 ** attempt), RETRY_AFTER_CAP)

    def _status_error(self, status: int, payload: bytes, attempts: int) -> ModelError:
        hint = _STATUS_HINTS.get(status) or ("server error; check the server logs" if status >= 500 else "unexpected status")
        return self._wire.error(f"HTTP {status} from {self.url}: {excerpt(payload)!r}; {hint}", "status", status=status,
                                attempts=attempts)

    def _transport_error(self, err: TransportError, partial: Optional[Reply] = None) -> ModelError:
        """A ModelError for a failure of the exchange itself (never retried)."""
        kept = "; the partial reply is on this error's .partial" if partial is not None else ""
        if isinstance(err, TransportTimeout):
            return self._wire.error(f"no complete reply from {self.url} within timeout={self.timeout}s{kept}; raise "
                                    "timeout= or check the server is up and not overloaded", "timeout", partial=partial)
        if isinstance(err, TransportTooLarge):
            return self._wire.error(f"reply from {self.url} is larger than max_reply_bytes={self.max_reply_bytes} "
                                    f"allows ({err}){kept}; raise max_reply_bytes= or ask for a shorter reply",
                                    "too_large", partial=partial)
        if isinstance(err, TransportRedirectError):
            return self._wire.error(f"request to {self.url} was {err}; set base_url to the final address",
                                    "redirect")
        return self._wire.error(f"the connection to {self.url} broke mid-reply ({err}){kept}; retry the call",
                                "cut_off", partial=partial)

    # -- reading a stream -----------------------------------------------------------------

    def _events(self, response: Response) -> Iterator[StreamEvent]:
        """Events from an open streaming response; always closes it."""
        assembler = ReplyAssembler(self._wire)
        decoder = SSEDecoder(self.max_reply_bytes * 4 + 65536)
        with response:
            try:
                blocks = response.blocks()
                first = next(blocks, b"")
                if not _is_event_stream(response.headers.get("Content-Type"), first):
                    yield from self._whole_reply(first, blocks)  # a server that ignored "stream": true
                    return
                for block in itertools.chain((first,), blocks):
                    for data in decoder.feed(block):
                        if data.strip() == DONE:
                            yield assembler.reply()
                            return
                        yield from assembler.feed(self._chunk(data, assembler))
                mid_line = decoder.mid_line
                for data in decoder.close():
                    if data.strip() == DONE:
                        yield assembler.reply()
                        return
                    yield from assembler.feed(self._chunk(data, assembler))
            except TransportError as err:
                raise self._transport_error(err, assembler.partial()) from None
            if assembler.finished and not mid_line:  # a server that ends without [DONE]
                yield assembler.reply()
                return
            raise self._wire.error(
                f"the stream from {self.url} ended before the reply was complete (no [DONE] after {assembler.chunks} "
                f"chunks); the partial reply is on this error's .partial; retry the call", "cut_off",
                partial=assembler.partial())

    def _chunk(self, data: str, assembler: ReplyAssembler) -> Any:
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise self._wire.bad("sent a stream event that is not JSON", data, partial=assembler.partial()) from None
        if isinstance(chunk, dict) and chunk.get("error") is not None and not chunk.get("choices"):
            raise self._wire.error(f"the server reported an error mid-stream: {excerpt(json.dumps(chunk['error']))!r}; "
                                   "the partial reply is on this error's .partial", "status", partial=assembler.partial())
        return chunk

    def _whole_reply(self, first: bytes, blocks: Iterator[bytes]) -> Iterator[StreamEvent]:
        limit, parts, size = self.max_reply_bytes * 4 + 65536, [first], len(first)
        for block in blocks:
            size += len(block)
            if size > limit:
                raise TransportTooLarge(limit, size)
            parts.append(block)
        yield from reply_events(parse_completion(b"".join(parts), self._wire))


def _is_event_stream(content_type: Optional[str], first: bytes) -> bool:
    """Server-sent events by header, or by their first bytes when a server mislabels them."""
    if content_type and "text/event-stream" in content_type:
        return True
    return first.lstrip().startswith((b"data:", b":", b"event:"))
