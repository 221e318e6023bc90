"""`Trace`: the causal graph of a value, as a networkx DiGraph, and how it reads.

Edges point from a value to what it depended on:
- data: a write ← the reads its own stage made *before* it ← the writes they saw
  (or the run input);
- compose: a partial write (append, item set, delete) ← the field's previous write;
- control: a step ← the decision that routed execution to it ← the decider's reads;
- source: beyond the scope (`sources`): a human's answer to a pause; a model call ← its prompt sections
  ← memories ← the run and step a memory was extracted in, and past runs loaded as
  snapshots — followed into those runs' own records.

`walk.backtrack` builds it; this module renders it: `explain()` for people,
`to_json()` and `to_mermaid()` for tools, and `influence()` (correlational). Each node
reads as the one line `node_text.describe` gives it.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import networkx as nx

from ..errors import UsageError
from ..record import RunRecord, Step
from ..text import clip
from .node_text import describe


__all__ = ["KINDS", "Trace"]

KINDS = ("write", "input", "decision", "step", "model_call", "tool_call", "prompt_section", "memory", "run",
         "human_input")
_ARROWS = {"control": "⇐ ", "provenance": "↞ "}
_EDGE_ORDER = {"source": 0, "provenance": 1, "subflow": 2, "data": 3, "compose": 4, "control": 5}


class Trace:
    """The result of `run.backtrack(path)`."""

    def __init__(self, run: "RunRecord", path: str) -> None:
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
        """Nodes of one kind: 'memory', 'prompt_section', 'model_call', 'human_input', 'run', 'input',
        'decision', 'write'."""
        return [{"node": n, **d} for n, d in self.graph.nodes(data=True) if d.get("kind") == kind]

    def runs(self) -> list[str]:
        """Every run the trace reached (the traced run first)."""
        seen = [self.run_id]
        for _, d in self.graph.nodes(data=True):
            rid = d.get("run_id")
            if rid and rid not in seen:
                seen.append(rid)
        return seen

    def short_ids(self) -> dict[str, str]:
        """Each node's short id ("n0" is the value traced), as `explain()` prints it: stable for a trace."""
        return {n: f"n{i}" for i, n in enumerate(self.graph.nodes)}

    def node(self, ref: str) -> str:
        """The node a reference names: a node id, a short id as `explain()` prints it ("n7" or "[n7]"),
        or a memory id ("m_…")."""
        text = str(ref).strip()
        if text in self.graph:
            return text
        bare = text.strip("[]")
        if re.fullmatch(r"n\d+", bare) and int(bare[1:]) < self.graph.number_of_nodes():
            return list(self.graph.nodes)[int(bare[1:])]
        if f"m:{text}" in self.graph:
            return f"m:{text}"
        raise UsageError(f"no node {text!r} on the trace of {self.path} (run {self.run_id}); name one by its short "
                         f"id as the trace prints it (e.g. n3), a memory id (m_…) or a node id from the JSON form")

    def chains(self, only: Optional[str] = None, focus: Optional[str] = None, beyond: int = 3) -> set[str]:
        """The nodes on the chains from the value to nodes of kind `only` (or to node `focus`, any reference
        `node()` takes), and `beyond` levels of what lies behind those; empty when no node matches."""
        if only is not None and only not in KINDS:
            raise UsageError(f"{only!r} is not a kind of trace node; kinds: {', '.join(KINDS)}")
        target = self.node(focus) if focus is not None else None
        targets = {n for n, d in self.graph.nodes(data=True) if d.get("kind") == only or n == target}
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
                beyond: int = 3, depth: Optional[int] = None, hint: Optional[str] = None) -> str:
        """A short narrative, read top-down: the value, then what it came from. Each node is printed
        once; a node reached again is referred back to by its short id ("← see [n7]").

        `only="memory"` (or "model_call", "run", "decision", … see `KINDS`) keeps just the chains
        from the value to nodes of that kind; `focus=` (a short id, memory id or node id) to one node;
        either way followed by `beyond` levels of what lies behind them. `depth` stops `depth` levels
        below the value; `max_lines` caps the text, and `hint` is what the last line says to do about it."""
        if self.missing == "pruned" and self.root is not None:
            return (f"{self.path}: came from an earlier turn of run {self.run_id}'s thread, which is gone: "
                    f"{describe(self.graph.nodes[self.root])}")
        keep: Optional[set[str]] = None
        if only is not None or focus is not None:
            keep = self.chains(only, focus, beyond)  # checks `only` and `focus` first
        if self.missing:
            return f"{self.path}: never written in run {self.run_id} (its value is the run input or the default)"
        if keep is not None and not keep:
            return f"{self.path}: no {only or focus} node on this trace (run {self.run_id})"
        entries = self._outline(keep, depth)
        ids = self.short_ids()
        cited = {n for _, _, _, refs in entries for n in refs}
        if focus is not None:
            cited.add(self.node(focus))
        lines = []
        for level, arrow, node, refs in entries[:max_lines]:
            lead = "" if level == 0 else "  " * (level - 1) + arrow
            if node is None:
                lines.append(f"{lead}see {', '.join(f'[{ids[n]}]' for n in refs)}")
            else:
                tag = f"  [{ids[node]}]" if node in cited else ""
                lines.append(lead + describe(self.graph.nodes[node]) + tag)
        shown = {node for _, _, node, _ in entries[:max_lines] if node is not None}
        hidden = len(keep if keep is not None else self.graph) - len(shown)
        if hidden and len(entries) > max_lines:
            lines.append(f"… {hidden} more nodes not shown; {hint or 'raise max_lines, or narrow with only= or focus='}")
        elif hidden and depth is not None:
            lines.append(f"… {hidden} more nodes deeper than depth {depth}")
        if self.truncated:
            lines.append("… truncated: the walk stopped at its depth or node limit, so some sources are not on this trace")
        return "\n".join(lines)

    def _outline(self, keep: Optional[set[str]], depth: Optional[int]) -> list[tuple[int, str, Optional[str], list[str]]]:
        """The rendering order: (level, arrow, node, []) for a node shown for the first time, and
        (level, arrow, None, nodes) for the nodes a parent reaches again (one line per arrow)."""
        entries: list[tuple[int, str, Optional[str], list[str]]] = []
        seen: set[str] = set()
        edges = self.graph.edges

        def enter(node: str, level: int, arrow: str) -> Optional[list[Any]]:
            """Show `node` and return its frame: (level, its children still to visit, nodes reached again)."""
            seen.add(node)
            entries.append((level, arrow, node, []))
            if depth is not None and level >= depth:
                return None
            children = sorted((c for c in self.graph.successors(node) if keep is None or c in keep),
                              key=lambda c: _EDGE_ORDER.get(edges[node, c].get("kind"), 9))
            # what a step read is shown once: under the model call it was sent to, not again beside it
            fed = {g for c in children if self.graph.nodes[c].get("kind") == "model_call"
                   for g in self.graph.successors(c) if edges[c, g].get("kind") == "data"}
            shown = [c for c in children if not (c in fed and edges[node, c].get("kind") in ("data", "compose"))]
            return [node, level, iter(shown), {}]

        # depth first, as a recursive visit would go, on a stack of its own: a chain of 100,000 steps is no deeper
        # for it than one of ten (Python's recursion limit is about 1,000 frames)
        stack = [enter(self.root, 0, "")] if self.root is not None and (keep is None or self.root in keep) else []
        while stack:
            frame = stack[-1]
            if frame is None:
                stack.pop()
                continue
            node, level, children, again = frame
            for child in children:
                child_arrow = _ARROWS.get(edges[node, child].get("kind"), "← ")
                if child in seen:
                    again.setdefault(child_arrow, []).append(child)
                else:
                    stack.append(enter(child, level + 1, child_arrow))
                    break
            else:
                for child_arrow, nodes in again.items():
                    entries.append((level + 1, child_arrow, None, nodes))
                stack.pop()
        return entries

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

    def counterfactual(self, without: Any, *, flow: Any, model: Any = None, env: Any = None,
                       store: Any = None, live_effects: bool = False) -> Any:
        """Would the value change without `without` (a memory id, `run:ID` or `section:KIND:ID`)? Re-executes
        the run from where the source entered, as a recorded fork, replaying unchanged model calls and every
        side effect (never made twice unless `live_effects=True`); causal, unlike `influence()`. See
        `tracemem.trace.counterfactual`."""
        from .counterfactual import counterfactual

        return counterfactual(self.run, self.path, without, flow=flow, model=model, env=env, store=store,
                              live_effects=live_effects)

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

