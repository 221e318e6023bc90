"""A support agent with two tools and a memory, and a wrong answer traced back through a tool result.

Dana asks where her order went. The agent is recall → assemble_prompt → `tool_agent`
(think → route → tools → think … → final, a stage graph you can print). The model asks
for two tools at once (they run concurrently, each its own recorded step); one call is
missing an argument, so the error goes back to the model as a tool result and it calls
again, correctly. Its answer sends Dana to the Lisbon office, although the agent's
memory says she moved to Porto. The backtrack shows where "Lisbon" came from: the
`lookup_order` result (a stale copy of the order), the step that ran it, and the model
call that asked for it with the prompt it saw (the Porto memory included). A second
run, whose model never stops calling tools, hits the max-turns guard: the run fails
clearly and every step it did is kept.

    python examples/tool_agent.py
"""
from __future__ import annotations

import json
from typing import Any

from stages import AgentScope, assemble_prompt, recall, tool_agent
from tracemem import Pipeline, RunFailed
from tracemem.models import ScriptedModel, ToolCall
from tracemem.store import Store
from tracemem.tools import tool

ORDERS = {"A7": {"order_id": "A7", "item": "standing desk", "ship_to": "Lisbon office", "tracking": "PT-4431"}}
PARCELS = {"PT-4431": {"status": "delivered", "when": "yesterday at 14:02"}}


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order in the shop's order replica.

    Args:
        order_id: The order id, e.g. A7.
    """
    return ORDERS.get(order_id, {"error": f"no order {order_id}"})


@tool
def track_parcel(tracking: str) -> dict:
    """Where a parcel is, by its tracking number.

    Args:
        tracking: The carrier's tracking number.
    """
    return PARCELS.get(tracking, {"status": "unknown"})


def support_model(messages: list[dict[str, Any]]) -> Any:
    """A scripted model: what a real one would do with these tools (the conversation as OpenAI dicts)."""
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    if not results:  # two calls at once; the second forgets its argument
        return [ToolCall(id="c1", name="lookup_order", arguments={"order_id": "A7"}),
                ToolCall(id="c2", name="track_parcel", arguments={})]
    order = json.loads(results["c1"])
    if "c3" not in results:  # the error came back: call again, with the tracking number from the order
        return ToolCall(id="c3", name="track_parcel", arguments={"tracking": order["tracking"]})
    parcel = json.loads(results["c3"])
    return f"Your {order['item']} (order A7) was {parcel['status']} to the {order['ship_to']} {parcel['when']}."


def build(max_turns: int = 4) -> Any:
    pipe = (Pipeline("support", AgentScope)
            .then(recall())
            .then(assemble_prompt(instructions="You are Acme's support agent. Use the tools.")))
    return tool_agent([lookup_order, track_parcel], pipeline=pipe, max_turns=max_turns).build()


def main() -> None:
    agent = build()
    print("The agent's graph:\n" + agent.to_mermaid() + "\n")
    with Store(":memory:") as store:
        store.memory.remember("dana", "Dana moved to the Porto office in March: her orders go there now", confidence=90)
        run = agent.run({"question": "Where is my order A7?", "user": {"name": "Dana"}}, store=store,
                        subject="dana", env={"model": ScriptedModel(default=support_model, name="support-scripted")})
        print("The conversation:")
        for m in run.output.messages:
            calls = ", ".join(f"{c.name}({c.arguments_text})" for c in m.tool_calls)
            print(f"  {m.role:9} {m.content or ''}{'asks for ' + calls if calls else ''}")
        print("\nThe tool calls, from SQL (each its own step, the failed one included):")
        for row in store.sql("SELECT step, name, arguments_text, error_kind, round(duration_ms, 2) FROM tool_calls "
                             "WHERE run_id = ? ORDER BY step", [run.run_id]).fetchall():
            print(f"  step {row[0]}  {row[1]}({row[2]})  {row[3] or 'ok'}  {row[4]} ms")
        print(f"\nThe answer: {run.output.answer}")
        print("Wrong: Dana moved to Porto. Where did 'Lisbon' come from? The backtrack, to the tool calls:\n")
        trace = run.backtrack("answer")
        print(trace.explain(only="tool_call", beyond=0, max_lines=14))
        [memory] = trace.sources("memory")
        print(f"\nThe memory was in the prompt ({memory['text']!r}); the address came from the lookup_order "
              "result, message 2. Its own backtrack: the tool step, the call the model asked for, and the prompt "
              "that model call saw:\n")
        print(run.backtrack("messages[2]").explain(max_lines=16))
        print(f"Runs that depended on lookup_order: {sorted(store.affected('tool:lookup_order').runs)}")

        stuck = ScriptedModel(default=ToolCall(name="lookup_order", arguments={"order_id": "A7"}), name="stuck")
        try:
            build(max_turns=3).run({"question": "Where is A7?"}, store=store, subject="dana", env={"model": stuck})
        except RunFailed as failed:
            print(f"\nA model that never stops: {failed}")
            rows = store.sql("SELECT stage, count(*) FROM steps WHERE run_id = ? GROUP BY stage ORDER BY min(step)",
                             [failed.run.run_id]).fetchall()
            print("  kept: " + ", ".join(f"{stage} x{n}" for stage, n in rows))


if __name__ == "__main__":
    main()
