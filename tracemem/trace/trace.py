"""`Trace`: the causal graph of a value, as a networkx DiGraph, and how it reads.

Edges point from a value to what it depended on:
- data: a write ← the reads its own stage made *before* it ← the writes they saw
  (or the run input);
- compose: a partial write (append, item set, delete) ← the field's previous write;
- control: a step ← the decision that routed execution to it ← the decider's reads;
- source: beyond the scope (`sources`): a model call ← its prompt sections
  ← memories ← the run and step a memory was extracted in, and past runs loaded as
  snapshots — followed into those runs' own records.

`walk.backtrack` builds it; this module renders it: `explain()` for people,
`to_json()` and `to_mermaid()` for tools, and `influence()` (correlational).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

import networkx as nx

from ..record import Step
from ..text import clip

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Trace", "describe", "describe_decision"]

_EDGE_ORDER = {"source": 0, "provenance": 1, "subflow": 2, "data": 3, "compose": 4, "control": 5}
_SECTION_LABELS = {"memory": "[Memory]", "user": "[User]", "context": "[Context]", "directions": "[Directions]",
                   "instructions": "instructions", "base": "base rules", "memory_intro": "[Memory] intro",
                   "hook": "host hook"}


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

    def chains(self, only: Optional[str] = None, focus: Optional[str] = None, beyond: int = 3) -> set[str]:
        """The nodes on the chains from the value to nodes of kind `only` (or to node `focus`), and
        `beyond` levels of what lies behind those; empty when no node matches."""
        targets = {n for n, d in self.graph.nodes(data=True) if d.get("kind") == only or n == focus}
        keep = set(targets)
        for n in targets:
            keep |= nx.ancestors(self.graph, n)
            keep |= set(nx.single_source_shortest_path_length(self.graph, n, cutoff=beyond))
        return keep

    def narrowed(self, only: Optional[str] = None, focus: Optional[str] = None, beyond: int = 3) -> "Trace":
        """A copy holding only `chains(only, focus, beyond)` (what `explain(only=...)` shows)."""
        copy = Trace(self.run, self.path)
        copy.graph = self.graph.subgraph(self.chains(only, focus, beyond)).copy()
        copy.root = self.root if self.root in copy.graph else None
        copy.missing, copy.truncated = self.missing, self.truncated
        return copy

    # -- rendering ----------------------------------------------------------------
    def explain(self, max_lines: int = 60, only: Optional[str] = None, focus: Optional[str] = None,
                beyond: int = 3) -> str:
        """A short narrative, read top-down: the value, then what it came from.

        `only="memory"` (or "model_call", "run", "decision", …) keeps just the chains
        from the value to nodes of that kind; `focus=<node id>` to one node; either
        way followed by `beyond` levels of what lies behind them."""
        if self.missing == "pruned" and self.root is not None:
            return (f"{self.path}: came from an earlier turn of run {self.run_id}'s thread, which is gone: "
                    f"{describe(self.graph.nodes[self.root])}")
        if self.missing:
            return f"{self.path}: never written in run {self.run_id} (its value is the run input or the default)"
        lines: list[str] = []
        seen: set[str] = set()
        keep: Optional[set[str]] = None
        if only is not None or focus is not None:
            keep = self.chains(only, focus, beyond)
            if not keep:
                return f"{self.path}: no {only or focus} node on this trace (run {self.run_id})"

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
        (token overlap and embedding similarity; correlational, not causal) — the likeliest culprit first."""
        from ..memory import HashingEmbedder
        from ..memory.text import terms

        calls = [(d["step"], n, d) for n, d in self.graph.nodes(data=True)
                 if d.get("kind") == "model_call" and d.get("run_id") == self.run_id and d.get("response")]
        if not calls:
            return []
        _, call_node, call = max(calls, key=lambda c: c[0])
        embedder = embedder or HashingEmbedder()
        answer = call["response"]
        answer_terms = set(terms(answer))
        sections = [(n, self.graph.nodes[n]) for n in self.graph.successors(call_node)
                    if self.graph.nodes[n].get("kind") == "prompt_section"]
        if not sections or not answer_terms:
            return []
        vectors = embedder.embed([answer] + [d["text"] for _, d in sections])
        out = []
        for i, (node, d) in enumerate(sections):
            lexical = len(answer_terms & set(terms(d["text"]))) / len(answer_terms)
            cosine = float(vectors[0] @ vectors[i + 1])
            memory = next((m for m in self.graph.successors(node) if self.graph.nodes[m].get("kind") == "memory"),
                          None)
            out.append({"node": node, "section": d["section"], "line": d["line"], "text": d["text"],
                        "memory_id": self.graph.nodes[memory]["memory_id"] if memory else None,
                        "lexical": round(lexical, 4), "embedding": round(cosine, 4),
                        "score": round(0.5 * lexical + 0.5 * max(cosine, 0.0), 4),
                        "basis": "correlational: overlap with the answer, not a causal attribution"})
        out.sort(key=lambda r: (-r["score"], r["node"]))
        return out

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
            lines.append(f'    {ids[n]}["{clip(describe(d).replace(chr(34), chr(39)), 80)}"]')
        for a, b, d in self.graph.edges(data=True):
            style = "-.->" if d.get("kind") == "control" else "-->"
            lines.append(f"    {ids[b]} {style}|{d.get('kind')}| {ids[a]}")
        return "\n".join(lines)


def _value(text: Any, limit: int = 60) -> str:
    return clip(text if isinstance(text, str) else json.dumps(text, default=str), limit)


def describe_decision(stage: str, chosen: str, evidence: Any) -> str:
    """"<stage> chose '<branch>' because '<rule>'" — the rule that matched, when `decide()` recorded one."""
    rules = evidence.get("rules", []) if isinstance(evidence, dict) else []
    matched = [r["rule"] for r in rules if r.get("matched")]
    why = f" because '{matched[0]}'" if matched else ""
    return f"{stage} chose '{chosen}'{why}"


def describe(d: dict[str, Any]) -> str:
    """One line for a trace node, as `explain()` prints it."""
    kind = d.get("kind")
    if kind == "write":
        verb = {"set": "=", "append": "+=", "delete": "deleted"}.get(d["verb"], d["verb"])
        value = "" if d["verb"] == "delete" else " " + _value(json.loads(d["value"]) if d["value"] else None)
        return f"{d['path']} {verb}{value}  (run {d['run_id'][:8]} step {d['step']}, {d['stage']})"
    if kind == "input":
        value = d.get("value")
        shown = f" = {_value(value)}" if value not in (None, "", [], {}) else ""
        return f"{d['path']}{shown}: run input (run {d['run_id'][:8]})"
    if kind == "decision":
        return (f"decider {describe_decision(d['stage'], d['chosen'], d.get('evidence'))} "
                f"(run {d['run_id'][:8]} step {d['step']})")
    if kind == "step" and (d.get("source_ref") or d.get("extracted")):
        turn = f", turn {d['source_ref']}" if d.get("source_ref") else ""
        return f"extracted in run {d['run_id'][:8]}, step {d['step']} ({d['stage']}){turn}"
    if kind == "step":
        return f"step {d['step']} {d['stage']} (run {d['run_id'][:8]})"
    if kind == "model_call":
        if d.get("error"):
            return f"model call {d['model']} failed: {d['error']}"
        prompt = f" (prompt {d['prompt_id']})" if d.get("prompt_id") else ""
        return f"model call {d['model']} replied {_value(d.get('response') or '', 50)!r}{prompt}"
    if kind == "prompt_section":
        label = _SECTION_LABELS.get(d["section"], d["section"])
        line = f" line {d['line']}" if d["section"] == "memory" else ""
        return f"prompt {d['prompt_id']} section {label}{line}: {_value(d['text'], 60)}"
    if kind == "memory":
        if d.get("missing"):
            return f"memory {d['memory_id']} ({d['missing']})"
        flag = f", superseded by {d['superseded_by']}" if d.get("superseded_by") else ""
        return (f"memory {d['memory_id']} {_value(d['text'], 60)!r} (confidence {d['confidence']:g}, "
                f"{d['review_state']}{flag})")
    if kind == "run":
        if d.get("via") == "load_snapshot":
            gone = f"; {d['missing']}" if d.get("missing") else ""
            return (f"past run {d['run_id'][:8]} loaded as a snapshot (score {d['score']:.2f}, "
                    f"{d['projection']}{gone})")
        return f"run {d['run_id'][:8]}" + (f" ({d['missing']})" if d.get("missing") else "")
    return d.get("label") or f"{kind} {d}"
