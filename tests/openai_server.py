"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests and benchmarks (no stubs).

Script what it answers, one entry per request (the last entry repeats):

- ``server.reply(Completion(...))``: one assistant reply (text and/or tool calls, usage),
  sent whole, or as server-sent events when the request asks ``"stream": true``; so one
  scripted reply checks that streamed and whole replies agree. A completion can be cut
  off mid-stream (``cut_after``), trickled, chunked or not, slowed per event.
- ``server.respond(status, body, headers, delay, trickle)``: any status and body (JSON or bytes).
- ``server.redirect(location, status)``: a redirect, e.g. to a second server.

Every request is kept in ``server.requests`` (path, headers, parsed body).

    with OpenAIServer() as server:
        server.reply(Completion(tool_calls=[("call_1", "add", '{"a": 1}')]))
        OpenAICompatibleModel(server.url, "m1").complete(...)
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Union


@dataclass
class Completion:
    """One assistant reply, whole or streamed. ``tool_calls`` are ``(id, name, arguments_text)``."""

    text: Optional[str] = "hi!"
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    usage: Optional[dict[str, Any]] = None
    model: str = "m1"
    finish_reason: Optional[str] = None  # default: "tool_calls" when there are calls, else "stop"
    # how a stream is sent
    text_piece: int = 4  # characters per text delta
    args_piece: int = 5  # characters per tool-call arguments delta
    interleave: bool = False  # send the deltas of parallel tool calls interleaved (assembly by index)
    cut_after: Optional[int] = None  # close the connection after this many events, mid-reply
    cut_mid_event: bool = False  # when cutting, send half of the next event first
    done: bool = True  # end with data: [DONE]
    event_delay: float = 0.0  # seconds between events
    first_delay: float = 0.0  # seconds before the first event (after the headers)
    chunked: bool = True  # Transfer-Encoding: chunked (HTTP/1.1) or close-delimited
    content_type: str = "text/event-stream"

    def reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")

    def body(self) -> dict[str, Any]:
        """The whole chat.completion body."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in self.tool_calls]
        body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": self.model,
                                "choices": [{"index": 0, "message": message, "finish_reason": self.reason()}]}
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The chat.completion.chunk events of this reply, as OpenAI sends them."""
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": self.model}

        def chunk(delta: dict[str, Any], finish: Optional[str] = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": "" if self.text is not None else None})]
        text = self.text or ""
        out += [chunk({"content": text[i:i + self.text_piece]}) for i in range(0, len(text), self.text_piece)]
        per_call: list[list[dict[str, Any]]] = []
        for index, (call_id, name, args) in enumerate(self.tool_calls):
            deltas = [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]
            deltas += [{"index": index, "function": {"arguments": args[i:i + self.args_piece]}}
                       for i in range(0, len(args), self.args_piece)]
            per_call.append(deltas)
        if self.interleave:
            order = [d for group in _zip_longest(per_call) for d in group]
        else:
            order = [d for deltas in per_call for d in deltas]
        out += [chunk({"tool_calls": [d]}) for d in order]
        out.append(chunk({}, self.reason()))
        if include_usage and self.usage is not None:
            out.append({**base, "choices": [], "usage": self.usage})
        return out


def _zip_longest(groups: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    longest = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]


@dataclass
class Raw:
    status: int = 200
    body: Union[bytes, dict, list, None] = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # before the status line
    trickle: Optional[float] = None  # seconds between single body bytes


@dataclass
class Redirect:
    location: str
    status: int = 302


Entry = Union[Completion, Raw, Redirect]


class OpenAIServer:
    """A threaded HTTP/1.1 server speaking chat.completions on 127.0.0.1 (a random free port)."""

    def __init__(self) -> None:
        self.script: list[Entry] = []
        self.requests: list[dict[str, Any]] = []
        self.first_byte_at: list[float] = []  # perf_counter() when each reply's first body byte was sent
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.origin}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "OpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2)

    def reply(self, completion: Optional[Completion] = None, **fields: Any) -> Completion:
        completion = completion or Completion(**fields)
        self.script.append(completion)
        return completion

    def respond(self, status: int = 200, body: Any = None, headers: Optional[dict[str, str]] = None,
                delay: float = 0.0, trickle: Optional[float] = None) -> None:
        self.script.append(Raw(status, Completion().body() if body is None else body, headers or {}, delay, trickle))

    def redirect(self, location: str, status: int = 302) -> None:
        self.script.append(Redirect(location, status))

    def next_entry(self) -> Entry:
        with self._lock:
            if not self.script:
                return Raw(500, {"error": "the test server has no scripted reply"})
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def _handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            entry = server.next_entry()
            try:
                if isinstance(entry, Redirect):
                    self._send(entry.status, b"", {"Location": entry.location})
                elif isinstance(entry, Raw):
                    time.sleep(entry.delay)
                    payload = entry.body if isinstance(entry.body, bytes) else json.dumps(entry.body).encode()
                    self._send(entry.status, payload, entry.headers, entry.trickle)
                elif isinstance(body, dict) and body.get("stream"):
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    self._stream(entry, usage)
                else:
                    self._send(200, json.dumps(entry.body()).encode(), {"Content-Type": "application/json"})
            except OSError:  # the client gave up (timeouts, caps, aborted streams)
                pass
            self.close_connection = True

        def _send(self, status: int, payload: bytes, headers: dict[str, str], trickle: Optional[float] = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            if trickle is None:
                server.first_byte_at.append(time.perf_counter())
                self.wfile.write(payload)
                return
            for i in range(len(payload)):
                self.wfile.write(payload[i:i + 1])
                self.wfile.flush()
                time.sleep(trickle)

        def _stream(self, c: Completion, include_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", c.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding" if c.chunked else "Connection", "chunked" if c.chunked else "close")
            self.end_headers()
            self.wfile.flush()
            time.sleep(c.first_delay)
            events = [f"data: {json.dumps(ch)}\n\n".encode() for ch in c.chunks(include_usage)]
            if c.done:
                events.append(b"data: [DONE]\n\n")
            if c.cut_after is not None:
                events = events[:c.cut_after] + ([events[c.cut_after][:len(events[c.cut_after]) // 2]]
                                                 if c.cut_mid_event and c.cut_after < len(events) else [])
            for n, event in enumerate(events):
                if n:
                    time.sleep(c.event_delay)
                else:
                    server.first_byte_at.append(time.perf_counter())
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if c.chunked else event)
                self.wfile.flush()
            if c.chunked and c.cut_after is None:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
