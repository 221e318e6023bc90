"""A real OpenAI-compatible chat server on 127.0.0.1 for tests that count model calls across processes.

Each request is answered deterministically from its last user message ("re: <message>") and
kept, so a test can assert how many calls reached the model in total, whichever process made them.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator


class ChatServer:
    """Started with `serve()`; `url` for OpenAICompatibleModel; `requests` as received."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self.lock = threading.Lock()

    def last_user(self, body: dict[str, Any]) -> str:
        users = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user"]
        return str(users[-1]) if users else ""

    def asked(self) -> list[str]:
        """The last user message of every request, in order."""
        with self.lock:
            return [self.last_user(r) for r in self.requests]


def serve() -> Iterator[ChatServer]:
    """A running server (a generator for a pytest fixture: stops after the test)."""
    chat = ChatServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            with chat.lock:
                chat.requests.append(body)
            text = f"re: {chat.last_user(body)}"
            payload = json.dumps({"model": body.get("model"), "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    chat.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield chat
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=2)
