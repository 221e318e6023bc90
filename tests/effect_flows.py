"""A support agent whose tools and stages touch the outside world, for the side-effect tests.

Every effect appends one line, `what<TAB>idempotency key`, to the file `EFFECTS_FILE` names: the
counting sink the tests read (a second process appends to the same file). `lookup_order` is pure;
`send_mail` is an effect; `refund` needs a person's approval; `pay` is an effect stage; `ask_and_mail`
asks a person inside its body. The scripted model asks for tools by what the prompt says, so a
counterfactual without the memory asks for a different refund.
"""
from __future__ import annotations

import json
import os
import signal
from typing import Any

from stages import AgentScope, assemble_prompt, recall, tool_agent
from tracemem import Pipeline
from tracemem.models import ScriptedModel, ToolCall
from tracemem.tools import tool


def touch(what: str, key: str) -> None:
    """One line in the counting sink; with CRASH_AFTER_EFFECT set, the process dies right after (SIGKILL)."""
    with open(os.environ["EFFECTS_FILE"], "a") as sink:
        sink.write(f"{what}\t{key}\n")
    if os.environ.get("CRASH_AFTER_EFFECT"):
        os.kill(os.getpid(), signal.SIGKILL)


def effects() -> list[list[str]]:
    """The lines in the counting sink: [what, key]."""
    if not os.path.exists(os.environ["EFFECTS_FILE"]):
        return []
    with open(os.environ["EFFECTS_FILE"]) as sink:
        return [line.rstrip("\n").split("\t") for line in sink if line.strip()]


@tool(pure=True)
def lookup_order(order: str) -> dict[str, Any]:
    """Look an order up (no side effects)."""
    return {"order": order, "paid": 30.0}


@tool(inject=("idempotency_key",))
def send_mail(to: str, text: str, idempotency_key: str) -> str:
    """Send an e-mail."""
    touch(f"mail {to}: {text}", idempotency_key)
    return "sent"


@tool(needs_approval=True, inject=("idempotency_key",))
def refund(order: str, amount: float, idempotency_key: str) -> str:
    """Refund part of an order."""
    touch(f"refund {order} {amount}", idempotency_key)
    return f"refunded {amount}"


@tool(inject=("ctx", "idempotency_key"))
def ask_and_mail(to: str, ctx: Any, idempotency_key: str) -> str:
    """Ask a person first, then send."""
    if not ctx.interrupt({"send to": to}):
        return "not sent"
    touch(f"asked mail {to}", idempotency_key)
    return "sent"


class Support(AgentScope):
    order: str = ""
    receipt: str = ""


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "tool"]


def script(tools_asked: list[Any]) -> Any:
    """A reply function: the first reply asks `tools_asked` (a function of the system prompt), the next answers."""
    def reply(messages: list[dict[str, Any]]) -> Any:
        if _tool_results(messages):
            return "Done: " + "; ".join(_tool_results(messages))
        return tools_asked(messages[0].get("content") or "")
    return reply


def mail_calls(prompt: str) -> list[ToolCall]:
    days = "365" if "365 days" in prompt else "30"
    return [ToolCall(id="c1", name="lookup_order", arguments={"order": "A-1"}),
            ToolCall(id="c2", name="send_mail", arguments={"to": "dana", "text": f"your window is {days} days"})]


def refund_calls(prompt: str) -> list[ToolCall]:
    return [ToolCall(id="r1", name="refund", arguments={"order": "A-1", "amount": 30.0}),
            ToolCall(id="r2", name="refund", arguments={"order": "A-2", "amount": 99.0})]


def asking_calls(prompt: str) -> list[ToolCall]:
    return [ToolCall(id="m1", name="send_mail", arguments={"to": "dana", "text": "hello"}),
            ToolCall(id="m2", name="ask_and_mail", arguments={"to": "sam"})]


def model(calls: Any) -> ScriptedModel:
    return ScriptedModel(default=script(calls), name="support-llm")


def pay(s: Support, ctx: Any) -> None:
    """Charge the order (an effect stage)."""
    touch(f"pay {s.order}", f"{ctx.run_id}:{ctx.step}")
    s.receipt = f"paid {s.order}"


def agent(name: str, tools: list[Any], with_pay: bool = False) -> Any:
    pipe = Pipeline(name, Support).then(recall()).then(assemble_prompt())
    pipe = tool_agent(tools, pipeline=pipe)
    if with_pay:
        pipe = pipe.then(pay, effect=True)
    return pipe.build()


mail_flow = agent("mail", [lookup_order, send_mail])
refund_flow = agent("refunds", [lookup_order, refund])
asking_flow = agent("asking", [send_mail, ask_and_mail])
pay_flow = agent("pay", [lookup_order], with_pay=True)


def env(calls: str) -> dict[str, Any]:
    return {"model": model({"mail": mail_calls, "refund": refund_calls, "asking": asking_calls}[calls])}


if __name__ == "__main__":  # a second process: python effect_flows.py FLOW DB RUN_ID ANSWER_JSON
    import sys

    from tracemem.store import Store

    flow_name, db, run_id, answer = sys.argv[1:5]
    flow = {"mail": mail_flow, "refund": refund_flow, "asking": asking_flow}[flow_name]
    the_env = env(flow_name)
    with Store(db) as store:
        done = flow.resume(run_id, json.loads(answer), store=store, by="maria", env=the_env, durability="stage")
        print(json.dumps({"status": done.status, "answer": done.output.answer,
                          "model_calls": len(the_env["model"].calls)}))
