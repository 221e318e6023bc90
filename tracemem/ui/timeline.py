"""A run's timeline, with fork branches side by side, one page of steps at a time on the whole run's scale.

Steps run one after another except the branches of a fork, which the runner starts together
(consecutive `fork-branch` steps); they form one unit here: one row of parallel lanes. (The stage
graph groups them the same way, in SQL over the whole run: ui/run_outline.py.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..record import Step

__all__ = ["TimelineRow", "timeline", "units"]


def units(steps: list[Step]) -> list[list[Step]]:
    """Steps grouped into what ran at once: a single step, or the branches of one fork."""
    out: list[list[Step]] = []
    for s in steps:
        last = out[-1] if out else None
        if (s.kind == "fork-branch" and last and last[0].kind == "fork-branch"
                and s.stage not in {b.stage for b in last}):
            last.append(s)
        else:
            out.append([s])
    return out


@dataclass
class TimelineRow:
    """One row: a step, or a fork's branches as parallel lanes; bars placed in % of the run's time."""

    fork: bool
    bars: list[dict[str, Any]]


def timeline(steps: list[Step], start: int, end: int, limit: int = 500) -> tuple[list[TimelineRow], int]:
    """Rows for `steps` (at most `limit` units) on the scale `start`..`end` (ns: the whole run's), and how many
    units were left out."""
    span = max(end - start, 1)
    groups = units(steps)
    rows = []
    for group in groups[:limit]:
        bars = [{"step": s.step, "stage": s.stage, "status": s.status, "kind": s.kind,
                 "left": round(100 * (s.started_at - start) / span, 3),
                 "width": round(max(100 * (s.ended_at - s.started_at) / span, 0.4), 3),
                 "ms": round((s.ended_at - s.started_at) / 1e6, 3)} for s in group]
        rows.append(TimelineRow(len(group) > 1 or group[0].kind == "fork-branch", bars))
    return rows, max(0, len(groups) - limit)
