"""How a trace node reads as one line: `describe(node)`, for every kind of node the walk adds.

The trace's narrative (`Trace.explain`), its Mermaid chart, `why`'s causes and the viewer's
backtrack page all print a node the same way, so the wording lives here once, one small
function per kind, beside the decision wording the snapshot stage also quotes.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..text import clip

__all__ = ["describe", "describe_decision"]

_SECTION_LABELS = {"memory": "[Memory]", "user": "[User]", "context": "[Context]", "directions": "[Directions]",
                  "instructions": "instructions", "base": "base rules", "memory_intro": "[Memory] intro",
                  "hook": "host hook"}


def _value(value: Any, limit: int = 60) -> str:
    """A recorded value on one line: text as it is, anything else as JSON, cut to `limit`."""
    return clip(value if isinstance(value, str) else json.dumps(value, default=str), limit)


def describe_decision(stage: str, chosen: str, evidence: Any, values: bool = False) -> str:
    """"<stage> chose '<branch>' because '<rule>'" — the rule that matched, when `decide()` recorded one;
    with `values`, also the scope values that rule read (every rule's, when the default was taken):
    "... because 'asks about a refund' (read question = 'Can I get a refund…')"."""
    rules = evidence.get("rules", []) if isinstance(evidence, dict) else []
    matched = [r for r in rules if r.get("matched")]
    why = f" because '{matched[0]['rule']}'" if matched else ""
    if values and rules and not matched:
        why = " by default (no rule matched)"
    text = f"{stage} chose '{chosen}'{why}"
    if values:
        read: dict[str, Any] = {}
        for rule in matched[:1] or rules:
            read.update(rule.get("read") or {})
        if read:
            text += " (read " + ", ".join(f"{path} = {_value(v, 48)!r}" if isinstance(v, str) else
                                          f"{path} = {_value(v, 48)}" for path, v in read.items()) + ")"
    return text


def describe(d: dict[str, Any]) -> str:
    """One line for a trace node, as `explain()` prints it."""
    kind = d.get("kind")
    line = _BY_KIND.get(kind)  # type: ignore[arg-type]
    if line is not None:
        return line(d)
    return d.get("label") or f"{kind} {d}"


def _write(d: dict[str, Any]) -> str:
    verb = {"set": "=", "append": "+=", "delete": "deleted"}.get(d["verb"], d["verb"])
    value = "" if d["verb"] == "delete" else " " + _value(json.loads(d["value"]) if d["value"] else None)
    if d.get("edit"):
        return f"{d['path']} {verb}{value}  (edit, run {d['run_id'][:8]} step {d['step']}: {d['edit']})"
    return f"{d['path']} {verb}{value}  (run {d['run_id'][:8]} step {d['step']}, {d['stage']})"


def _input(d: dict[str, Any]) -> str:
    value = d.get("value")
    given = f" = {_value(value)}" if value not in (None, "", [], {}) else ""
    return f"{d['path']}{given}: run input (run {d['run_id'][:8]})"


def _decision(d: dict[str, Any]) -> str:
    return (f"decider {describe_decision(d['stage'], d['chosen'], d.get('evidence'))} "
            f"(run {d['run_id'][:8]} step {d['step']})")


def _step(d: dict[str, Any]) -> str:
    if d.get("source_ref") or d.get("extracted"):  # the step a memory was extracted in
        turn = f", turn {d['source_ref']}" if d.get("source_ref") else ""
        return f"extracted in run {d['run_id'][:8]}, step {d['step']} ({d['stage']}){turn}"
    return f"step {d['step']} {d['stage']} (run {d['run_id'][:8]})"


def _model_call(d: dict[str, Any]) -> str:
    if d.get("error"):
        return f"model call {d['model']} failed: {d['error']}"
    prompt = f" (prompt {d['prompt_id']})" if d.get("prompt_id") else ""
    calls = d.get("tool_calls") if isinstance(d.get("tool_calls"), list) else []
    if calls:
        asked = ", ".join(f"{c.get('name')}({_value(c.get('arguments') or '', 40)})" for c in calls[:4])
        more = f" and {len(calls) - 4} more" if len(calls) > 4 else ""
        said = f" and said {_value(d['response'], 30)!r}" if d.get("response") else ""
        return f"model call {d['model']} asked for {asked}{more}{said}{prompt}"
    return f"model call {d['model']} replied {_value(d.get('response') or '', 50)!r}{prompt}"


def _tool_call(d: dict[str, Any]) -> str:
    where = f"(run {d['run_id'][:8]} step {d['step']}"
    took = f", {d['duration_ms']:.2f} ms)" if isinstance(d.get("duration_ms"), (int, float)) else ")"
    call = f"tool call {d['name']}({_value(d.get('arguments_text') or '', 50)})"
    if d.get("error"):
        return f"{call} failed ({d.get('error_kind') or 'error'}): {_value(d['error'], 80)}  {where}{took}"
    cut = ", truncated" if d.get("truncated") else ""
    return f"{call} returned {_value(d.get('result') or '', 50)!r}  {where}{took[:-1]}{cut})"


def _prompt_section(d: dict[str, Any]) -> str:
    label = _SECTION_LABELS.get(d["section"], d["section"])
    line = f" line {d['line']}" if d["section"] == "memory" else ""
    return f"prompt {d['prompt_id']} section {label}{line}: {_value(d['text'], 60)}"


def _memory(d: dict[str, Any]) -> str:
    if d.get("missing"):
        return f"memory {d['memory_id']} ({d['missing']})"
    flag = f", superseded by {d['superseded_by']}" if d.get("superseded_by") else ""
    since = " — flagged since: this value rests on a flagged source" if d.get("forgotten") or \
        d.get("review_state") in ("stale", "contradicted") else ""
    state = "forgotten" if d.get("forgotten") else d["review_state"]
    return (f"memory {d['memory_id']} {_value(d['text'], 60)!r} (confidence {d['confidence']:g}, "
            f"{state}{flag}){since}")


def _human_input(d: dict[str, Any]) -> str:
    who = f" by {d['by']}" if d.get("by") else ""
    asked = f" (asked at step {d['asked_step']}: {_value(d.get('asked'), 50)})" if d.get("asked_step") else \
        f" (asked: {_value(d.get('asked'), 50)})"
    return f"human input{who}: {_value(d.get('answer'))}{asked}"


def _run(d: dict[str, Any]) -> str:
    if d.get("via") == "load_snapshot":
        suspect = f" — suspect since: {d['suspect']}" if d.get("suspect") else ""
        gone = f"; {d['missing']}" if d.get("missing") else ""
        return (f"past run {d['run_id'][:8]} loaded as a snapshot (score {d['score']:.2f}, "
                f"{d['projection']}{gone}){suspect}")
    return f"run {d['run_id'][:8]}" + (f" ({d['missing']})" if d.get("missing") else "")


_BY_KIND: dict[str, Callable[[dict[str, Any]], str]] = {
    "write": _write, "input": _input, "decision": _decision, "step": _step,
    "model_call": _model_call, "tool_call": _tool_call, "prompt_section": _prompt_section,
    "memory": _memory, "human_input": _human_input, "run": _run,
}
