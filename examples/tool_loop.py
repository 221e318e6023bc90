"""A tool-using agent loop: think → route → tool → think → … → final, guarded by max_iterations.

`think` asks a (scripted) model for the next action as JSON; the `route`
decider sends a tool call to `run_tool` (marked `tool=True`, so OpenTelemetry
exports it as `execute_tool`) and loops back with `loop_to("think",
when="tool", max_iterations=...)`; a final answer leaves the loop. Every
iteration is a recorded step with its iteration number. A second run, whose
model never stops calling tools, hits the guard: the run fails with an error
naming the loop, and every step it did is still recorded.

    python examples/tool_loop.py
"""
from __future__ import annotations

import json

from pydantic import BaseModel

from tracemem import Pipeline, StageContext, decide
from tracemem.models import ScriptedModel
from tracemem.store import Store

PRICES = {"AAPL": 231.5, "MSFT": 415.2}
TOOLS = {
    "price": lambda arg: PRICES.get(arg.upper(), "unknown ticker"),
    "calculator": lambda arg: round(eval(arg, {"__builtins__": {}}, {}), 2),  # a toy: never eval untrusted text
}


class Agent(BaseModel):
    question: str = ""
    messages: list[dict[str, str]] = []
    action: dict = {}
    observations: list[str] = []
    answer: str = ""


def think(scope: Agent, ctx: StageContext) -> None:
    """Ask the model for the next action: {"tool", "input"} or {"final"}."""
    messages = [{"role": "system", "content": f"Tools: {', '.join(TOOLS)}. Reply with JSON."},
                {"role": "user", "content": scope.question},
                *[{"role": "tool", "content": o} for o in scope.observations]]
    reply = ctx.env["model"].complete(messages)
    ctx.emit("model_calls", call_id=f"think-{ctx.step}", model=reply.model, provider="scripted", prompt_id=None,
             response=reply.text, input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens,
             latency_ms=0.0, started_at=None, error=None)
    scope.action = json.loads(reply.text)


def route(scope: Agent) -> str:
    return decide(scope, [("the model asked for a tool", lambda s: "tool" in s.action, "tool")], default="final")


def run_tool(scope: Agent) -> None:
    """Run the tool the model asked for and keep what it returned."""
    name, arg = scope.action["tool"], scope.action["input"]
    scope.observations.append(f"{name}({arg}) = {TOOLS[name](arg)}")


def final(scope: Agent) -> None:
    scope.answer = scope.action["final"]


def planner(messages: list[dict[str, str]]) -> dict:
    """A scripted model that plans: look up both prices, add them, answer."""
    seen = [m["content"] for m in messages if m["role"] == "tool"]
    if len(seen) == 0:
        return {"tool": "price", "input": "AAPL"}
    if len(seen) == 1:
        return {"tool": "price", "input": "MSFT"}
    if len(seen) == 2:
        a, b = (float(s.split(" = ")[1]) for s in seen)
        return {"tool": "calculator", "input": f"{a} + {b}"}
    return {"final": f"One AAPL and one MSFT share cost {seen[-1].split(' = ')[1]} USD together."}


def build(max_iterations: int = 5):
    return (Pipeline("stock-agent", Agent)
            .then(think)
            .branch(route, {"tool": Pipeline("tool", Agent).then(run_tool, tool=True), "final": final})
            .loop_to("think", when="tool", max_iterations=max_iterations)
            .build())


def main() -> None:
    with Store(":memory:") as store:
        run = build().run({"question": "What do one AAPL and one MSFT share cost together?"}, store=store,
                          env={"model": ScriptedModel(default=planner, name="planner-scripted")})
        print(f"answer: {run.output.answer}\n")
        for s in run.steps:
            detail = f"→ {run.decisions[[d.step for d in run.decisions].index(s.step)].chosen}" \
                if s.kind == "decider" else ""
            print(f"  step {s.step:2}  {s.stage:9} iteration {s.iteration}  {detail}")
        print(f"\nobservations: {run.output.observations}")
        print("\nBacktrack of the answer (tool results it depended on):\n")
        print(run.backtrack("answer").explain(max_lines=12))

        stuck = ScriptedModel(default={"tool": "price", "input": "AAPL"}, name="stuck-scripted")
        failed = build(max_iterations=3).run({"question": "Price of AAPL?"}, store=store, env={"model": stuck},
                                             raise_on_error=False)
        print(f"\nA model that never stops: run {failed.status}: {failed.error}")
        rows = store.sql("SELECT stage, count(*) AS times, max(iteration) AS last_iteration, "
                         "count(*) FILTER (WHERE status = 'failed') AS failed FROM steps WHERE run_id = ? "
                         "GROUP BY stage ORDER BY min(step)", [failed.run_id]).fetchall()
        for stage, times, last, n_failed in rows:
            print(f"  {stage:9} ran {times}x (last iteration {last}){', failed' if n_failed else ''}")


if __name__ == "__main__":
    main()
