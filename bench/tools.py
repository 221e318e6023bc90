"""What the tool and streaming layers add: µs per tool call, and ms to the first streamed token.

1. Tool helpers. A small typed function called directly is the baseline; against it,
   in the same run: ``tool.validate`` + call, ``tool.call(dict)``, and ``ToolSet.run``
   (validate, call, render the result, cap it, time it: everything a tool step needs
   except recording) with dict and with raw JSON arguments, as a model sends them.
2. Recording one tool call in the tool agent (``stages.tool_agent``, durability "run",
   a DuckDB file). A scripted model asks for K tool calls in one reply, then answers;
   the same agent asking for one call is the baseline, so the model calls, think, route
   and final cancel out: (time(K) - time(1)) / (K - 1) is what one more tool call costs
   the loop, and minus the tool's own time (measured directly) what the agent adds per
   call: its own step (fan-out, a thread), the recorded read, ToolSet.run, the
   ``tool_calls`` row, the tool-result message, the store. Goal: <= 50 µs per call.
   One round per tool call (think, route and a tool step each time) is printed too.
3. Time to first token. A local OpenAI-compatible server (tests/openai_server.py)
   streams a reply; the server notes the instant it writes its first event, the
   client the instant ``on_token`` gets the first text (the adapter alone) and the
   instant the first ``TokenDelta`` comes out of ``flow.stream`` (a one-stage flow that
   calls the model through ``ctx.complete``: the run on its worker thread, the event
   queue). The baseline is a bare http.client read of the same stream's first bytes,
   so "added" is what tracemem costs on top of the loopback itself. Goal: <= 1 ms added.

Prints figures; asserts nothing.

    python bench/tools.py [--calls N] [--streams N] [--runs N]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel

sys.path.insert(0, ".")
sys.path.insert(0, "tests")
from openai_server import Completion, OpenAIServer  # noqa: E402
from stages import tool_agent  # noqa: E402
from tracemem import Pipeline, StageContext  # noqa: E402
from tracemem.flow.events import TokenDelta  # noqa: E402
from tracemem.models import OpenAICompatibleModel, ScriptedModel, ToolCall  # noqa: E402
from tracemem.store import Store  # noqa: E402
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


def agent_flow(calls: int, per_turn: bool) -> Any:
    """A tool agent whose scripted model asks for ``calls`` lookups (all in one reply, or one per turn),
    then answers."""
    args = {"city": "Oslo", "days": 3}
    batch = [ToolCall(name="lookup", arguments=args) for _ in range(calls)]

    def brain(messages: list[dict[str, Any]]) -> Any:
        done = sum(1 for m in messages if m["role"] == "tool")
        if done >= calls:
            return "It rains in Oslo."
        return batch[:1] if per_turn else batch

    return tool_agent([tool(lookup)], model=ScriptedModel(default=brain), max_turns=calls + 1).build()


def agent_runs_us(store: Optional[Store], flows: dict[str, Any], runs: int, rounds: int) -> dict[str, list[float]]:
    """µs per run of each flow (wall time: the store's writer works beside it), one batch of ``runs`` runs
    per round, the flows interleaved round by round (so within a round all see the same machine load)."""
    times: dict[str, list[float]] = {name: [] for name in flows}
    for _ in range(rounds):
        for name, flow in flows.items():
            start = time.perf_counter()
            for _ in range(runs):
                flow.run({"question": "weather in Oslo?"}, store=store)
            times[name].append((time.perf_counter() - start) / runs * 1e6)
        if store is not None:
            store.flush()
    return times


def per_call(times: dict[str, list[float]], k: int, many: str = "many") -> float:
    """What one more tool call costs: the median over rounds of (time(k calls) - time(1 call)) / (k - 1), each
    round's pair measured back to back (a shared machine's load changes between rounds, less within one)."""
    return statistics.median((m - o) / (k - 1) for m, o in zip(times[many], times["one"]))


def bench_agent(runs: int) -> None:
    own = per_call_us(lambda: lookup(city="Oslo", days=3), 20_000)
    helper = ToolSet([tool(lookup)])
    call = ToolCall(id="c1", name="lookup", arguments={"city": "Oslo", "days": 3})
    run_us = per_call_us(lambda: helper.run(call), 20_000)
    k, rounds = 8, 15
    flows = {"one": agent_flow(1, False), "many": agent_flow(k, False), "turns": agent_flow(k, True)}
    with tempfile.TemporaryDirectory() as tmp, Store(str(Path(tmp) / "bench.duckdb")) as store:
        agent_runs_us(store, flows, 5, 1)  # warm up: threads, the file, the caches
        times = agent_runs_us(store, flows, max(runs // 10, 2), rounds)
    bare = agent_runs_us(None, {"one": flows["one"], "many": flows["many"]}, max(runs // 10, 2), rounds)
    one, many = statistics.median(times["one"]), statistics.median(times["many"])
    added = per_call(times, k)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"tool agent, durability \"run\" (DuckDB file), scripted model, {rounds} interleaved rounds (µs, medians; "
          f"load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"  agent run, model asks for 1 call, then answers   {one:9.1f} µs per run")
    print(f"  agent run, model asks for {k} calls in one reply    {many:9.1f} µs per run")
    print(f"  one more tool call (parallel, same reply)        {added:9.1f} µs   the tool itself {own:5.2f} µs")
    print(f"  recording overhead per tool call                 {added - own:9.1f} µs (goal <= 50 µs)")
    print(f"    of which ToolSet.run (validate, call, render)  {run_us - own:9.1f} µs; the step, its record and "
          f"the model's longer conversation {added - run_us:.1f} µs")
    print(f"  one more round of think -> route -> tool         {per_call(times, k, 'turns'):9.1f} µs   (a model call "
          "and two steps more per call)")
    print(f"  the same without a store (recorded in memory)    {per_call(bare, k) - own:9.1f} µs per tool call")


class Asked(BaseModel):
    answer: str = ""


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


def flow_first_event_ms(server: OpenAIServer, chat: OpenAICompatibleModel) -> float:
    """``flow.stream`` of a one-stage flow calling the model: server's first event -> first TokenDelta read."""

    def ask(scope: Asked, ctx: StageContext) -> None:
        scope.answer = ctx.complete(chat, [{"role": "user", "content": "hi"}]).text

    flow = Pipeline("ask", Asked).then(ask).build()
    seen: list[float] = []
    for event in flow.stream({}):
        if isinstance(event, TokenDelta) and not seen:
            seen.append(time.perf_counter())
    return (seen[0] - server.first_byte_at[-1]) * 1000


def bench_stream(streams: int) -> None:
    with OpenAIServer() as server:
        server.reply(Completion(text="The first token arrives as soon as it is written.", usage={
            "prompt_tokens": 3, "completion_tokens": 10}, first_delay=0.02))
        chat = OpenAICompatibleModel(server.url, "m1")
        body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
        raw, ours, flows = [], [], []
        for i in range(streams + 3):  # interleaved, so all see the same machine load; 3 warm-up rounds
            r, o, f = (raw_first_byte_ms(server, body), adapter_first_token_ms(server, chat),
                       flow_first_event_ms(server, chat))
            if i >= 3:
                raw.append(r)
                ours.append(o)
                flows.append(f)
    med_raw, med_ours, med_flow = statistics.median(raw), statistics.median(ours), statistics.median(flows)
    print(f"time to first streamed token, {streams} streams (median ms after the server wrote its first event)")
    print(f"  bare http.client first bytes (baseline)    {med_raw:7.3f} ms")
    print(f"  OpenAICompatibleModel on_token             {med_ours:7.3f} ms   "
          f"added {med_ours - med_raw:6.3f} ms (goal <= 1 ms)")
    print(f"  flow.stream first TokenDelta event         {med_flow:7.3f} ms   "
          f"added {med_flow - med_raw:6.3f} ms (goal <= 1 ms)")
    p90 = lambda xs: statistics.quantiles(xs, n=10)[-1]  # noqa: E731
    print(f"  p90: baseline {p90(raw):.3f} ms, adapter {p90(ours):.3f} ms, flow.stream {p90(flows):.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--runs", type=int, default=200, help="agent runs per measurement")
    args = parser.parse_args()
    bench_tools(args.calls)
    bench_agent(args.runs)
    bench_stream(args.streams)


if __name__ == "__main__":
    main()
