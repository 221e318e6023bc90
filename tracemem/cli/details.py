"""What `tracemem show RUN` prints on request, in full: model calls with the exact messages they sent and tool calls
(`--calls`), assembled prompts section by section (`--prompts`) and step logs (`--logs`); and the same as JSON for
`--json`.

The default view of `show` is a summary that fits a screen; these parts are long by nature (a whole
reply, a whole prompt), so they are printed uncut, indented under a one-line header each.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from ..run import Run
from .render import iso_ns

__all__ = ["calls_text", "logs_text", "prompts_text", "run_json", "summary_line"]


def _indented(text: Optional[str], prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in (text or "").splitlines()) or prefix + "(empty)"


def _stages(run: Run) -> dict[int, str]:
    return {s.step: s.stage for s in run.steps}


def summary_line(run: Run) -> Optional[str]:
    """How much `--calls`, `--prompts` and `--logs` would add (None when there is nothing)."""
    calls, prompts = run.rows.get("model_calls", []), run.rows.get("prompts", [])
    sections, logs = len(run.rows.get("prompt_sections", [])), sum(len(s.logs) for s in run.steps)
    parts = [f"{len(calls)} model call{'s' * (len(calls) != 1)}" if calls else "",
             f"{len(prompts)} prompt{'s' * (len(prompts) != 1)} ({sections} sections)" if prompts else "",
             f"{logs} log line{'s' * (logs != 1)}" if logs else ""]
    shown = ", ".join(p for p in parts if p)
    return f"{shown}: see them with --calls, --prompts, --logs (or --full)" if shown else None


def _message_lines(message: dict[str, Any]) -> list[str]:
    """One sent message: its role (and the tool call it answers), its text, the tool calls it asked for."""
    role = str(message.get("role") or "?")
    head = f"    [{role}]" + (f" (result of {message['tool_call_id']})" if message.get("tool_call_id") else "")
    content = message.get("content")
    text = content if isinstance(content, str) or content is None else json.dumps(content, ensure_ascii=False)
    lines = [head] + ([_indented(text, "      ")] if text else [])
    for c in message.get("tool_calls") or ():
        fn = c.get("function") or {}
        lines.append(f"      asks for tool {fn.get('name')}({fn.get('arguments')}) [{c.get('id')}]")
    return lines


def _request_lines(request: Any) -> list[str]:
    """The exact request a call sent (store/read/requests.py): system instructions, messages, tools offered."""
    if request is None or not request.recorded:
        return ["  sent: (not recorded: the call predates exact requests, or was recorded without one)"]
    out = [f"  sent: {len(request.system)} system, {len(request.messages)} messages"
           + (f", tools {', '.join(str((t.get('function') or t).get('name')) for t in request.tools)}"
              if request.tools else "") + (f", options {json.dumps(request.options)}" if request.options else "")]
    for message in [*request.system, *request.messages]:
        out.extend(_message_lines(message))
    if request.missing:
        out.append(f"  not in the store: {', '.join(request.missing)}")
    return out


def calls_text(run: Run, requests: Optional[dict[str, Any]] = None) -> str:
    """Every model call of the run, with the messages it sent (`requests`: `store.requests(run)`) and its whole
    reply."""
    stages, out = _stages(run), []
    for call in run.rows.get("model_calls", []):
        tokens = f", {call.get('input_tokens')} → {call.get('output_tokens')} tokens" \
            if call.get("input_tokens") is not None else ""
        ms = call.get("duration_ms", call.get("latency_ms"))
        took = f", {ms:.2f} ms" if isinstance(ms, (int, float)) else ""
        out.append(f"step {call['step']} {stages.get(call['step'], '?')}: {call.get('model')} "
                   f"({call.get('provider') or 'provider unknown'}){tokens}{took}"
                   + (f", prompt {call['prompt_id']}" if call.get("prompt_id") else ""))
        if call.get("error"):
            out.append(f"  error: {call['error']}")
        if requests is not None:
            out.extend(_request_lines(requests.get(call.get("call_id"))))
        out.append("  reply:")
        out.append(_indented(call.get("response")))
        asked = call.get("tool_calls")
        for c in (json.loads(asked) if isinstance(asked, str) else asked) or ():
            out.append(f"  asked for tool {c.get('name')}({c.get('arguments')}) [{c.get('id')}]")
    for tool in run.rows.get("tool_calls", []):  # what the tool steps ran (stages.tool_agent)
        outcome = f"failed ({tool.get('error_kind')}): {tool.get('error')}" if tool.get("error") else "returned:"
        out.append(f"step {tool['step']} {stages.get(tool['step'], '?')}: tool {tool['name']}"
                   f"({tool.get('arguments_text') or ''}) [{tool.get('call_id')}] {outcome}")
        if not tool.get("error"):
            out.append(_indented(tool.get("result")))
    return "\n".join(out) or "(no model calls)"


def prompts_text(run: Run) -> str:
    """Every prompt the run assembled, section by section, each with where it came from."""
    stages, out = _stages(run), []
    sections = run.rows.get("prompt_sections", [])
    for prompt in run.rows.get("prompts", []):
        own = [s for s in sections if s["prompt_id"] == prompt["prompt_id"]]
        out.append(f"prompt {prompt['prompt_id']} (step {prompt['step']} {stages.get(prompt['step'], '?')}, "
                   f"{len(own)} sections, {len(prompt.get('text') or '')} characters)")
        for s in own:
            kind, source_kind, source_id = s["kind"], s.get("source_kind"), s.get("source_id")
            source = "" if not source_kind or (source_kind == kind and source_id in (None, kind)) else \
                f" ← {source_kind}" + (f" {source_id}" if source_id and source_id != source_kind else "")
            out.append(f"  [{s['idx']}] {kind}{source}:")
            out.append(_indented(s.get("text")))
        if not own:
            out.append(_indented(prompt.get("text"), "  "))
    return "\n".join(out) or "(no prompts)"


def logs_text(run: Run) -> str:
    """Every step's log lines."""
    out = []
    for s in run.steps:
        if s.logs:
            out.append(f"step {s.step} {s.stage}:")
            out.extend(f"  {line}" for line in s.logs)
    return "\n".join(out) or "(no log lines)"


def _times(row: dict[str, Any]) -> dict[str, Any]:
    return {k: iso_ns(v) if isinstance(v, int) and k.endswith("_at") else v for k, v in row.items()}


def _call_json(call: dict[str, Any], requests: dict[str, Any]) -> dict[str, Any]:
    request = requests.get(call.get("call_id"))
    out = _times(call)
    if request is not None and request.recorded:
        out["request"] = {"system": request.system, "messages": request.messages, "tools": request.tools,
                          "options": request.options, "missing": list(request.missing)}
    return out


def run_json(run: Run, output: Any, final_state: Any, requests: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`show --json`: the whole run, every time as an ISO 8601 UTC string (as `runs --json` prints them); each
    model call with the exact request it sent (`requests`: `store.requests(run)`)."""
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "pipeline_hash": run.pipeline_hash, "status": run.status,
        "error": run.error, "degraded": run.degraded, "subject": run.subject, "query": run.query,
        "started_at": iso_ns(run.started_at), "ended_at": iso_ns(run.ended_at),
        "duration_ms": (run.ended_at - run.started_at) / 1e6 if run.ended_at else None,
        "trace_id": run.trace_id, "parent_run_id": run.parent_run_id, "continues": run.continues,
        "pending": run.pending, "resume_at": run.resume_at, "forked_from_run_id": run.forked_from_run_id,
        "forked_from_step": run.forked_from_step,
        "steps": [{**_times(s._asdict()), "duration_ms": (s.ended_at - s.started_at) / 1e6} for s in run.steps],
        "decisions": [d._asdict() for d in run.decisions],
        "model_calls": [_call_json(c, requests or {}) for c in run.rows.get("model_calls", [])],
        "prompts": [{**p, "sections": [s for s in run.rows.get("prompt_sections", [])
                                       if s["prompt_id"] == p["prompt_id"]]} for p in run.rows.get("prompts", [])],
        "output": output, "final_state": final_state,
    }
