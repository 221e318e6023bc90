"""A recorded `Run` arranged for its page: per step, what it read (and from which write), what it
wrote, the decision and its evidence, logs, memory and snapshot uses, tool calls and model calls
with the assembled prompt, section by section.

Plain data for the template, built only from the public `Run` (its steps, reads, writes,
decisions and `rows` — the extra tables the store loaded with it): a page of a long run is a `Run`
loaded with that page's steps alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..record import Step
from ..run import Run
from ..text import clip

__all__ = ["SECTION_LABELS", "STEP_WINDOW", "StepView", "build_steps", "value_text"]

SECTION_LABELS = {"memory": "[Memory]", "user": "[User]", "context": "[Context]", "directions": "[Directions]",
                  "instructions": "instructions", "base": "base rules", "memory_intro": "[Memory] intro",
                  "hook": "host hook"}
SHOWN_TABLES = {"model_calls", "prompts", "prompt_sections", "memory_uses", "snapshot_uses", "subflows",
                "tool_calls", "run_embeddings", "effects"}
VALUE_CLIP = 200
STEP_WINDOW = 200  # steps per page of a long run: a 1,000-step run is five pages, not one of a megabyte


@dataclass
class StepView:
    """One step as its section of the run page shows it."""

    step: Step
    duration_ms: float
    reads: list[dict[str, Any]] = field(default_factory=list)
    writes: list[dict[str, Any]] = field(default_factory=list)
    decision: Optional[dict[str, Any]] = None
    memory_uses: list[dict[str, Any]] = field(default_factory=list)
    snapshot_uses: list[dict[str, Any]] = field(default_factory=list)
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)  # assembled here, sent by no call shown
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)  # side effects: made live, or replayed
    other: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def value_text(value: Optional[str]) -> str:
    """A write's stored JSON as a person reads it: strings unquoted, the rest as compact JSON."""
    if value is None:
        return ""
    try:
        data = json.loads(value)
    except ValueError:
        return value
    return data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)


def _by_step(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row.get("step"), []).append(row)  # type: ignore[arg-type]
    return out


def _sections(run: Run) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in run.rows.get("prompt_sections", ()):
        label = SECTION_LABELS.get(s["kind"], s["kind"])
        memory = s["source_id"] if s.get("source_kind") == "memory" else None
        out.setdefault(s["prompt_id"], []).append({**s, "label": label, "memory_id": memory,
                                                   "anchor": f"ps-{s['prompt_id']}-{s['idx']}"})
    return out


def _decision(chosen: str, evidence: Any) -> dict[str, Any]:
    rules = evidence.get("rules") if isinstance(evidence, dict) else None
    return {"chosen": chosen, "rules": rules if isinstance(rules, list) else None,
            "default": evidence.get("default") if isinstance(evidence, dict) else None,
            "evidence": json.dumps(evidence, indent=1, ensure_ascii=False, default=str)}


def build_steps(run: Run, tool_calls: Optional[list[dict[str, Any]]] = None,
                href: Callable[[Optional[int], str], str] = lambda step, anchor: f"#{anchor}") -> list[StepView]:
    """The steps `run` holds (a page of them: store/read/load.py `load_runs(steps=…)`) with their rows; `tool_calls`
    when the store has them outside `run.rows`. Reads link to the write they saw: `href(step, anchor)` gives
    the link, on this page or the page that shows it."""
    views = {s.step: StepView(s, round((s.ended_at - s.started_at) / 1e6, 3)) for s in run.steps}
    for r in run.reads:
        view = views.get(r.step)
        if view is None:
            continue
        if r.source_step is None:
            view.reads.append({"path": r.path, "source": "input", "href": "#input", "label": "run input"})
        else:
            view.reads.append({"path": r.path, "source": "write",
                               "href": href(r.source_step, f"w-{r.source_step}-{r.source_seq}"),
                               "label": f"write {r.source_step}.{r.source_seq}"})
    for w in run.writes:
        view = views.get(w.step)
        if view is None:
            continue
        text = value_text(w.value)
        view.writes.append({"step": w.step, "seq": w.seq, "path": w.path, "verb": w.verb,
                            "value": clip(text, VALUE_CLIP), "clipped": len(text) > VALUE_CLIP,
                            "anchor": f"w-{w.step}-{w.seq}"})
    for d in run.decisions:
        if d.step in views:
            views[d.step].decision = _decision(d.chosen, d.evidence)
    sections = _sections(run)
    shown: set[str] = set()
    for table, rows in (("memory_uses", "memory_uses"), ("snapshot_uses", "snapshot_uses"), ("effects", "effects")):
        for step, items in _by_step(list(run.rows.get(table, ()))).items():
            if step in views:
                getattr(views[step], rows).extend(items)
    for step, calls in _by_step(list(run.rows.get("model_calls", ()))).items():
        for call in calls:
            prompt_id = call.get("prompt_id")
            first = bool(prompt_id) and prompt_id not in shown
            if prompt_id:
                shown.add(prompt_id)
            if step in views:
                views[step].model_calls.append({**call, "sections": sections.get(prompt_id or "", []),
                                                "anchors": first})
    for p in run.rows.get("prompts", ()):
        if p["prompt_id"] not in shown and p.get("step") in views:
            shown.add(p["prompt_id"])
            views[p["step"]].prompts.append({**p, "sections": sections.get(p["prompt_id"], [])})
    calls = tool_calls if tool_calls is not None else list(run.rows.get("tool_calls", ()))
    for step, items in _by_step(calls).items():
        if step in views:
            views[step].tool_calls.extend(items)
    for table, rows in run.rows.items():
        if table in SHOWN_TABLES:
            continue
        for step, items in _by_step(list(rows)).items():
            if step in views:
                views[step].other[table] = items
    return [views[s.step] for s in run.steps]
