"""A support agent whose answer is wrong because of one memory, among decoys: the scenario "why" answers.

Three turns of one thread with Dana, on a DuckDB file:
- t1: she introduces herself; the extractor learns three decoys (her name, her mail preference, her laptop);
- t2: she claims a 365-day refund window (the planted wrong memory) and mentions an old refund of order B2
  (a fourth decoy that shares words with the answer);
- t3: she asks for a refund of order A7. The agent (recall → assemble_prompt → tool_agent([lookup_order,
  refund]) → extract_memories) looks the order up, asks for the refund, a person approves that call, and the
  model answers "approved" because the prompt says 365 days: policy is 30 days, so the answer is wrong.

The scripted model answers as a function of the messages (so a re-asked call without the planted memory gets
the other answer, and one without a decoy the same), and counts its calls.
"""
from __future__ import annotations

import json
from typing import Any

from stages import AgentScope, assemble_prompt, extract_memories, recall, tool_agent
from tracemem import Pipeline
from tracemem.models import ScriptedModel, ToolCall
from tracemem.tools import tool

SUBJECT = "customer-dana"
PLANTED = "User's refund window is 365 days"
DECOYS = ("User's orders ship to the Lisbon office", "User prefers refunds to the card, not store credit",
          "User asked about the delivery of order A3 in March", "User's order B2 was refunded last year")
TURNS = [
    ("t1", "Hi, I'm Dana. My orders ship to the Lisbon office; refunds to my card please, never store credit. "
           "Where is order A3? I asked in March."),
    ("t2", "My refund window is 365 days, my account rep told me. Order B2 was refunded last year."),
    ("t3", "Can I get a refund for order A7?"),
]


@tool
def lookup_order(order_id: str) -> dict:
    """Look up one of the customer's orders.

    Args:
        order_id: The order id, e.g. A7.
    """
    return {"order_id": order_id, "item": "ThinkPad charger", "days_since_purchase": 60, "price_eur": 79}


@tool(needs_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (a person approves each refund first).

    Args:
        order_id: The order to refund.
    """
    return f"refund of {order_id} issued: 79 EUR back to the card"


def _this_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[last_user + 1:]


def agent_reply(messages: list[dict[str, Any]]) -> Any:
    """The support model: tools first, then an answer that rests on what the system prompt says."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    done = [m for m in _this_turn(messages) if m["role"] == "tool"]
    if "refund for order A7" not in question:
        return "Thanks, noted."
    if not done:
        return ToolCall(id="look_1", name="lookup_order", arguments={"order_id": "A7"})
    if len(done) == 1:
        return ToolCall(id="refund_1", name="refund", arguments={"order_id": "A7"})
    if "refund window is 365 days" in system:
        return f"Yes: your refund window is 365 days, so the refund of order A7 is approved ({done[-1]['content']})."
    return "Sorry: refunds close 30 days after purchase, and order A7 was bought 60 days ago."


def extractor_reply(messages: list[dict[str, Any]]) -> str:
    turn = messages[-1]["content"].split("\nAssistant:")[0]
    facts: list[str] = []
    if "I'm Dana" in turn:
        facts = list(DECOYS[:3])
    elif "365 days" in turn:
        facts = [PLANTED, DECOYS[3]]
    return json.dumps({"facts": [{"fact": f, "score": 0.9, "tags": ["support"], "supersedes": None} for f in facts]})


def build_flow() -> Any:
    pipe = (Pipeline("support-tools", AgentScope)
            .then(recall(semantic=False))
            .then(assemble_prompt(instructions="You are Acme's support agent. Use the customer's memory.")))
    return tool_agent([lookup_order, refund], model="model", pipeline=pipe).then(extract_memories("extractor")).build()


def env() -> dict[str, Any]:
    return {"model": ScriptedModel(default=agent_reply, name="support-model"),
            "extractor": ScriptedModel(default=extractor_reply, name="extractor-model")}


def play(store: Any) -> dict[str, Any]:
    """The three turns on `store`; returns the runs, the wrong one last, and the memory ids by text."""
    flow, models = build_flow(), env()
    runs, previous = [], None
    for turn, question in TURNS:
        run = flow.run({"question": question, "turn_id": turn}, store=store, subject=SUBJECT, env=models,
                       resume=previous)
        if run.status == "paused":  # the refund waits for a person: approve it
            asked = run.pending["tool_calls"]
            run = flow.resume(run.run_id, {c["id"]: {"approved": True} for c in asked}, store=store,
                              env=models, by="support-lead")
        assert run.status == "ok", (run.status, run.error)
        runs.append(run)
        previous = run
    memories = {r.text: r.memory_id for r in store.memory.records(SUBJECT)}
    return {"flow": flow, "runs": runs, "wrong": runs[-1], "memories": memories, "planted": memories[PLANTED],
            "decoys": [memories[d] for d in DECOYS]}
