"""The folded causal graph of a "why" answer: the value, the model calls that answered, the top sources.

Everything else on the trace is folded into the edges: an edge from one kept node to another
stands for a path through nodes that are not kept, and says how many it hides. What a node
was opened to show (`opened`: its direct successors on the trace) joins the kept nodes, so
a reader expands the picture node by node. Edges implied by others are dropped (a transitive
reduction), so a source reached through the answering call hangs under that call only,
never also under the value: a picture of the causes, not of every road to them.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

import networkx as nx

from .ranked import Why

__all__ = ["MOST", "TOP", "fold"]

TOP = 6  # sources drawn before anything is opened
MOST = 15  # nodes drawn before anything is opened, at most
_SEALED = ("memory", "run")


def _base(answer: Why, top: int, most: int) -> list[str]:
    """The value, the answering call, and the top sources with the model calls on their paths, at most `most`."""
    g = answer.trace.graph
    keep = [answer.trace.root] + ([answer.answering] if answer.answering else [])
    for cause in answer.causes[:top]:
        wanted = [n for n in cause.via[1:-1] if g.nodes[n].get("kind") == "model_call" and n not in keep]
        if len(keep) + len(wanted) + 1 > most:
            break
        keep += wanted + [cause.node]
    return list(dict.fromkeys(keep))


def _reach(g: nx.DiGraph, start: str, keep: set[str]) -> dict[str, tuple[str, int]]:
    """The kept nodes `start` reaches through nodes that are not kept: {node: (first edge's kind, hidden)}."""
    seen = {start: 0}
    first: dict[str, str] = {}
    out: dict[str, tuple[str, int]] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node != start and g.nodes[node].get("kind") in _SEALED:
            continue  # a memory's or a past run's own past is reached only by opening it
        for child in g.successors(node):
            if child in seen:
                continue
            seen[child] = seen[node] + 1
            first[child] = g.edges[node, child].get("kind", "") if node == start else first[node]
            if child in keep:
                out[child] = (first[child], seen[child] - 1)
            else:
                queue.append(child)
    return out


def fold(answer: Why, opened: Iterable[str] = (), *, top: int = TOP, most: int = MOST) -> nx.DiGraph:
    """The folded graph (nodes keep the trace's attributes, plus `rank` for a source, `hidden`: how many of
    its successors on the trace are not drawn); edges carry `kind` and `hidden` (nodes folded into them)."""
    g = answer.trace.graph
    if answer.trace.root is None or answer.trace.root not in g:
        return nx.DiGraph()
    keep = _base(answer, top, most)
    for node in opened:
        if node in g:
            keep += [node] + [c for c in g.successors(node)]
    keep = list(dict.fromkeys(keep))
    kept = set(keep)
    out = nx.DiGraph()
    ranks = {c.node: i for i, c in enumerate(answer.causes, start=1)}
    for node in keep:
        out.add_node(node, **g.nodes[node], rank=ranks.get(node),
                     hidden=sum(1 for c in g.successors(node) if c not in kept))
    for node in keep:
        for child, (kind, hidden) in _reach(g, node, kept).items():
            out.add_edge(node, child, kind=kind if hidden == 0 else "folded", hidden=hidden)
    if nx.is_directed_acyclic_graph(out):
        implied = set(out.edges) - set(nx.transitive_reduction(out).edges)
        out.remove_edges_from(implied)
    return out
