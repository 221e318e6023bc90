"""A `Trace` (from `run.backtrack(path)`) drawn: each node a box that links to what it stands for.

Writes, inputs, decisions and model calls link to their step on the run page; a prompt section
to its line in the prompt; a memory to its memory page; the step a memory was extracted in to
that step and turn. Nodes recorded in another run than the traced one carry the `other-run`
class (drawn dashed and tinted) and name their run.
"""
from __future__ import annotations

import json
from collections import deque
from typing import Any, Callable

import networkx as nx

from ..text import clip
from ..trace import Trace, Why, describe
from ..trace.fold import fold
from .graphs import Edge, Node, layout, svg
from .run_view import SECTION_LABELS

__all__ = ["MAX_DRAWN", "folded_svg", "memory_sources", "trace_svg"]

MAX_DRAWN = 300


def depths(graph: nx.DiGraph, root: Any) -> dict[str, int]:
    """Shortest distance from the value to every node (breadth-first, in the walker's order)."""
    seen = {root: 0}
    queue = deque([root])
    while queue:
        node = queue.popleft()
        for child in graph.successors(node):
            if child not in seen:
                seen[child] = seen[node] + 1
                queue.append(child)
    return seen


def columns(graph: nx.DiGraph, depth: dict[str, int]) -> dict[str, int]:
    """Each node's row: its longest distance from the value, so every arrow points down (sources end up
    lowest); the breadth-first depth if the graph has a cycle."""
    if not nx.is_directed_acyclic_graph(graph):
        return {n: depth.get(n, 0) for n in graph}
    out: dict[str, int] = {}
    for n in nx.topological_sort(graph):
        out[n] = max((out[p] + 1 for p in graph.predecessors(n)), default=0)
    return out


def _box(nid: str, d: dict[str, Any], traced: str, url: Callable[[str, str], str]) -> tuple[str, str, str]:
    """(title, subtitle, href) of one node."""
    kind = d.get("kind")
    run = d.get("run_id") or ""
    where = f"step {d.get('step')}"
    if kind == "write":
        verb = {"set": "=", "append": "+=", "delete": "deleted"}.get(d["verb"], d["verb"])
        value = "" if d["verb"] == "delete" or d.get("value") is None else clip(json.loads(d["value"]), 40)
        return f"{d['path']} {verb} {value}", f"{where} {d.get('stage')}", url(run, f"#w-{d['step']}-{d['seq']}")
    if kind == "input":
        return f"{d['path']}: run input", clip(d.get("value"), 40), url(run, "#input")
    if kind == "decision":
        return f"{d['stage']} chose '{d['chosen']}'", f"{where} (decider)", url(run, f"#step-{d['step']}")
    if kind == "step":
        turn = f" · turn {d['source_ref']}" if d.get("source_ref") else ""
        title = f"extracted by {d['stage']}" if d.get("source_ref") or d.get("extracted") else f"step {d['stage']}"
        return title, f"{where}{turn}", url(run, f"#step-{d['step']}")
    if kind == "model_call":
        reply = f"failed: {d['error']}" if d.get("error") else f"→ {d.get('response') or ''}"
        return f"model {d.get('model')}", clip(reply, 40), url(run, f"#step-{d['step']}")
    if kind == "prompt_section":
        label = SECTION_LABELS.get(d["section"], d["section"])
        line = f" line {d['line']}" if d["section"] == "memory" else ""
        return f"{label}{line}", clip(d.get("text"), 40), url(run, f"#ps-{d['prompt_id']}-{d['position']}")
    if kind == "memory":
        state = d.get("missing") or f"{d.get('review_state')}, confidence {d.get('confidence', 0):g}"
        return f"memory {d['memory_id']}", clip(d.get("text") or state, 40), f"/memories/{d['memory_id']}"
    if kind == "tool_call":
        said = f"failed: {d['error']}" if d.get("error") else f"→ {d.get('result') or ''}"
        return f"tool {d['name']}({d.get('arguments_text') or ''})", clip(said, 40), url(run, f"#step-{d['step']}")
    if kind == "human_input":
        who = f" by {d['by']}" if d.get("by") else ""
        return f"human input{who}", clip(d.get("answer"), 40), url(run, f"#step-{d['step']}")
    if kind == "run":
        via = "past run (snapshot)" if d.get("via") == "load_snapshot" else "run"
        return f"{via} {run[:8]}", d.get("missing") or d.get("projection") or "", url(run, "")
    return str(kind), nid, None  # type: ignore[return-value]


def _marks(nid: str, d: dict[str, Any], trace: Trace, sub: str) -> tuple[str, str]:
    """A node's subtitle (naming its run when it is another than the traced one) and CSS classes."""
    other = bool(d.get("run_id")) and d.get("run_id") != trace.run_id
    if other:
        sub = f"run {d['run_id'][:8]} · {sub}"
    flagged = d.get("kind") == "memory" and d.get("review_state") in ("stale", "contradicted")
    classes = f"k-{d.get('kind')}" + (" other-run" if other else "") + (" flagged" if flagged else "") + \
        (" root" if nid == trace.root else "")
    return sub, classes


def folded_svg(answer: Why, opened: list[str], url: Callable[[str, str], str],
               expand: Callable[[list[str]], str]) -> tuple[str, int]:
    """The folded graph of a "why" answer (`tracemem.trace.fold`) as SVG, and how many nodes it draws. A
    source's box says its rank; a memory's, where it was learned; a box with more behind it has a "+" whose
    link (`expand(opened + [node])`) draws that too."""
    g = fold(answer, opened)
    root = answer.trace.root
    if root is None or root not in g:
        return "", 0
    row = columns(g, depths(g, root))
    nodes = []
    for nid, d in g.nodes(data=True):
        title, sub, href = _box(nid, d, answer.run_id, url)
        if d.get("rank"):
            title = f"#{d['rank']} {title}"
        if d.get("kind") == "memory" and d.get("text"):
            turn = f" turn {d['source_ref']}" if d.get("source_ref") else ""
            title = f"#{d['rank']} {d['text']}" if d.get("rank") else d["text"]
            sub = f"memory · learned in {d['source_run_id'][:8]}{turn}" if d.get("source_run_id") else "memory"
        sub, classes = _marks(nid, d, answer.trace, sub)
        classes += " cause" if d.get("rank") else ""
        more = expand(list(opened) + [nid]) if d.get("hidden") else None
        nodes.append(Node(nid, row[nid], title, sub, classes, href, describe(d), expand=more))
    edges = [Edge(a, b, e.get("kind", "")) for a, b, e in g.edges(data=True)]  # dotted: bookkeeping folded
    drawing = svg(layout(nodes, edges, vertical=True), css_class="graph trace-graph why-graph",
                  label=f"why {answer.path}: its sources, the bookkeeping between them folded")
    return drawing, len(nodes)


def trace_svg(trace: Trace, url: Callable[[str, str], str], cap: int = MAX_DRAWN) -> tuple[str, int]:
    """The trace as SVG (at most `cap` nodes, nearest the value first), and how many were left out.
    `url(run_id, anchor)` gives the link to a run page."""
    g = trace.graph
    if trace.root is None or trace.root not in g:
        return "", 0
    depth = depths(g, trace.root)
    drawn = sorted(depth, key=lambda n: depth[n])[:cap]
    keep = set(drawn)
    row = columns(g.subgraph(drawn), depth)
    nodes = []
    for nid in drawn:
        d = g.nodes[nid]
        title, sub, href = _box(nid, d, trace.run_id, url)
        sub, classes = _marks(nid, d, trace, sub)
        nodes.append(Node(nid, row[nid], title, sub, classes, href, describe(d)))
    edges = [Edge(a, b, e.get("kind", "")) for a, b, e in g.edges(data=True) if a in keep and b in keep]
    return svg(layout(nodes, edges, vertical=True), css_class="graph trace-graph", label=f"backtrack of {trace.path}"), \
        g.number_of_nodes() - len(drawn)


def memory_sources(trace: Trace) -> list[dict[str, Any]]:
    """The memories on the trace, each with the run, step and turn it was learned in."""
    out = []
    for m in trace.sources("memory"):
        out.append({"memory_id": m["memory_id"], "text": m.get("text"), "review_state": m.get("review_state"),
                    "confidence": m.get("confidence"), "missing": m.get("missing"),
                    "source_run_id": m.get("source_run_id"), "source_step": m.get("source_step"),
                    "source_ref": m.get("source_ref"), "subject": m.get("subject")})
    return out
