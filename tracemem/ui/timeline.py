"""A run's shape: its stage graph as recorded, and its timeline with fork branches side by side.

Both come from the steps alone. Steps run one after another except the branches of a fork,
which the runner starts together (consecutive `fork-branch` steps); they form one unit here:
one column of the stage graph, one row of parallel lanes in the timeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..record import Step
from ..run import Run
from .graphs import Edge, Node, layout, svg

__all__ = ["TimelineRow", "stage_graph", "timeline", "units"]


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


def stage_graph(run: Run, href: Callable[[int, str], str] = lambda step, anchor: f"#{anchor}") -> str:
    """The stages that ran, as an SVG: one column per unit in first-run order, an arrow per transition
    (labelled with the branch a decider chose, and ×N when taken N times); back edges are loops."""
    groups = units(run.steps)
    chosen = {d.step: d.chosen for d in run.decisions}
    step_stage = {s.step: s.stage for s in run.steps}
    layer: dict[str, int] = {}
    first: dict[str, Step] = {}
    runs: dict[str, list[Step]] = {}
    for i, group in enumerate(groups):
        for s in group:
            layer.setdefault(s.stage, i)
            first.setdefault(s.stage, s)
            runs.setdefault(s.stage, []).append(s)
    # compact the columns: the unit index of a stage's first run, renumbered without gaps
    columns = {v: n for n, v in enumerate(sorted(set(layer.values())))}
    edges: dict[tuple[str, str], Edge] = {}
    for prev, nxt in zip(groups, groups[1:]):
        for a in prev:
            for b in nxt:
                label = ""
                if b.routed_by is not None and step_stage.get(b.routed_by) == a.stage:
                    label = chosen.get(b.routed_by, "")
                key = (a.stage, b.stage)
                if key in edges:
                    edges[key].count += 1
                else:
                    edges[key] = Edge(a.stage, b.stage, "flow", label)
    nodes = []
    for stage, s in first.items():
        execs = runs[stage]
        failed = any(x.status != "ok" for x in execs)
        total_ms = sum(x.ended_at - x.started_at for x in execs) / 1e6
        sub = f"{s.kind}" + (f" ×{len(execs)}" if len(execs) > 1 else "") + f" · {total_ms:.1f} ms"
        nodes.append(Node(stage, columns[layer[stage]], stage, sub,
                          f"kind-{s.kind}" + (" failed" if failed else ""), href(s.step, f"step-{s.step}"),
                          f"{stage}: {len(execs)} run(s), first at step {s.step}"))
    return svg(layout(nodes, list(edges.values())), css_class="graph stage-graph", label=f"stage graph of {run.run_id}")


@dataclass
class TimelineRow:
    """One row: a step, or a fork's branches as parallel lanes; bars placed in % of the run's time."""

    fork: bool
    bars: list[dict[str, Any]]


def timeline(run: Run, lo: int = 0, hi: Optional[int] = None, limit: int = 500) -> tuple[list[TimelineRow], int]:
    """Rows for steps[lo:hi] (at most `limit` units) on the scale of the whole run, and how many units
    were left out."""
    if not run.steps:
        return [], 0
    start = min(s.started_at for s in run.steps)
    end = max([s.ended_at for s in run.steps] + [run.ended_at or 0])
    span = max(end - start, 1)
    groups = units(run.steps[lo:hi])
    rows = []
    for group in groups[:limit]:
        bars = [{"step": s.step, "stage": s.stage, "status": s.status, "kind": s.kind,
                 "left": round(100 * (s.started_at - start) / span, 3),
                 "width": round(max(100 * (s.ended_at - s.started_at) / span, 0.4), 3),
                 "ms": round((s.ended_at - s.started_at) / 1e6, 3)} for s in group]
        rows.append(TimelineRow(len(group) > 1 or group[0].kind == "fork-branch", bars))
    return rows, max(0, len(groups) - limit)
