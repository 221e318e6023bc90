"""A small web chat that streams the agent's tokens over server-sent events (Starlette + uvicorn).

`GET /chat?q=...&thread=...` runs one turn of a tool agent with `flow.astream(...)` and
sends each event as it happens: `token` (a piece of the reply), `tool` (a tool call
asked for, then its result), `done` (the answer and the run id, to backtrack later).
The run goes on a worker thread, so a model call never holds the server's event loop;
a browser that goes away mid-reply stops the run before its next step (recorded
`interrupted`). Each thread continues the previous turn (`resume=`), and every turn is
recorded in one DuckDB file. `GET /` is the page: a form and a few lines of JavaScript
(`/chat.js`) that show every text as text, under a Content-Security-Policy.

It runs offline with a scripted model that types its reply word by word; pass
`--base-url http://localhost:11434/v1 --model llama3.1` for a real OpenAI-compatible
server. `python examples/streaming_chat.py` starts the server, asks it one question as
a browser would and prints the stream; `--serve` keeps it running (open the URL).
Needs the `ui` extra: pip install 'tracemem-agents[ui]'.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Optional
from urllib.parse import quote

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from stages import tool_agent
from tracemem.flow.events import RunFailedEvent, RunFinished, TokenDelta, ToolCallEvent
from tracemem.models import OpenAICompatibleModel, ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import tool

# What the page shows comes from the user, the model and tools, so it is only ever set as text (append,
# textContent), never parsed as HTML; the script and the style are files of this origin, and every response
# carries a Content-Security-Policy that allows nothing else (no inline script, no other origin).
PAGE = """<!doctype html><meta charset="utf-8"><title>tracemem chat</title>
<link rel="stylesheet" href="/chat.css"><script src="/chat.js" defer></script>
<h1>Support chat</h1><div id="log"></div>
<form id="f"><input id="q" size="50" autofocus placeholder="Where is my order A7?"> <button>Send</button></form>"""
STYLE = "body{font:16px system-ui;max-width:40em;margin:2em auto} .tool{color:#777;font-size:.9em}"
SCRIPT = """"use strict";
const thread = Math.random().toString(36).slice(2), log = document.getElementById("log");
function line(who) {
  const p = document.createElement("p"), b = document.createElement("b"), text = document.createElement("span");
  b.textContent = who + ": ";
  p.append(b, text);
  log.append(p);
  return text;
}
document.getElementById("f").onsubmit = (e) => {
  e.preventDefault();
  const q = document.getElementById("q").value; document.getElementById("q").value = "";
  line("you").textContent = q;
  const out = line("agent");
  const source = new EventSource(`/chat?thread=${thread}&q=${encodeURIComponent(q)}`);
  source.addEventListener("token", (m) => out.append(JSON.parse(m.data).text));
  source.addEventListener("tool", (m) => {
    const t = JSON.parse(m.data), note = document.createElement("span");
    note.className = "tool";
    note.textContent = `[${t.status} ${t.name}] `;
    out.before(note);
  });
  source.addEventListener("done", () => source.close());
};
"""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")
SAFE = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order.

    Args:
        order_id: The order id, e.g. A7.
    """
    return {"order_id": order_id, "status": "shipped", "eta": "Thursday"}


def scripted(messages: list[dict[str, Any]]) -> Any:
    """What a real model would do here, offline: look the order up, then answer from the result."""
    turn = max(i for i, m in enumerate(messages) if m["role"] == "user")  # this turn: after the last user message
    results = [json.loads(m["content"]) for m in messages[turn:] if m["role"] == "tool"]
    if not results:
        asked = re.search(r"\b[A-Z]\d+\b", messages[turn]["content"] or "")
        if asked:
            return ToolCall(name="lookup_order", arguments={"order_id": asked.group(0)})
        return "Which order? Give me its id, like A7."
    order = results[-1]
    return f"Order {order['order_id']} has {order['status']} and should arrive on {order['eta']}."


class TypingModel:
    """The scripted model, typing its reply a word at a time as a streaming model would."""

    name = provider = "typing-scripted"

    def __init__(self, delay: float = 0.03) -> None:
        self.inner = ScriptedModel(default=scripted, name=self.name)
        self.delay = delay

    def complete(self, messages: Any, *, on_token: Any = None, **options: Any) -> Any:
        reply = self.inner.complete(messages, **options)
        for piece in re.findall(r"\S+\s*", reply.text) if on_token is not None else ():
            time.sleep(self.delay)
            on_token(piece)
        return reply


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def app(store: Store, model: Any) -> Starlette:
    flow = tool_agent([lookup_order], model=model, name="chat").build()
    threads: dict[str, str] = {}  # thread id -> its last run id

    async def chat(request: Request) -> StreamingResponse:
        question, thread = request.query_params.get("q", ""), request.query_params.get("thread", "default")

        async def events() -> AsyncIterator[bytes]:
            async for event in flow.astream({"question": question}, store=store, resume=threads.get(thread)):
                if isinstance(event, TokenDelta):
                    yield sse("token", {"text": event.text})
                elif isinstance(event, ToolCallEvent):
                    yield sse("tool", {"name": event.name, "status": event.status, "result": event.result})
                elif isinstance(event, RunFinished):
                    threads[thread] = event.run_id
                    yield sse("done", {"answer": event.run.output.answer, "run_id": event.run_id})
                elif isinstance(event, RunFailedEvent):
                    yield sse("done", {"error": event.error, "run_id": event.run_id})

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **SAFE})

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE, headers=SAFE)

    async def script(request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript", headers=SAFE)

    async def style(request: Request) -> Response:
        return Response(STYLE, media_type="text/css", headers=SAFE)

    return Starlette(routes=[Route("/", page), Route("/chat.js", script), Route("/chat.css", style),
                             Route("/chat", chat)])


def serve(application: Starlette, port: int = 0) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Start uvicorn on 127.0.0.1 in a thread; returns the server, its thread and the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(application, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, sock.getsockname()[1]


def read_stream(port: int, question: str, thread: str = "demo") -> list[tuple[float, str, Any]]:
    """Ask as a browser's EventSource would: (seconds since the request, event, data) as each arrives."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.monotonic()
    conn.request("GET", f"/chat?thread={thread}&q={quote(question)}", headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    got, event = [], None
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            got.append((time.monotonic() - start, event, json.loads(line[6:])))
            if event == "done":
                break
    conn.close()
    return got


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="keep serving (open the URL printed)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--db", help="the DuckDB file (default: a temporary one)")
    parser.add_argument("--base-url", help="an OpenAI-compatible server, e.g. http://localhost:11434/v1")
    parser.add_argument("--model", default="llama3.1")
    args = parser.parse_args(argv)
    model = OpenAICompatibleModel(args.base_url, args.model) if args.base_url else TypingModel()
    with tempfile.TemporaryDirectory() as tmp, Store(args.db or str(Path(tmp) / "chat.duckdb")) as store:
        server, thread, port = serve(app(store, model), args.port)
        print(f"chat at http://127.0.0.1:{port}/")
        try:
            if args.serve:
                thread.join()
                return
            for question in ("Where is my order A7?", "Thanks! And B2?"):
                print(f"\nyou:   {question}\nagent: ", end="", flush=True)
                for at, event, data in read_stream(port, question):
                    if event == "token":
                        print(data["text"], end="", flush=True)
                    elif event == "tool":
                        print(f"[{data['status']} {data['name']}] ", end="", flush=True)
                    elif event == "done":
                        print(f"\n       ({at * 1000:.0f} ms, run {data['run_id'][:8]})")
        finally:
            server.should_exit = True
            thread.join(timeout=10)


if __name__ == "__main__":
    main()
