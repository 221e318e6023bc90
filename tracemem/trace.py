"""Backtracking: the causal graph of a value, as a networkx DiGraph.

Edges point from a value to what it depended on:
- data: a write ← the reads its own stage made *before* it ← the writes they saw
  (or the run input);
- compose: a partial write (append, item set, delete) ← the field's previous write;
- control: a step ← the decision that routed execution to it ← the decider's reads;
- source: beyond the scope (`tracemem.sources`): a model call ← its prompt sections
  ← memories ← the run and step a memory was extracted in, and past runs loaded as
  snapshots — followed into those runs' own records.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Optional

import networkx as nx

from .paths import parse_path
from .record import Step
from .walk import Walker

if TYPE_CHECKING:
    from .run import Run

DESCRIBERS: list[Callable[[dict[str, Any]], Optional[str]]] = []  # render extension node kinds
_EDGE_ORDER = {"source": 0, "provenance": 1, "subflow": 2, "data": 3, "compose": 4, "control": 5}


class Trace:
    """The result of `run.backtrack(path)`."""

    def __init__(self, run: "Run", path: str) -> None:
        self.run = run
        self.run_id = run.run_id
        self.path = path
        self.graph = nx.DiGraph(target=path, run_id=run.run_id)
        self.root: Optional[str] = None
        self.missing: Optional[str] = None
        self.truncated = False

    @property
    def steps(self) -> list[Step]:
        """The contributing steps of the traced run, in run order."""
        ids = sorted({d["step"] for _, d in self.graph.nodes(data=True)
                      if d.get("run_id") == self.run_id and d.get("step") is not None})
        by_number = {s.step: s for s in self.run.steps}
        return [by_number[i] for i in ids if i in by_number]

    def sources(self, kind: str) -> list[dict[str, Any]]:
        """Nodes of one kind: 'memory', 'prompt_section', 'model_call', 'run', 'input', 'decision', 'write'."""
        return [{"node": n, **d} for n, d in self.graph.nodes(data=True) if d.get("kind") == kind]

    def runs(self) -> list[str]:
        """Every run the trace reached (the traced run first)."""
        seen = [self.run_id]
        for _, d in self.graph.nodes(data=True):
            rid = d.get("run_id")
            if rid and rid not in seen:
                seen.append(rid)
        return seen

    # -- rendering ----------------------------------------------------------------
    def explain(self, max_lines: int = 60, only: Optional[str] = None, focus: Optional[str] = None,
                beyond: int = 3) -> str:
        """A short narrative, read top-down: the value, then what it came from.

        `only="memory"` (or "model_call", "run", "decision", …) keeps just the chains
        from the value to nodes of that kind; `focus=<node id>` to one node; either
        way followed by `beyond` levels of what lies behind them."""
        if self.missing:
            return f"{self.path}: never written in run {self.run_id} (its value is the run input or the default)"
        lines: list[str] = []
        seen: set[str] = set()
        keep: Optional[set[str]] = None
        if only is not None or focus is not None:
            targets = {n for n, d in self.graph.nodes(data=True) if d.get("kind") == only or n == focus}
            if not targets:
                return f"{self.path}: no {only or focus} node on this trace (run {self.run_id})"
            keep = set(targets)
            for n in targets:
                keep |= nx.ancestors(self.graph, n)
                keep |= set(nx.single_source_shortest_path_length(self.graph, n, cutoff=beyond))

        def visit(node: str, depth: int, via: Optional[str]) -> None:
            if keep is not None and node not in keep:
                return
            if len(lines) >= max_lines:
                return
            arrow = "" if depth == 0 else "  " * (depth - 1) + {"control": "⇐ ", "provenance": "↞ "}.get(via or "", "← ")
            if node in seen:
                lines.append(f"{arrow}{describe(self.graph.nodes[node])} (see above)")
                return
            seen.add(node)
            lines.append(arrow + describe(self.graph.nodes[node]))
            children = sorted(self.graph.successors(node),
                              key=lambda c: _EDGE_ORDER.get(self.graph.edges[node, c].get("kind"), 9))
            for child in children:
                visit(child, depth + 1, self.graph.edges[node, child].get("kind"))

        if self.root is not None:
            visit(self.root, 0, None)
        if self.truncated:
            lines.append("… truncated (raise max_depth / max_nodes to see more)")
        elif len(lines) >= max_lines:
            lines.append(f"… ({self.graph.number_of_nodes()} nodes in all; see trace.to_json())")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()

    def influence(self, embedder: Any = None) -> list[dict[str, Any]]:
        """Prompt sections of the final model call ranked by how much of the answer they support
        (lexical + embedding overlap; correlational, not causal) — the likeliest culprit first."""
        from .sources import influence

        return influence(self, embedder)

    def to_json(self) -> dict[str, Any]:
        """The trace as a JSON-able dict of nodes and edges."""
        return {
            "run_id": self.run_id, "path": self.path, "root": self.root, "missing": self.missing,
            "truncated": self.truncated,
            "nodes": [{"id": n, **d} for n, d in self.graph.nodes(data=True)],
            "edges": [{"from": a, "to": b, **d} for a, b, d in self.graph.edges(data=True)],
        }

    def to_mermaid(self) -> str:
        """The trace as a Mermaid flowchart (dependencies point up to what they produced)."""
        ids = {n: f"t{i}" for i, n in enumerate(self.graph.nodes)}
        lines = ["flowchart BT"]
        for n, d in self.graph.nodes(data=True):
            label = describe(d).replace('"', "'")
            if len(label) > 80:
                label = label[:77] + "..."
            lines.append(f'    {ids[n]}["{label}"]')
        for a, b, d in self.graph.edges(data=True):
            style = "-.->" if d.get("kind") == "control" else "-->"
            lines.append(f"    {ids[b]} {style}|{d.get('kind')}| {ids[a]}")
        return "\n".join(lines)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(d: dict[str, Any]) -> str:
    """One line for a trace node, as `explain()` prints it."""
    for describer in DESCRIBERS:
        text = describer(d)
        if text is not None:
            return text
    kind = d.get("kind")
    if kind == "write":
        verb = {"set": "=", "append": "+=", "delete": "deleted"}.get(d["verb"], d["verb"])
        value = "" if d["verb"] == "delete" else " " + _short(json.loads(d["value"]) if d["value"] else None)
        return f"{d['path']} {verb}{value}  (run {d['run_id'][:8]} step {d['step']}, {d['stage']})"
    if kind == "input":
        value = d.get("value")
        shown = f" = {_short(value)}" if value not in (None, "", [], {}) else ""
        return f"{d['path']}{shown}: run input (run {d['run_id'][:8]})"
    if kind == "decision":
        matched = [r["rule"] for r in d.get("evidence", {}).get("rules", []) if r.get("matched")] \
            if isinstance(d.get("evidence"), dict) else []
        why = f" because '{matched[0]}'" if matched else ""
        return f"decider {d['stage']} chose '{d['chosen']}'{why} (run {d['run_id'][:8]} step {d['step']})"
    if kind == "step":
        return f"step {d['step']} {d['stage']} (run {d['run_id'][:8]})"
    return d.get("label") or f"{kind} {d}"


def backtrack(run: "Run", path: str, *, max_depth: int = 64, max_nodes: int = 2000,
              cross_runs: bool = True) -> Trace:
    """Build the Trace of the last write of `path` in `run` (see the module docstring)."""
    trace = Trace(run, path)
    walker = Walker(trace, max_depth, max_nodes, cross_runs)
    idx = walker.indexes[run.run_id]
    wanted = parse_path(path)
    if len(wanted) >= 2 and isinstance(wanted[1], int):  # a list element: the write that produced it
        try:
            owner, produced = walker.element_write(idx, str(wanted[0]), wanted[1])
        except LookupError:
            pass  # not a list, or out of range: fall back to the field's last write
        else:
            if produced is None:
                trace.missing = "never-written"
                trace.root = walker.input_node(owner, path, 0)
                return trace
            trace.root = walker.element_root = owner.node_write(produced)
            walker.write_node(owner, produced, 0)
            walker.walk()
            return trace
    target = idx.last_write(path)
    if target is None:
        trace.missing = "never-written"
        trace.root = walker.input_node(idx, path, 0)
        return trace
    trace.root = walker.write_node(idx, target, 0)
    walker.walk()
    return trace
