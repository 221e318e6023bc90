"""The scope at a step, and what changed since the step before, path by path.

`run.state_at(step)` replays the recorded writes; both states are flattened to leaf paths in the
scope's own path syntax (`context.policy`, `messages[2].content`) and compared, so the diff names
exactly the paths a person would backtrack.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from ..run import Run
from ..text import clip

__all__ = ["as_data", "diff", "flatten", "scope_at"]


def as_data(state: Any) -> Any:
    """A replayed state as JSON data (a pydantic model when the scope model is known here, else data)."""
    if hasattr(state, "model_dump"):
        return state.model_dump(mode="json")
    return json.loads(json.dumps(state, default=str))


def flatten(value: Any, prefix: str = "", out: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Leaf paths → values; an empty list or dict is a leaf of its own."""
    out = {} if out is None else out
    if isinstance(value, dict) and value:
        for key, item in value.items():
            flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            flatten(item, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


def _shown(value: Any) -> str:
    return clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str), 160)


def diff(before: Any, after: Any) -> list[dict[str, str]]:
    """Added, changed and removed leaf paths, in the order of the later state. An empty list or dict that
    filled up (or a full one emptied) shows as its elements added (or removed), not as a leaf of its own."""
    a, b = flatten(before), flatten(after)

    def container(path: str, value: Any, other: dict[str, Any]) -> bool:
        return value in ([], {}) and any(p.startswith((path + ".", path + "[")) for p in other)

    rows = []
    for path, value in b.items():
        if path not in a:
            if not container(path, value, a):
                rows.append({"path": path, "change": "added", "before": "", "after": _shown(value)})
        elif a[path] != value:
            rows.append({"path": path, "change": "changed", "before": _shown(a[path]), "after": _shown(value)})
    rows += [{"path": p, "change": "removed", "before": _shown(v), "after": ""} for p, v in a.items()
             if p not in b and not container(p, v, b)]
    return rows


def scope_at(run: Run, step: int) -> dict[str, Any]:
    """The scope after `step`, the one before it (after the previous step, or the run input before the
    first), the diff between them, and the writes the step made."""
    numbers = [s.step for s in run.steps]
    current = run.step(step)  # a clear error naming the run's steps for a step it lacks
    index = numbers.index(current.step)
    after = as_data(run.state_at(current.step))
    if index == 0:
        before, before_label = run.input, "the run input"
    else:
        prev = run.steps[index - 1]
        before, before_label = as_data(run.state_at(prev.step)), f"step {prev.step} ({prev.stage})"
    return {"step": current, "after": after, "before_label": before_label, "diff": diff(before, after),
            "pretty": json.dumps(after, indent=2, ensure_ascii=False, default=str),
            "previous": numbers[index - 1] if index > 0 else None,
            "next": numbers[index + 1] if index + 1 < len(numbers) else None}
