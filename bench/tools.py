"""What the tool and streaming layers add: µs per tool call, and ms to the first streamed token.

1. Tool helpers. A small typed function called directly is the baseline; against it,
   in the same run: ``tool.validate`` + call, ``tool.call(dict)``, and ``ToolSet.run``
   (validate, call, render the result, cap it, time it: everything a tool step needs
   except recording) with dict and with raw JSON arguments, as a model sends them.
2. Time to first token. A local OpenAI-compatible server (tests/openai_server.py)
   streams a reply; the server notes the instant it writes its first event, the
   client the instant ``on_token`` gets the first text. The baseline is a bare
   http.client read of the same stream's first bytes, so "added" is what the adapter
   (deadline, SSE decoding, JSON, assembly) costs on top of the loopback itself.
   Goal: <= 1 ms added.

Prints figures; asserts nothing.

    python bench/tools.py [--calls N] [--streams N]
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, ".")
sys.path.insert(0, "tests")
from openai_server import Completion, OpenAIServer  # noqa: E402
from tracemem.models import OpenAICompatibleModel, ToolCall  # noqa: E402
from tracemem.tools import ToolSet, tool  # noqa: E402


def lookup(city: str, days: int = 1, metric: bool = True) -> dict[str, Any]:
    """Weather for a city.

    Args:
        city: The city.
        days: How many days.
        metric: Celsius when true.
    """
    return {"city": city, "days": days, "sky": "rain"}


def per_call_us(fn: Callable[[], Any], calls: int, reps: int = 5) -> float:
    """Best of ``reps`` runs of ``calls`` calls, in µs per call (best-of tames a noisy shared machine)."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def bench_tools(calls: int) -> None:
    weather = tool(lookup)
    tools = ToolSet([weather])
    args = {"city": "Oslo", "days": 3}
    as_dict = ToolCall(id="c1", name="lookup", arguments=args)
    as_text = ToolCall(id="c1", name="lookup", arguments_text=json.dumps(args))
    as_text = as_text.model_copy(update={"arguments": None})  # force the raw-JSON path
    base = per_call_us(lambda: lookup(**args), calls)
    rows = [
        ("direct function call (baseline)", base),
        ("tool.validate(dict) + call", per_call_us(lambda: lookup(**weather.validate(args)), calls)),
        ("tool.call(dict)", per_call_us(lambda: weather.call(args), calls)),
        ("ToolSet.run(call) — dict arguments", per_call_us(lambda: tools.run(as_dict), calls)),
        ("ToolSet.run(call) — raw JSON arguments", per_call_us(lambda: tools.run(as_text), calls)),
        ("ToolSet.run(call) + .message()", per_call_us(lambda: tools.run(as_dict).message(), calls)),
    ]
    print(f"tool helpers, {calls} calls x best of 5 (µs per call; added = minus the direct call)")
    for label, us in rows:
        print(f"  {label:<42} {us:8.2f} µs   added {us - base:7.2f} µs")


def raw_first_byte_ms(server: OpenAIServer, body: bytes) -> float:
    """Baseline: server's first event written -> first body bytes read by bare http.client."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read1(65536)
    got = time.perf_counter()
    resp.read()
    conn.close()
    return (got - server.first_byte_at[-1]) * 1000


def adapter_first_token_ms(server: OpenAIServer, chat: OpenAICompatibleModel) -> float:
    seen: list[float] = []
    chat.complete([{"role": "user", "content": "hi"}], on_token=lambda t: seen or seen.append(time.perf_counter()))
    return (seen[0] - server.first_byte_at[-1]) * 1000


def bench_stream(streams: int) -> None:
    with OpenAIServer() as server:
        server.reply(Completion(text="The first token arrives as soon as it is written.", usage={
            "prompt_tokens": 3, "completion_tokens": 10}, first_delay=0.02))
        chat = OpenAICompatibleModel(server.url, "m1")
        body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
        raw, ours = [], []
        for i in range(streams + 3):  # interleaved, so both see the same machine load; 3 warm-up rounds
            r, o = raw_first_byte_ms(server, body), adapter_first_token_ms(server, chat)
            if i >= 3:
                raw.append(r)
                ours.append(o)
    med_raw, med_ours = statistics.median(raw), statistics.median(ours)
    print(f"time to first streamed token, {streams} streams (median ms after the server wrote its first event)")
    print(f"  bare http.client first bytes (baseline)    {med_raw:7.3f} ms")
    print(f"  OpenAICompatibleModel on_token             {med_ours:7.3f} ms   "
          f"added {med_ours - med_raw:6.3f} ms (goal <= 1 ms)")
    print(f"  p90: baseline {statistics.quantiles(raw, n=10)[-1]:.3f} ms, adapter {statistics.quantiles(ours, n=10)[-1]:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=50)
    args = parser.parse_args()
    bench_tools(args.calls)
    bench_stream(args.streams)


if __name__ == "__main__":
    main()
