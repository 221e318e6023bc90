"""`tool_agent`: a model that calls tools, declared as a stage graph you can see and trace.

    think → route → tools → think → … → final

- `think` sends the conversation and the tools to the model (`ctx.complete`, so the
  call is recorded with the tool calls it asked for), appends the reply as the
  assistant message and keeps its tool calls in `pending_tool_calls`;
- `route` (a decider) goes to `tools` while the reply asked for tools, else to `final`;
- `approve_tools` (only when a tool is declared `needs_approval=True`) pauses the run
  while the reply asks for such a tool: a person approves, rejects (the model reads
  the message) or edits each call (`tracemem.tools.ToolApprovals`), and only approved
  calls go on; the decision is a recorded human input that backtracking names;
- `tools` runs every pending call as a step of its own, all at once (`Pipeline.map`:
  threads for sync tools, `asyncio.gather` for async ones), records each in the
  `tool_calls` table (arguments, result, error, timing, the size cap if applied) and
  appends its tool-result message (with `tool_call_id`) in the order the model asked.
  A tool not declared `pure=True` is a side effect (`ctx.effect`): made once with the
  idempotency key `run:step:call id` (a tool may take it: `inject=("idempotency_key",)`),
  and answered from the record by a resume, a replaying fork or a counterfactual;
- the loop back to `think` is guarded: more than `max_turns` rounds of tools fail the
  run with a LoopLimitError naming the `max_turns` loop, every step so far kept;
- `final` writes the last assistant text to `answer`.

A tool that raises, arguments that are not JSON or do not fit, and an unknown tool
name become tool-result messages stating the error (`ToolSet.run`): the model reads
them and can correct itself, and the run goes on. A reply asking for more than
`max_calls_per_reply` calls fails the run (recorded, naming the cap); two calls with
one id are told apart (`id#2`), so each result goes back under its own id. A tool may ask for the tool step's
scope view, its context or any `env` value by name (`@tool(inject=("scope",))`):
what it reads through the scope is recorded, so backtracking shows it.

Put your own stages before and after (`pipeline=Pipeline(...).then(recall())...`)
and use your own scope: every field is a parameter, as in the other stages.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional, Union

from tracemem import Pipeline, PipelineError, StageContext, decide
from tracemem.models import ChatModel, Message, ToolCall, ToolChoice
from tracemem.tools import REJECTED, Tool, ToolApprovals, ToolError, ToolOutcome, ToolSet, ask_payload

from .model_call import append_message, chat_model, conversation
from .scope import AgentScope

__all__ = ["tool_agent"]


def _field(scope: type, label: str, value: Optional[str], default: Optional[str], required: bool) -> Optional[str]:
    """A field name checked against the scope: a default-named optional field the scope lacks is skipped."""
    if value is None or value in scope.model_fields:  # type: ignore[attr-defined]
        return value
    if value == default and not required:
        return None
    fields = ", ".join(scope.model_fields)  # type: ignore[attr-defined]
    raise PipelineError(f"tool_agent: {label}='{value}' but the scope {scope.__name__} has no such field "
                        f"(fields: {fields}); pass {label}=<field name>")


def tool_agent(tools: Union[ToolSet, Iterable[Union[Tool, Callable[..., Any]]]], *,
               model: Union[ChatModel, str] = "model", pipeline: Optional[Pipeline[Any]] = None,
               scope: type = AgentScope, name: str = "tool-agent", max_turns: int = 8,
               tool_choice: ToolChoice = None, system_from: Optional[str] = "prompt",
               prompt_id_from: Optional[str] = "prompt_id", messages_from: str = "messages",
               question_from: Optional[str] = "question", pending_from: str = "pending_tool_calls",
               into: str = "answer", max_calls_per_reply: int = 32) -> Pipeline[Any]:
    """Append think → route → tools → … → final to `pipeline` (or a new `Pipeline(name, scope)`); return it.

    `tools` is a ToolSet or the tools (functions become tools); `model` a ChatModel or the `env` key
    holding one; `max_turns` the most rounds of tool calls before the run fails; `max_calls_per_reply` the
    most tool calls one reply may ask for (more fail the run)."""
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools)
    pipe = pipeline if pipeline is not None else Pipeline(name, scope)
    fields = pipe.scope
    required = {label: _field(fields, label, value, default, True) for label, value, default in (
        ("messages_from", messages_from, "messages"), ("pending_from", pending_from, "pending_tool_calls"),
        ("into", into, "answer"))}
    agent = ToolAgent(toolset, model, tool_choice=tool_choice, max_calls_per_reply=max_calls_per_reply,
                      **required,  # type: ignore[arg-type]
                      system_from=_field(fields, "system_from", system_from, "prompt", False),
                      prompt_id_from=_field(fields, "prompt_id_from", prompt_id_from, "prompt_id", False),
                      question_from=_field(fields, "question_from", question_from, "question", False))
    return agent.build(pipe, max_turns=max_turns)


class ToolAgent:
    """The tool agent's stages as methods of one object holding what they share: the tools, the model
    and the scope fields they read and write. `build` appends them to a pipeline: think, route, approve,
    run_tool (arun_tool for async tools) and final are stages, and a step is named after its method; the
    other methods are parts of them."""

    def __init__(self, toolset: ToolSet, model: Union[ChatModel, str], *, tool_choice: ToolChoice,
                 max_calls_per_reply: int, messages_from: str, pending_from: str, into: str,
                 system_from: Optional[str], prompt_id_from: Optional[str], question_from: Optional[str]) -> None:
        self.toolset, self.model, self.max_calls_per_reply = toolset, model, max_calls_per_reply
        self.messages_from, self.pending_from, self.into = messages_from, pending_from, into
        self.system_from, self.prompt_id_from, self.question_from = system_from, prompt_id_from, question_from
        self.options: dict[str, Any] = {"tools": toolset.specs}
        if tool_choice is not None:
            self.options["tool_choice"] = tool_choice

    def build(self, pipe: Pipeline[Any], *, max_turns: int) -> Pipeline[Any]:
        """Append think → route → [approve_tools →] tools → think … → final to `pipe`, the loop back to
        think guarded by `max_turns`; return `pipe`. A method is no function to the pipeline, so each
        stage's description (its docstring's first line) is passed explicitly."""
        toolset = self.toolset
        each = self.arun_tool if any(t.is_async for t in toolset) else self.run_tool
        names = ", ".join(toolset.tools) or "none"
        arm = Pipeline(f"{pipe.name}.tools", pipe.scope)
        gated = [t.name for t in toolset if t.needs_approval]
        if gated:
            arm = arm.then(self.approve, id="approve_tools",
                           description=f"a person approves calls of {', '.join(gated)}")
        arm = arm.map(each, over=self.pending_from, id="tools", name="tools", tool=True,
                      description=f"run each tool call ({names})")
        final = Pipeline(f"{pipe.name}.final", pipe.scope).then(self.final, description=_summary(self.final))
        return (pipe.then(self.think, id="think", description=_summary(self.think))
                .branch(self.route, {"tools": arm, "final": final}, id="route", description=_summary(self.route))
                .loop_to("think", when="tools", max_iterations=max_turns, id="max_turns"))

    def think(self, scope: Any, ctx: StageContext) -> None:
        """Ask the model, with the tools; keep its reply and the tool calls it asked for."""
        chat = chat_model(self.model, ctx, "tool_agent")
        messages, asked = conversation(scope, system_from=self.system_from, messages_from=self.messages_from,
                                       question_from=self.question_from, ask=ctx.iteration == 0)
        prompt_id = (getattr(scope, self.prompt_id_from) or None) if self.prompt_id_from else None
        reply = ctx.complete(chat, messages, prompt_id=prompt_id, **self.options)
        if len(reply.tool_calls) > self.max_calls_per_reply:
            raise ToolError(f"the model asked for {len(reply.tool_calls)} tool calls in one reply; at most "
                            f"{self.max_calls_per_reply} are run (tool_agent(max_calls_per_reply=...))")
        calls = distinct_ids(reply.tool_calls)
        history = getattr(scope, self.messages_from)
        if asked:
            append_message(history, Message(role="user", content=messages[-1].content))
        message = reply.message
        append_message(history, message if calls == list(reply.tool_calls) else
                       message.model_copy(update={"tool_calls": calls}))
        setattr(scope, self.pending_from, calls)

    def route(self, scope: Any) -> str:
        """Tools while the model asks for them; else the final answer."""
        pending = self.pending_from
        return decide(scope, [("the model asked for tools", lambda s: bool(getattr(s, pending)), "tools")],
                      default="final")

    def approve(self, scope: Any, ctx: StageContext) -> None:
        """Pause for a person when the reply asks for a tool that needs approval; go on with their decisions."""
        toolset = self.toolset
        pending = [_call(c) for c in getattr(scope, self.pending_from)]
        asks = [c for c in pending if c.name in toolset and toolset[c.name].needs_approval]
        if not asks:
            return
        decisions: ToolApprovals = ctx.interrupt(ask_payload(asks, toolset.tools), expect=ToolApprovals)
        kept = []
        for call in pending:
            decision = decisions.decision(call.id)
            if decision is None or decision.approved:
                kept.append(call if decision is None or decision.arguments is None else
                            ToolCall(id=call.id, name=call.name, arguments=decision.arguments))
            else:
                self.reject(scope, ctx, call, decision.message)
        setattr(scope, self.pending_from, kept)

    def reject(self, scope: Any, ctx: StageContext, call: ToolCall, message: str) -> None:
        """A call a person rejected: recorded as a tool call that never ran, its message read by the model."""
        text = REJECTED.format(message=message.strip() or "not approved")
        ctx.emit("tool_calls", call_id=call.id, name=call.name, arguments=call.arguments,
                 arguments_text=call.arguments_text, result=text, error="rejected by a person",
                 error_kind="rejected", truncated=False, original_chars=len(text), started_at=None,
                 duration_ms=0.0)
        append_message(getattr(scope, self.messages_from), Message(role="tool", tool_call_id=call.id, content=text))

    def run_tool(self, scope: Any, ctx: StageContext) -> None:
        """Run one tool call the model asked for (errors go back to the model), once if it has side effects."""
        call, toolset = _call(ctx.item), self.toolset
        if not self.is_effect(call):
            return self.record(scope, ctx, toolset.run(call, **self.injected(scope, ctx, call, None)))
        done = ctx.effect(call.name,
                          lambda key: toolset.run(call, **self.injected(scope, ctx, call, key)).recorded(),
                          input=_input(call), kind="tool", key=call.id)
        self.record(scope, ctx, ToolOutcome(**done))

    async def arun_tool(self, scope: Any, ctx: StageContext) -> None:
        """Run one tool call the model asked for (errors go back to the model), once if it has side effects."""
        call, toolset = _call(ctx.item), self.toolset
        if not self.is_effect(call):
            return self.record(scope, ctx, await toolset.arun(call, **self.injected(scope, ctx, call, None)))

        async def make(key: str) -> dict[str, Any]:
            return (await toolset.arun(call, **self.injected(scope, ctx, call, key))).recorded()
        self.record(scope, ctx, ToolOutcome(**await ctx.aeffect(call.name, make, input=_input(call), kind="tool",
                                                                key=call.id)))

    def is_effect(self, call: ToolCall) -> bool:
        """A call of a known tool not declared pure: made once, answered from the record after that."""
        one = self.toolset.tools.get(call.name)
        return one is not None and not one.pure

    def injected(self, scope: Any, ctx: StageContext, call: ToolCall, key: Optional[str]) -> dict[str, Any]:
        """What a tool may ask for by name (`inject=`): none of it is built for a tool that asks for nothing."""
        one = self.toolset.tools.get(call.name)
        return {**ctx.env, "scope": scope, "ctx": ctx, "idempotency_key": key} if one is None or one.injected else {}

    def record(self, scope: Any, ctx: StageContext, outcome: ToolOutcome) -> None:
        """A tool call's `tool_calls` row, its error in the step's log, and its result message for the model."""
        ctx.emit("tool_calls", call_id=outcome.call_id, name=outcome.name, arguments=outcome.arguments,
                 arguments_text=outcome.arguments_text, result=outcome.content, error=outcome.error,
                 error_kind=outcome.error_kind, truncated=outcome.truncated, original_chars=outcome.original_chars,
                 started_at=outcome.started_at, duration_ms=outcome.duration_ms)
        if outcome.error is not None:
            ctx.log(f"tool {outcome.name} ({outcome.call_id}): {outcome.error_kind}: {outcome.error}")
        append_message(getattr(scope, self.messages_from), outcome.message())

    def final(self, scope: Any) -> None:
        """The answer: the last assistant message's text."""
        history = getattr(scope, self.messages_from)
        last = next((history[i] for i in range(len(history) - 1, -1, -1) if history[i].get("role") == "assistant"),
                    None)
        setattr(scope, self.into, (last.get("content") or "") if last is not None else "")


def _summary(fn: Callable[..., Any]) -> Optional[str]:
    """The first line of a stage's docstring: its description in the flow's graph."""
    doc = inspect.getdoc(fn)
    return doc.strip().splitlines()[0] if doc else None


def _call(item: Any) -> ToolCall:
    """A tool call as a plain ToolCall (from a scope's tracked copy, or a dict loaded back)."""
    if isinstance(item, ToolCall):
        return item
    return ToolCall.model_validate(item.model_dump() if hasattr(item, "model_dump") else item)


def _input(call: ToolCall) -> Any:
    """What identifies a tool call's effect: its arguments (parsed when they are JSON)."""
    return call.arguments if call.arguments is not None else call.arguments_text


def distinct_ids(calls: Iterable[ToolCall]) -> list[ToolCall]:
    """The calls, a repeated id told apart (`id#2`, ...) so each result goes back under its own id."""
    seen: dict[str, int] = {}
    out = []
    for call in calls:
        n = seen[call.id] = seen.get(call.id, 0) + 1
        out.append(call if n == 1 else call.model_copy(update={"id": f"{call.id}#{n}"}))
    return out
