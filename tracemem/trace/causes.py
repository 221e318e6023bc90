"""The sources a traced value rests on, found on its `Trace`: what a "why" answer is made of.

A trace holds every node the walk reached: the sources (memories, tool results, human
inputs, run inputs, past runs loaded as snapshots, prompt sections, earlier turns of the
thread) and the bookkeeping between them (message-list appends, the tool loop's deciders,
pending-call lists, copies of a value). Here the trace is read from the value outwards,
breadth first, to find each source once, with its shortest path from the value; what lies
behind a memory (its provenance) or a past run belongs to that source and is not searched
for more. The first model call met is the answering call: a source it read without another
model call in between is `direct` (in the answering call's own request).
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import networkx as nx

from ..text import clip
from .node_text import describe
from .trace import Trace

__all__ = ["Cause", "Found", "find_causes", "landmarks", "path_to"]

_SEALED = ("memory", "run")  # sources whose own past is theirs: not searched for more sources
_BOOKKEEPING_SECTIONS = ("memory", "recall")  # a memory line is the memory; recall's intro and notes carry nothing
_LANDMARKS = ("model_call", "tool_call", "human_input", "prompt_section")


@dataclass
class Cause:
    """One source of a value: what it is, how it reached the value, and (once ranked or verified) its standing."""

    kind: str  # memory, tool, human_input, input, snapshot, prompt, turn
    node: str  # its node on the trace
    label: str  # one line saying what it is
    text: str  # its content, as the answering model call could have read it
    via: list[str]  # the shortest path from the value to it (node ids, the value first)
    direct: bool  # in the answering model call's own request
    learned: Optional[dict[str, Any]] = None  # a memory: run, step, turn and the user's words it came from
    cut: dict[str, Any] = field(default_factory=dict)  # what to leave out of a request to go without it
    score: float = 0.0  # the record's ranking (lexical overlap and how directly it reached the value)
    lexical: float = 0.0
    decisive: Optional[bool] = None  # verified: did the answer change without it (None: not verified)
    change: Optional[float] = None  # verified: how much the answer changed, 0 (same) to 1 (nothing in common)
    changed_to: Optional[str] = None  # verified: the reply without it
    check_run_id: Optional[str] = None  # verified: the recorded run that asked the model without it
    note: Optional[str] = None  # why it could not be verified


@dataclass
class Found:
    """What `find_causes` read off a trace."""

    answering: Optional[str]  # the answering model call's node (None: no model call on the trace)
    causes: list[Cause]
    parents: dict[str, Optional[str]]  # breadth-first parent of each node in front of the sources


def _front(g: nx.DiGraph, root: str) -> tuple[dict[str, Optional[str]], list[str]]:
    """Breadth-first from the value, not through a memory's or a past run's own past: parents and order."""
    parents: dict[str, Optional[str]] = {root: None}
    order = [root]
    queue = deque([root])
    while queue:
        node = queue.popleft()
        if g.nodes[node].get("kind") in _SEALED and node != root:
            continue
        for child in g.successors(node):
            if child not in parents:
                parents[child] = node
                order.append(child)
                queue.append(child)
    return parents, order


def _direct(g: nx.DiGraph, answering: Optional[str], parents: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
    """What the answering call read without another model call in between, each with its breadth-first
    parent from the call (so a direct source's path goes through the call)."""
    if answering is None:
        return dict(parents)
    seen: dict[str, Optional[str]] = {answering: None}
    queue = deque([answering])
    while queue:
        node = queue.popleft()
        d = g.nodes[node]
        if node != answering and (d.get("kind") == "model_call" or d.get("kind") in _SEALED):
            continue
        for child in g.successors(node):
            if child not in seen and child in parents:
                seen[child] = node
                queue.append(child)
    return seen


def path_to(parents: dict[str, Optional[str]], node: str) -> list[str]:
    """The value first, `node` last."""
    out: list[str] = []
    at: Optional[str] = node
    while at is not None:
        out.append(at)
        at = parents[at]
    return out[::-1]


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _learned(g: nx.DiGraph, node: str) -> Optional[dict[str, Any]]:
    """Where a memory was learned: its run, step and turn, and the user's words the extraction read."""
    d = g.nodes[node]
    if not d.get("source_run_id"):
        return None
    words = ""
    for step in g.successors(node):
        for src in g.successors(step):
            sd = g.nodes[src]
            if sd.get("kind") == "input" and isinstance(sd.get("value"), str) and len(sd["value"]) > len(words):
                words = sd["value"]
    return {"run_id": d["source_run_id"], "step": d.get("source_step"), "turn": d.get("source_ref"), "words": words}


def _memory(g: nx.DiGraph, node: str) -> Cause:
    d = g.nodes[node]
    text = d.get("text") or ""
    state = d.get("missing") or ("forgotten" if d.get("forgotten") else d.get("review_state"))
    flag = f" ({state})" if state not in ("fresh", None) else ""
    label = f"memory {d['memory_id']} {clip(text, 60)!r}{flag}"
    return Cause("memory", node, label, text, [], False, learned=_learned(g, node),
                 cut={"memory_id": d["memory_id"], "state": state})


def _tool(d: dict[str, Any], node: str) -> Cause:
    result = d.get("error") or d.get("result") or ""
    said = f"failed: {clip(d['error'], 50)}" if d.get("error") else f"returned {clip(result, 50)!r}"
    label = f"tool {d['name']}({clip(d.get('arguments_text') or '', 40)}) {said} (step {d['step']})"
    return Cause("tool", node, label, _text(result), [], False, cut={"tool_call_id": d.get("call_id")})


def _single(g: nx.DiGraph, node: str, run_id: str) -> Optional[Cause]:
    """The cause one node stands for on its own (None: bookkeeping, or part of an earlier turn)."""
    d = g.nodes[node]
    kind = d.get("kind")
    if kind == "memory":
        return _memory(g, node)
    if kind == "tool_call":
        return _tool(d, node)
    if kind == "human_input":
        who = f" by {d['by']}" if d.get("by") else ""
        return Cause("human_input", node, f"human input{who}: {clip(_text(d.get('answer')), 60)} (step {d['step']})",
                     _text(d.get("answer")), [], False)
    if kind == "run" and d.get("via") == "load_snapshot":
        return Cause("snapshot", node, describe(d), _text(d.get("query")), [], False)
    if kind == "input" and d.get("run_id") == run_id and d.get("value") not in (None, "", [], {}):
        return Cause("input", node, f"run input {d['path']} = {clip(_text(d['value']), 60)!r}",
                     _text(d["value"]), [], False, cut={"text": _text(d["value"])})
    if kind == "prompt_section" and d.get("run_id") == run_id and d.get("source_kind") not in _BOOKKEEPING_SECTIONS:
        label = f"prompt section [{d['section']}] {clip(d.get('text') or '', 60)!r}"
        return Cause("prompt", node, label, d.get("text") or "", [], False, cut={"text": d.get("text") or ""})
    return None


def _turns(g: nx.DiGraph, order: list[str], run_id: str) -> list[Cause]:
    """One cause per earlier run of the thread whose writes or inputs reached the value (not behind a memory)."""
    by_run: dict[str, list[str]] = {}
    for node in order:
        d = g.nodes[node]
        other = d.get("run_id")
        if other and other != run_id and d.get("kind") in ("input", "write"):
            by_run.setdefault(other, []).append(node)
    out = []
    for other, nodes in by_run.items():
        texts, words = [], ""
        for n in nodes:
            value = g.nodes[n].get("value")
            if g.nodes[n].get("kind") == "write":
                value = json.loads(value) if value else None
                value = value.get("content") if isinstance(value, dict) and "content" in value else value
            if isinstance(value, str) and value.strip():
                texts.append(value)
                if g.nodes[n].get("kind") == "input" and len(value) > len(words):
                    words = value
        if not texts:
            continue
        said = words or texts[0]
        out.append(Cause("turn", nodes[0], f"earlier turn (run {other[:8]}): {clip(said, 60)!r}",
                         "\n".join(dict.fromkeys(texts)), [], False, cut={"texts": list(dict.fromkeys(texts))}))
    return out


def find_causes(trace: Trace) -> Found:
    """The sources on `trace`, each with its shortest path from the value (unranked, in the order met)."""
    g, root = trace.graph, trace.root
    if root is None or root not in g:
        return Found(None, [], {})
    parents, order = _front(g, root)
    answering = next((n for n in order if g.nodes[n].get("kind") == "model_call"
                      and g.nodes[n].get("run_id") == trace.run_id), None)
    direct = _direct(g, answering, parents)
    causes: list[Cause] = []
    for node in order[1:]:
        cause = _single(g, node, trace.run_id)
        if cause is not None:
            causes.append(cause)
    causes += _turns(g, order, trace.run_id)
    lead = path_to(parents, answering) if answering is not None else []
    for cause in causes:
        cause.direct = cause.node in direct
        cause.via = lead + path_to(direct, cause.node)[1:] if cause.direct and lead else path_to(parents, cause.node)
    return Found(answering, causes, parents)


def landmarks(g: nx.DiGraph, via: list[str]) -> list[str]:
    """The nodes worth naming on a path (model calls, tool calls, human inputs, prompt sections): the rest is
    bookkeeping, folded."""
    return [n for n in via[1:-1] if g.nodes[n].get("kind") in _LANDMARKS]
