"""Verified causes: re-ask the answering model call without one source, once per source.

The answering call's exact request is read back from the store (system instructions, messages,
tools, options, as sent); a source is cut out of it — a memory's lines and any prompt section
by their text, a tool's result by its call id (the call stays, its result reads "(left out)"),
an earlier turn's messages and a run input by their text — and the request is sent to the
model once. Nothing else runs: no stage, no tool, no side effect; everything but the one
source is the record. Each re-ask is recorded as a run of its own (pipeline `tracemem.why`,
its input naming the run, the model call and the source), so the verdict is evidence anyone
can re-read. A source whose content is not in the answering call's request (a human input
that acted by letting a tool run, a memory only an earlier turn saw) cannot be tested this
way: it is marked so, and the next source is tested instead, so `verify=k` makes exactly k
model calls when k sources can be tested. The traced run's own inputs are not tested: they
are what was asked (without the question, any answer changes), not what the agent brought in.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

from pydantic import BaseModel

from ..errors import TracememError, UsageError
from ..flow.pipeline import Pipeline
from ..memory.text import terms
from .causes import Cause

__all__ = ["LEFT_OUT", "VERIFY_PIPELINE", "VerifyScope", "choose_model", "reply_text", "similarity", "verify", "without"]

LEFT_OUT = "(left out)"
VERIFY_PIPELINE = "tracemem.why"


class VerifyScope(BaseModel):
    """A re-asked call: what it tested, what it sent, what came back."""

    of_run: str = ""
    call_id: str = ""
    without: str = ""
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    options: dict[str, Any] = {}
    reply: str = ""
    tool_calls: list[dict[str, Any]] = []


def _reask(scope: Any, ctx: Any) -> None:
    """Send the answering call's request, without one source, to the model once."""
    options = dict(scope.options)
    if scope.tools:
        options["tools"] = list(scope.tools)
    reply = ctx.complete(ctx.env["model"], list(scope.messages), **options)
    scope.reply = reply.text
    scope.tool_calls = [{"name": c.name, "arguments": c.arguments_text} for c in reply.tool_calls]


def choose_model(model: Any, env: Optional[Mapping[str, Any]]) -> Any:
    """The model a re-ask goes to: `model`, else env["model"], else the one model in `env`."""
    if model is not None:
        return model
    if env:
        if "model" in env:
            return env["model"]
        models = [v for v in env.values() if callable(getattr(v, "complete", None))]
        if len(models) == 1:
            return models[0]
    raise UsageError("verify=k re-asks the answering model call, so it needs a model: pass model=<a ChatModel> "
                     "or env={'model': ...} (on the command line: --env MODULE:ATTR with a 'model' key)")


def _cut_text(messages: list[dict[str, Any]], texts: list[str]) -> bool:
    """Take each text out of the first message holding it (a whole message becomes LEFT_OUT)."""
    found = False
    for text in (t for t in texts if t and t.strip()):
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str) or text not in content:
                continue
            if content.strip() == text.strip():
                m["content"] = LEFT_OUT  # the whole message was the source
            else:  # a part of it (a prompt line): taken out with its line break
                m["content"] = content.replace(text + "\n" if text + "\n" in content else text, "", 1)
            found = True
            break
    return found


def without(messages: list[dict[str, Any]], cause: Cause, sections: list[str]) -> Optional[list[dict[str, Any]]]:
    """The request's messages without `cause` (None: its content is not in them). `sections`: the texts
    of the answering call's prompt sections the cause made (a memory's lines)."""
    out = copy.deepcopy(messages)
    if cause.kind == "tool":
        hit = [m for m in out if m.get("role") == "tool" and m.get("tool_call_id") == cause.cut.get("tool_call_id")]
        for m in hit:
            m["content"] = LEFT_OUT
        return out if hit else None
    texts = sections or cause.cut.get("texts") or ([cause.cut["text"]] if cause.cut.get("text") else [])
    if cause.kind == "memory" and not texts:
        texts = [cause.text]
    return out if _cut_text(out, texts) else None


def similarity(a: str, b: str) -> float:
    """Cosine of the two texts' sets of content terms (1: the same words)."""
    ta, tb = set(terms(a)), set(terms(b))
    if not ta or not tb:
        return 1.0 if a.strip() == b.strip() else 0.0
    return len(ta & tb) / (len(ta) * len(tb)) ** 0.5


def reply_text(text: Optional[str], calls: Any) -> str:
    """A reply as one comparable text: its words, and the tool calls it asked for."""
    asked = [f"{c.get('name')}({c.get('arguments')})" for c in calls or [] if isinstance(c, dict)]
    return " ".join([(text or "").strip()] + [f"[asks {a}]" for a in asked]).strip()


def verify(causes: list[Cause], k: int, *, trace: Any, answering: Optional[str], model: Any, store: Any) -> int:
    """Re-ask the answering call without each of the first `k` testable causes; returns the model calls made."""
    if answering is None:
        raise TracememError(f"{trace.path} of run {trace.run_id} was not answered by a model call, so verify has "
                            f"nothing to re-ask; trace.counterfactual(source, flow=...) re-executes the run instead")
    if store is None:
        raise TracememError("verify reads the answering call's exact request from the store and records each re-ask: "
                            "pass store=, or ask about a run recorded in a store")
    g = trace.graph
    call = g.nodes[answering]
    call_id = answering.split(":", 2)[2]
    request = store.requests(trace.run).get(call_id)
    if request is None or not request.recorded or request.missing:
        raise TracememError(f"the exact request of model call {call_id} (run {call['run_id']}) is not in the store, "
                            f"so it cannot be re-asked (recorded before exact requests were, or its content pruned)")
    sent = list(request.system) + list(request.messages)
    before = reply_text(call.get("response"), call.get("tool_calls"))
    flow = Pipeline(VERIFY_PIPELINE, VerifyScope).then(_reask, id="reask").build()
    made = 0
    for cause in causes:
        if made >= k:
            break
        if cause.kind == "input":  # the run's own input is the question being answered, not a source to test
            cause.note = "the run's own input: what was asked, not tested"
            continue
        lines = [d["text"] for _, d in g.nodes(data=True) if d.get("kind") == "prompt_section"
                 and d.get("prompt_id") == call.get("prompt_id") and cause.kind == "memory"
                 and d.get("source_kind") == "memory" and d.get("source_id") == cause.cut.get("memory_id")]
        cut = without(sent, cause, lines)
        if cut is None:
            cause.note = "not in the answering call's request (it acted through earlier steps)"
            continue
        run = flow.run({"of_run": trace.run_id, "call_id": call_id, "without": cause.node, "messages": cut,
                        "tools": list(request.tools or []), "options": dict(request.options or {})},
                       store=store, env={"model": model})
        made += 1
        after = reply_text(run.output.reply, run.output.tool_calls)
        cause.changed_to, cause.check_run_id = after, run.run_id
        cause.decisive = " ".join(after.split()) != " ".join(before.split())
        cause.change = round(1.0 - similarity(before, after), 4) if cause.decisive else 0.0
    return made
